"""A driver from NVIDIA's .run installer, as the driver stage plans around it: refused by
default (nothing planned, the message names nvidia-uninstall), uninstalled first with
runfile_driver: uninstall. The box's answer to gpubox.infra.runfile's fact is the real command's
output on a tree the sandbox's stand-in planted (gpubox.sandbox.runfile_standin)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import REFERENCE, fake_host, fresh_box

from gpubox.base.errors import DeployRefused
from gpubox.infra import runfile
from gpubox.sandbox import runfile_standin
from gpubox.stages import driver as driver_stage

FACT_KEY = "/var/lib/nvidia/log"  # a part of the fact's command (the fake connector's key)


# What preflight plans before it judges the host (dpkg_ready's apt setting); the refusal raises
# while the deploy is still being planned, so not even that runs.
PREFLIGHT_ONLY = ["apt-get waits up to 900 s for dpkg's lock"]


def planned(fake) -> list[str]:
    return [
        name.split(" | ")[-1]
        for h in fake.state.get_op_order()
        for name in fake.state.op_meta[h].names
    ]


def runfile_answer(tmp_path: Path, **plant_args: object) -> list[str]:
    """RunfileDriver's output on a box holding a planted runfile install (paths as the box
    sees them)."""
    root = tmp_path / "root"
    root.mkdir()
    runfile_standin.plant(root, **plant_args)  # type: ignore[arg-type]
    out = subprocess.run(
        ["sh", "-c", runfile.command_for(str(root))], capture_output=True, text=True, check=True
    ).stdout
    return out.replace(str(root), "").splitlines()


def test_the_fact_key_reaches_the_runfile_fact_first():
    # fresh_box's answers are matched as substrings, first match wins: none of the keys before
    # the runfile's may be part of its command, and its key must be.
    keys = [k for k in fresh_box("ubuntu2404") if isinstance(k, str)]
    assert FACT_KEY in keys
    assert [k for k in keys[: keys.index(FACT_KEY)] if k in runfile.RUNFILE_COMMAND] == []
    assert FACT_KEY in runfile.RUNFILE_COMMAND


def test_a_clean_box_plans_no_uninstall(plan_of):
    plan = plan_of(
        driver_stage.driver, {**REFERENCE, "runfile_driver": "uninstall"}, fresh_box("ubuntu2404")
    )
    assert not [n for n in plan.names if "nvidia-uninstall" in n]
    assert not [c for c in plan.commands if "nvidia-uninstall" in c]


@pytest.mark.parametrize("os_name", ["ubuntu2404", "debian12"])
def test_a_runfile_driver_is_refused_naming_nvidia_uninstall_and_nothing_is_planned(
    tmp_path, os_name
):
    answers = fresh_box(os_name, **{FACT_KEY: runfile_answer(tmp_path)})
    with fake_host(REFERENCE, answers) as fake:
        with pytest.raises(DeployRefused) as refused:
            driver_stage.driver()
        assert planned(fake) == PREFLIGHT_ONLY
    message = str(refused.value)
    assert "preflight failed, nothing was changed" in message
    assert "runfile_driver: a driver 580.95.05 installed by NVIDIA's .run installer" in message
    assert "/usr/bin/nvidia-uninstall" in message
    assert "'sudo nvidia-uninstall' then reboot" in message
    assert 'set "runfile_driver": "uninstall"' in message


@pytest.mark.parametrize("os_name", ["ubuntu2404", "debian12"])
def test_runfile_driver_uninstall_runs_nvidia_uninstall_before_anything_else(
    tmp_path, plan_of, os_name
):
    answers = fresh_box(os_name, **{FACT_KEY: runfile_answer(tmp_path)})
    plan = plan_of(driver_stage.driver, {**REFERENCE, "runfile_driver": "uninstall"}, answers)
    # preflight's own setting first, then the uninstall before anything else of the stage
    assert [n.split(" | ")[-1] for n in plan.names[: len(PREFLIGHT_ONLY)]] == PREFLIGHT_ONLY
    first_name, first_commands = plan.ops[len(PREFLIGHT_ONLY)]
    assert "Uninstall the driver 580.95.05 of NVIDIA's .run installer" in first_name
    assert first_commands == [runfile.UNINSTALL_COMMAND]
    assert first_commands[0].startswith("/usr/bin/nvidia-uninstall --silent;")
    # the rest of the stage follows: the driver packages are installed after it
    assert [n for n in plan.names[len(PREFLIGHT_ONLY) + 1 :] if "Install NVIDIA driver" in n]
    assert len([c for c in plan.commands if "nvidia-uninstall" in c]) == 1


def test_leftovers_without_the_uninstaller_are_refused_even_with_uninstall(tmp_path):
    lines = [line for line in runfile_answer(tmp_path) if not line.startswith(("U ", "I ", "B "))]
    answers = fresh_box("ubuntu2404", **{FACT_KEY: lines})
    with fake_host({**REFERENCE, "runfile_driver": "uninstall"}, answers) as fake:
        with pytest.raises(DeployRefused) as refused:
            driver_stage.driver()
        assert planned(fake) == PREFLIGHT_ONLY
    assert "/usr/bin/nvidia-uninstall is gone" in str(refused.value)
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05" in str(refused.value)
