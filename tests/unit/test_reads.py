"""gpubox.knowledge.reads: a read of the host that the deploy's pyinfra facts
(gpubox.infra.host_facts) and the
checks (gpubox.checks.facts) both make is one command and one parser, the same in both; and the
reads' own parsers on real outputs (tests/fixtures, sources in tests/fixtures/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import REFERENCE

from gpubox import parsers
from gpubox.checks.core import FACTS, Fact
from gpubox.config import load_host_config, target_for
from gpubox.infra import host_facts
from gpubox.knowledge import reads

FIXTURES = Path(__file__).parents[1] / "fixtures"
CONFIG = load_host_config("box", {**REFERENCE, "docker_users": ["alice", "bob"]})
TARGET = target_for({"ID": "debian", "VERSION_ID": "12"}, CONFIG.catalog)

# (pyinfra fact, its arguments, the checks' fact of the same read, the read)
SHARED: list[tuple[type[Any], dict[str, Any], str, reads.Read[Any]]] = [
    (host_facts.OsRelease, {}, "os_release", reads.OS_RELEASE),
    (host_facts.NvidiaPciDevices, {}, "lspci", reads.NVIDIA_PCI),
    (host_facts.SecureBoot, {}, "sb_state", reads.SECURE_BOOT),
    (host_facts.MokKey, {"family": "debian"}, "mok", reads.MOK_STATE),
    (host_facts.UserGroups, {"users": ("alice", "bob")}, "docker_users", reads.USER_GROUPS),
    (host_facts.HeldPackages, {}, "holds", reads.HELD_PACKAGES),
    (host_facts.LoadedDriver, {}, "module_version", reads.LOADED_DRIVER),
    (host_facts.KernelModuleLoaded, {"module": "nouveau"}, "nouveau", reads.MODULE_LOADED),
]


@pytest.mark.parametrize(("cls", "kwargs", "name", "read"), SHARED, ids=[s[2] for s in SHARED])
def test_the_deploy_and_the_checks_read_the_host_the_same_way(
    cls: type[Any], kwargs: dict[str, Any], name: str, read: reads.Read[Any]
):
    fact, check_fact = cls(), FACTS[name]
    assert fact.read is read
    assert fact.command(**kwargs) == check_fact.command_for(CONFIG, TARGET)
    assert check_fact.parse is read.parse


def test_the_kernels_fact_is_the_read_the_deploy_makes():
    assert FACTS["kernels"].command_for(CONFIG, TARGET) == host_facts.KernelModules().command()
    text = "R 6.1.0-28-amd64\nK 6.1.0-28-amd64\nDKMS\n"
    assert FACTS["kernels"].parse(text) == host_facts.KernelModules().process(text.splitlines())


def test_a_read_the_pyinfra_fact_processes_as_the_checks_parse_it():
    text = "0000:05:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [10de:1db5] (rev a1)"
    assert host_facts.NvidiaPciDevices().process([text]) == FACTS["lspci"].parse(text)
    assert host_facts.KernelModuleLoaded().process(["yes"]) is True
    assert FACTS["nouveau"].parse("no\n") is False


def test_the_loaded_driver_from_sysfs_or_nvidia_smi():
    read = parsers.parse_loaded_driver
    assert read("570.211.01\n") == "570.211.01"  # /sys/module/nvidia/version
    assert read("570.211.01\n570.211.01\n") == "570.211.01"  # nvidia-smi, one line per GPU
    assert read("") is None  # neither: no module, no nvidia-smi
    no_driver = (FIXTURES / "nvidia-smi/error_no-driver_gcp-pr18.txt").read_text()
    assert read(no_driver) is None
    mismatch = FIXTURES / "nvidia-smi/error_version-mismatch_570.124_tinygrad-issue47.txt"
    assert read(mismatch.read_text()) == "mismatch"
    assert read("sh: 1: nvidia-smi: not found\n") is None


def test_the_loaded_driver_read_falls_back_to_nvidia_smi_only_without_sysfs():
    command = reads.LOADED_DRIVER.command_for()
    sysfs, smi = command.split(" || ", 1)
    assert sysfs == "cat /sys/module/nvidia/version 2>/dev/null"
    assert smi.startswith("nvidia-smi --query-gpu=driver_version --format=csv,noheader")


def test_a_yes_or_no_answer():
    assert parsers.parse_yes("yes\n") is True
    assert parsers.parse_yes("no\n") is False
    assert parsers.parse_yes("") is False
    assert reads.MODULE_LOADED.command_for("nouveau") == (
        "test -d /sys/module/nouveau && echo yes || echo no"
    )


def test_a_read_of_the_checks_not_made_for_this_host_is_none():
    fact = Fact.of("x", reads.MOK_STATE, lambda c, t: (t.family,) if t else None)
    assert fact.command_for(CONFIG, None) is None
    assert fact.command_for(CONFIG, TARGET) == reads.MOK_STATE.command_for("debian")


def test_the_gpus_query_is_one_read_for_the_checks_and_the_driver_stage():
    # the driver stage sets persistence back from this read's rows (tests/ops/test_driver_plan)
    assert FACTS["smi_query"].command_for(CONFIG, TARGET) == reads.GPU_QUERY.command_for()
    text = (
        "0, Tesla V100-SXM2-32GB, GPU-1, 00000000:06:00.0, 570.211.01, Disabled, 0, 32768, 35, "
        "41.20, 300.00"
    )
    rows = reads.GPU_QUERY.parse(text)
    assert rows == FACTS["smi_query"].parse(text)
    assert rows[0]["persistence_mode"] == "Disabled" and rows[0]["memory.total"] == "32768"
