"""Plans of the docker, container toolkit, DCGM and tools stages on Ubuntu 24.04 and
Debian 12, and the burn-in verdict."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REFERENCE, fresh_box
from pyinfra.api.exceptions import OperationError

from gpubox.base.rendering import render
from gpubox.config import load_host_config, target_for
from gpubox.infra.operations import merge_json
from gpubox.knowledge import exporter_label
from gpubox.stages import burnin as burnin_stage
from gpubox.stages import container_toolkit as toolkit_stage
from gpubox.stages import dcgm as dcgm_stage
from gpubox.stages import docker as docker_stage
from gpubox.stages import tools as tools_stage

NO_DOCKER = {"echo binary=$(command -v dockerd": ["binary=", "active=inactive", "package="]}


def daemon_json(data: object) -> dict[object, object]:
    text = data if isinstance(data, str) else json.dumps(data)
    return {"if [ -e /etc/docker/daemon.json ]": ["exists", *text.splitlines()]}


def test_docker_from_dockers_repository_on_ubuntu(plan_of):
    plan = plan_of(docker_stage.docker, REFERENCE, fresh_box("ubuntu2404", **NO_DOCKER))
    assert "https://download.docker.com/linux/ubuntu/gpg" in plan.op("Docker key")[0]
    assert "9DC858229FC7DD38854AE2D88D81803C0EBFCD88" in plan.op("Docker key")[0]
    assert sorted(plan.installs()) == sorted(
        [
            "docker-ce=5:28.5.1-1~ubuntu.24.04~noble",
            "docker-ce-cli=5:28.5.1-1~ubuntu.24.04~noble",
            "containerd.io=1.7.28-2~ubuntu.24.04~noble",
            "docker-buildx-plugin=0.29.1-1~ubuntu.24.04~noble",
            "docker-compose-plugin=2.40.3-1~ubuntu.24.04~noble",
        ]
    )
    from gpubox.rules.apt_sources import source_line

    config = load_host_config("b", REFERENCE)
    target = target_for({"ID": "ubuntu", "VERSION_ID": "24.04"}, config.catalog)
    assert source_line(config, "docker", target) == (
        "deb [signed-by=/usr/share/keyrings/gpubox-docker.gpg] "
        "https://download.docker.com/linux/ubuntu noble stable\n"
    )


def test_docker_on_debian_and_from_the_distribution(plan_of):
    plan = plan_of(docker_stage.docker, REFERENCE, fresh_box("debian12", **NO_DOCKER))
    assert "docker-ce=5:28.5.1-1~debian.12~bookworm" in plan.installs()
    distro = plan_of(
        docker_stage.docker,
        {**REFERENCE, "docker_source": "distro"},
        fresh_box("debian12", **NO_DOCKER),
    )
    assert distro.installs() == ["docker.io"]
    assert not [n for n in distro.names if "Docker key" in n]


def test_a_running_docker_of_another_origin_is_kept(plan_of):
    panel = {
        "echo binary=$(command -v dockerd": ["binary=/usr/bin/dockerd", "active=active", "package="]
    }
    plan = plan_of(docker_stage.docker, REFERENCE, fresh_box("ubuntu2404", **panel))
    assert plan.installs() == []
    replace = plan_of(
        docker_stage.docker,
        {**REFERENCE, "docker_keep_existing": False},
        fresh_box("ubuntu2404", **panel),
    )
    assert "docker-ce=5:28.5.1-1~ubuntu.24.04~noble" in replace.installs()


def test_daemon_options_merge_keeps_foreign_keys(plan_of):
    data = {**REFERENCE, "docker_registry_mirrors": ["https://mirror.example.org"]}
    answers = fresh_box("ubuntu2404", **NO_DOCKER, **daemon_json({"log-driver": "journald"}))
    plan = plan_of(docker_stage.docker, data, answers)
    assert plan.op("daemon.json: registry-mirrors")  # an upload
    (reload,) = [n for n in plan.names if "Docker (daemon.json changed)" in n]
    assert reload.startswith("Docker | Reload") and reload in plan.conditional


def test_merge_json_semantics():
    current = {"log-driver": "journald", "runtimes": {"crun": {"path": "crun"}}}
    merged = merge_json(
        current, {"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}, overwrite=False
    )
    assert merged["log-driver"] == "journald" and set(merged["runtimes"]) == {"crun", "nvidia"}
    kept = merge_json(
        {"runtimes": {"nvidia": {"path": "/opt/custom"}}},
        {"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}},
        overwrite=False,
    )
    assert kept["runtimes"]["nvidia"]["path"] == "/opt/custom"  # only when it lacks one


def test_container_toolkit_plan(plan_of):
    plan = plan_of(toolkit_stage.container_toolkit, REFERENCE, fresh_box("ubuntu2404"))
    assert sorted(plan.installs()) == sorted(
        f"{n}=1.17.8-1"
        for n in (
            "nvidia-container-toolkit",
            "nvidia-container-toolkit-base",
            "libnvidia-container-tools",
            "libnvidia-container1",
        )
    )
    key = plan.op("NVIDIA container toolkit key")[0]
    assert "https://nvidia.github.io/libnvidia-container/gpgkey" in key
    assert "C95B321B61E88C1809C4F759DDCAE044F796ECB0" in key
    assert plan.op("daemon.json: the nvidia runtime")  # daemon.json absent: written
    assert plan.op("CDI spec") == [
        "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
        "mkdir -p /var/lib/gpubox && "
        "printf '%s\\n' 570.211.01 > /var/lib/gpubox/cdi-driver-version",
    ]


def shell_words(command: str) -> list[str]:
    """The words and operators of a POSIX shell command (quotes removed, operators apart)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def test_toolkit_quotes_every_value_it_puts_in_a_command(plan_of, monkeypatch):
    version = "570.211.01;touch /tmp/x `id` $(id) && echo 'q' \"d\" | >"
    spec = "/etc/cdi/my spec;$(id)'.yaml"
    data = {
        **REFERENCE,
        "driver_version": version,
        "catalog_overrides": {"container_toolkit.cdi_spec": spec},
    }
    # The preflight refuses a driver version the repository does not offer; the stage's own
    # quoting must hold should such a value ever get past it, so the stage runs without it.
    ubuntu = {"ID": "ubuntu", "VERSION_ID": "24.04"}
    monkeypatch.setattr(
        toolkit_stage.preflight, "run", lambda config: target_for(ubuntu, config.catalog)
    )
    plan = plan_of(toolkit_stage.container_toolkit, data, fresh_box("ubuntu2404"))
    generate, stamp = plan.op("CDI spec")
    assert shell_words(generate) == ["nvidia-ctk", "cdi", "generate", f"--output={spec}"]
    assert version in shell_words(stamp)  # one word: nothing of it reaches the shell as code
    assert shell_words(stamp) == [
        "mkdir", "-p", "/var/lib/gpubox", "&&",
        "printf", "%s\\n", version, ">", "/var/lib/gpubox/cdi-driver-version",
    ]  # fmt: skip


