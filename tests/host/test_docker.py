"""Docker with the NVIDIA runtime, proven by running containers that see the GPUs."""

from __future__ import annotations

import json

import pytest

from gpubox import parsers

DAEMON_JSON = "/etc/docker/daemon.json"


def container_gpus(box, run_args: str) -> list:
    image = box.config.docker_check_image
    result = box.run(f"docker run --rm {run_args} {image} nvidia-smi -L")
    assert result.rc == 0, (
        f"{box.name}: `docker run {run_args} {image} nvidia-smi -L` failed ({result.rc}): "
        f"{(result.stderr or result.stdout)[-500:]}"
    )
    return parsers.parse_smi_list(result.stdout)


@pytest.mark.quick
def test_docker_is_active_and_enabled(box):
    box.assert_service_up("docker")


@pytest.mark.quick
def test_docker_lists_the_nvidia_runtime(box):
    runtimes = json.loads(box.out("docker info --format '{{json .Runtimes}}'"))
    assert "nvidia" in runtimes, f"{box.name}: docker runtimes are {sorted(runtimes)}"
    if box.config.docker_default_runtime_nvidia:
        default = box.out("docker info --format '{{.DefaultRuntime}}'").strip()
        assert default == "nvidia", f"{box.name}: the default runtime is {default}"


@pytest.mark.quick
def test_daemon_json_is_valid_and_holds_gpubox_settings(box):
    text = box.out(f"cat {DAEMON_JSON}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        pytest.fail(f"{box.name}: {DAEMON_JSON} is not valid JSON: {exc}")
    assert data.get("runtimes", {}).get("nvidia", {}).get("path") == "nvidia-container-runtime", (
        f"{box.name}: {DAEMON_JSON} has no nvidia runtime: {data.get('runtimes')}"
    )
    for key, value in box.config.docker_daemon_options.items():
        assert data.get(key) == value, f"{box.name}: {DAEMON_JSON} {key} is {data.get(key)!r}"
    if box.config.docker_registry_mirrors:
        assert data.get("registry-mirrors") == box.config.docker_registry_mirrors


@pytest.mark.quick
def test_container_toolkit_packages_pinned_and_held(box):
    toolkit = box.config.catalog["container_toolkit"]
    box.assert_pinned_and_held("container toolkit", toolkit["packages"], toolkit["version"])


@pytest.mark.gpu
def test_a_container_with_gpus_all_sees_every_gpu(box):
    gpus = container_gpus(box, "--gpus all")
    assert len(gpus) == box.config.gpu_count, (
        f"{box.name}: a --gpus all container sees {len(gpus)} GPU(s), "
        f"expected {box.config.gpu_count}"
    )


@pytest.mark.gpu
def test_the_cdi_spec_names_every_gpu(box):
    spec = box.config.catalog["container_toolkit"]["cdi_spec"]
    listed = box.out("nvidia-ctk cdi list 2>&1")
    names = {
        line.strip() for line in listed.splitlines() if line.strip().startswith("nvidia.com/gpu=")
    }
    indexes = {n for n in names if n.split("=", 1)[1].isdigit()}
    assert len(indexes) == box.config.gpu_count and "nvidia.com/gpu=all" in names, (
        f"{box.name}: the CDI spec ({spec}) names {sorted(names)}"
    )


@pytest.mark.gpu
def test_a_cdi_container_sees_every_gpu(box):
    version = box.out("docker version --format '{{.Server.Version}}'").strip()
    major = int(version.split(".")[0]) if version[:1].isdigit() else 0
    if major < 25:
        pytest.skip(f"Docker {version} has no CDI device support (Docker 25 or newer)")
    gpus = container_gpus(box, "--device nvidia.com/gpu=all")
    assert len(gpus) == box.config.gpu_count, (
        f"{box.name}: a CDI container sees {len(gpus)} GPU(s), expected {box.config.gpu_count}"
    )


@pytest.mark.gpu
def test_a_running_container_keeps_its_gpus_across_daemon_reload(box):
    """NVIDIA/nvidia-container-toolkit issue 48: containers lost their GPUs after
    `systemctl daemon-reload` with the systemd cgroup driver."""
    name = "gpubox-check-daemon-reload"
    box.run(f"docker rm -f {name}")
    started = box.run(
        f"docker run -d --name {name} --gpus all {box.config.docker_check_image} sleep 120"
    )
    assert started.rc == 0, f"{box.name}: could not start a GPU container: {started.stderr}"
    try:
        before = parsers.parse_smi_list(box.out(f"docker exec {name} nvidia-smi -L"))
        box.out("systemctl daemon-reload")
        after = box.run(f"docker exec {name} nvidia-smi -L")
        seen = parsers.parse_smi_list(after.stdout) if after.rc == 0 else []
        assert len(before) == len(seen) == box.config.gpu_count, (
            f"{box.name}: the container saw {len(before)} GPU(s), then {len(seen)} after "
            f"systemctl daemon-reload ({after.stderr.strip()[-200:]})"
        )
    finally:
        box.run(f"docker rm -f {name}")