def test_toolkit_leaves_a_daemon_json_that_has_the_runtime(plan_of):
    answers = fresh_box(
        "ubuntu2404",
        **daemon_json(
            {
                "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
                "data-root": "/srv/docker",
            }
        ),
    )
    plan = plan_of(toolkit_stage.container_toolkit, REFERENCE, answers)
    assert plan.op("daemon.json: the nvidia runtime") == []


def test_an_invalid_daemon_json_is_an_error_never_replaced(plan_of):
    answers = fresh_box("ubuntu2404", **daemon_json('{"runtimes": {'))
    with pytest.raises(OperationError, match="daemon.json is not valid JSON .* will not replace"):
        plan_of(toolkit_stage.container_toolkit, REFERENCE, answers)


def test_cdi_spec_is_regenerated_only_for_a_new_driver(plan_of):
    same = plan_of(
        toolkit_stage.container_toolkit,
        REFERENCE,
        fresh_box("ubuntu2404", **{"cat /var/lib/gpubox/cdi-driver-version": "570.211.01"}),
    )
    assert not [n for n in same.names if "CDI spec" in n]


def test_dcgm_plan(plan_of):
    plan = plan_of(dcgm_stage.dcgm, REFERENCE, fresh_box("ubuntu2404"))
    assert sorted(plan.installs()) == sorted(
        f"datacenter-gpu-manager-4-{p}=1:4.4.1-1"
        for p in ("core", "cuda12", "proprietary", "proprietary-cuda12")
    )
    assert plan.op("legacy DCGM") == []  # none installed
    legacy = plan_of(
        dcgm_stage.dcgm,
        REFERENCE,
        fresh_box(
            "ubuntu2404", **{"dpkg -l": ["ii  datacenter-gpu-manager  1:3.3.9  amd64  legacy"]}
        ),
    )
    (remove,) = legacy.op("legacy DCGM")
    assert remove.endswith(" remove datacenter-gpu-manager")
    dropin = render("nvidia-dcgm.conf.j2", address="127.0.0.1")
    assert "--bind-interface 127.0.0.1" in dropin
    assert not [n for n in plan.names if "exporter" in n]


def test_dcgm_exporter_never_pulls_at_start(plan_of):
    data = {**REFERENCE, "dcgm_exporter": True, "dcgm_exporter_port": 9500}
    plan = plan_of(dcgm_stage.dcgm, data, fresh_box("ubuntu2404"))
    assert plan.op("Pull nvcr.io/nvidia/k8s/dcgm-exporter") == [
        "docker pull nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04"
    ]
    unit = dcgm_stage.exporter_unit(load_host_config("b", data))
    assert "--pull never" in unit


def exec_start(unit: str) -> list[str]:
    (line,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def exporter_run(unit: str, hostname: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """What the unit's ExecStart runs on a host named ``hostname``: systemd's quoting (as shlex
    reads it) and its $$ (a literal $), then /bin/sh with a ``hostname`` that prints the name
    and, in /usr/bin/docker's place, a docker that prints its arguments as JSON."""
    argv = exec_start(unit)
    assert argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3, argv
    (line,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    assert not re.search(r"(?<!\$)\$(?!\$)", line.replace("$$", "")), "a $ systemd would expand"
    script = argv[2].replace("$$", "$")
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "hostname").write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(hostname)}\n")
    (bin_dir / "docker").write_text(
        f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n"
    )
    for tool in ("hostname", "docker"):
        (bin_dir / tool).chmod(0o755)
    assert script.count("/usr/bin/docker ") == 1
    script = script.replace("/usr/bin/docker ", f"{bin_dir / 'docker'} ")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)


def test_dcgm_exporter_reads_the_hosts_engine_named_by_the_hosts_name(tmp_path):
    data = {**REFERENCE, "dcgm_exporter": True, "dcgm_exporter_port": 9500}
    config = load_host_config("b", data)
    unit = dcgm_stage.exporter_unit(config)
    ran = exporter_run(unit, "gpu-07", tmp_path)
    assert ran.returncode == 0, ran.stderr
    argv = json.loads(ran.stdout)
    image = config.catalog["dcgm"]["exporter_image"]
    docker, exporter = argv[: argv.index(image)], argv[argv.index(image) + 1 :]
    # The engine the dcgm stage binds to loopback: reachable only on the host's network.
    assert "--bind-interface 127.0.0.1" in render("nvidia-dcgm.conf.j2", address="127.0.0.1")
    assert docker[:2] == ["run", "--rm"]
    assert "--network" in docker and docker[docker.index("--network") + 1] == "host"
    assert "-p" not in docker and "--cap-add" not in docker  # no mapping; no embedded engine
    # gpubox's counters file (issue 31 A), mounted read-only where -f names it
    assert exporter[:2] == ["-f", "/etc/dcgm-exporter/gpubox-counters.csv"]
    assert docker[docker.index("--volume") + 1] == (
        "/etc/gpubox/dcgm-counters.csv:/etc/dcgm-exporter/gpubox-counters.csv:ro"
    )
    exporter = exporter[2:]
    assert exporter == [
        "--address", "127.0.0.1:9500", "--remote-hostengine-info", "gpu-07:5555",
    ]  # fmt: skip
    # The label the pinned exporter computes from that: the box's name, not 127.0.0.1 ...
    assert exporter_label.exporter_hostname(exporter[3], node_name="ignored") == "gpu-07"
    # ... and inside the container that name is the engine's address, the port the engine's.
    host, port = exporter_label.split_host_port(exporter[3])
    added = docker[docker.index("--add-host") + 1]
    assert added == f"{host}:{dcgm_stage.HOSTENGINE_ADDRESS}"
    assert int(port) == dcgm_stage.HOSTENGINE_PORT
    every = load_host_config("b", {**data, "dcgm_exporter_address": "::"})
    ran = exporter_run(dcgm_stage.exporter_unit(every), "gpu-07", tmp_path)
    assert json.loads(ran.stdout)[-3] == "[::]:9500"


def test_dcgm_exporter_does_not_start_without_a_hostname(tmp_path):
    unit = dcgm_stage.exporter_unit(load_host_config("b", {**REFERENCE, "dcgm_exporter": True}))
    ran = exporter_run(unit, "", tmp_path)
    assert ran.returncode != 0 and ran.stdout == ""  # docker never ran


def test_gpu_burn_is_built_for_volta_with_cuda_12_8(plan_of):
    plan = plan_of(tools_stage.tools, REFERENCE, fresh_box("ubuntu2404"))
    (build,) = plan.op("Build gpu-burn")
    assert (
        "make -C /opt/gpu-burn/3ead140434da9473582b68452f7115967a7a0581.new COMPUTE=70 "
        "CUDAPATH=/usr/local/cuda-12.8" in build
    )
    assert "6289465838d73ba3cdb1cbdf1e81b76a87898b6e7e1f056c60a6efdcaae83356" in build
    assert (
        "https://github.com/wilicc/gpu-burn/archive/3ead140434da9473582b68452f7115967a7a0581"
        ".tar.gz" in build
    )
    assert plan.op("Check that nvtop pulls no other driver")
    assert "nvtop" in plan.installs()
    assert plan.op("Enable Ubuntu's multiverse")  # Ubuntu keeps nvtop in multiverse


def test_gpu_burn_is_not_rebuilt_when_the_build_matches(plan_of):
    stamp = (
        "commit=3ead140434da9473582b68452f7115967a7a0581 compute=70 cudapath=/usr/local/cuda-12.8"
    )
    plan = plan_of(
        tools_stage.tools,
        REFERENCE,
        fresh_box(
            "debian12",
            **{"cat /opt/gpu-burn/3ead140434da9473582b68452f7115967a7a0581/.gpubox-build": stamp},
        ),
    )
    assert not [n for n in plan.names if "Build gpu-burn" in n]
    other = plan_of(
        tools_stage.tools,
        {**REFERENCE, "gpu_burn_compute": 75},
        fresh_box(
            "debian12",
            **{"cat /opt/gpu-burn/3ead140434da9473582b68452f7115967a7a0581/.gpubox-build": stamp},
        ),
    )
    assert "COMPUTE=75" in other.op("Build gpu-burn")[0]


def burn(tested, gpus, extra=()):
    return SimpleNamespace(tested=tested, gpus=gpus, problems=lambda n: list(extra))


def diag(passed, tests=()):
    return SimpleNamespace(passed=passed, tests=list(tests))


def test_burnin_verdict():
    assert burnin_stage.judge(2, burn(2, {0: "OK", 1: "OK"}), 0, diag(True)) == []
    faulty = burnin_stage.judge(2, burn(2, {0: "OK", 1: "FAULTY"}), 0, diag(True))
    assert faulty == ["GPU 1: gpu-burn says FAULTY"]
    missing = burnin_stage.judge(2, burn(1, {0: "OK"}), 0, diag(True))
    assert "gpu-burn tested 1 GPU(s), expected 2" in missing
    assert "GPU 1: gpu-burn says nothing" in missing
    failed_diag = burnin_stage.judge(
        2,
        burn(2, {0: "OK", 1: "OK"}),
        0,
        diag(
            False,
            [
                SimpleNamespace(
                    name="Memory", results={0: "Pass", 1: "Fail"}, messages=["ECC error"]
                )
            ],
        ),
    )
    assert failed_diag == ["GPU 1: dcgmi diag test 'Memory' Fail: ECC error"]
    died = burnin_stage.judge(
        2, burn(2, {0: "OK", 1: "OK"}, ["a gpu-burn worker died"]), 0, diag(True)
    )
    assert died == ["a gpu-burn worker died"]
    assert burnin_stage.judge(2, None, 2, None)[0] == (
        "gpu-burn failed (exit status 2) before reporting any GPU"
    )
