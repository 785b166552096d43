"""A re-deploy repairs what the host checks catch (issue 8 item H), on the sandbox box: each
fault is planted on the converged box, the matching host check fails, a re-deploy puts the
file back, the check passes. Faults: nvcc and the CUDA runtime library deleted (apt still
counts their packages installed), the model file truncated (verified once, so it used to be
skipped), llama-server deleted, gpu-burn's binary deleted (their build markers still match),
nvidia-smi deleted (the file behind Debian's `nvidia` alternative). The tests run in order on
one box."""

from __future__ import annotations

import pytest
from conftest import box_sh

from gpubox import demo, inventory
from gpubox.config import HostConfig, load_host_config
from gpubox.stages import llamacpp_build
from gpubox.stages import model as model_stage
from gpubox.stages import tools as tools_stage

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_box")]

LLAMA = "gpubox-llama-server"


def config() -> HostConfig:
    ((name, data),) = inventory.load(str(demo.ROOT / demo.INVENTORY))
    return load_host_config(name, data)


def failing(*keywords: str) -> dict[str, str]:
    """The host checks selected by ``keywords`` (-k, joined by "or") that fail now."""
    run = demo.checks(extra=("-k", " or ".join(keywords)))
    assert run.passed + run.failed > 0, run.output[-2000:]
    return run.failures


def redeploy() -> demo.DeployRun:
    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    return run


def test_the_box_converges():
    # on the box test_doctor.py left converged (conftest.SHARED_BOX), or a fresh one when this
    # module runs alone
    redeploy()
    demo.load_check_image()  # the GPU containers' image, imported (never from a registry)
    checks = demo.checks()
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]


def test_deleted_nvcc_and_cuda_runtime_are_reinstalled():
    prefix = config().cuda["prefix"]
    runtime = box_sh(f"readlink -f {prefix}/lib64/libcudart.so.12").strip()
    assert runtime.startswith(prefix + "/targets/"), runtime
    box_sh(f"rm {prefix}/bin/nvcc {runtime} && ldconfig")
    failed = failing("cuda.nvcc", "cuda.ldconfig")
    assert "no nvcc on a login shell's PATH" in failed["cuda.nvcc"]
    assert "has no libcudart" in failed["cuda.ldconfig"]

    run = redeploy()
    assert [n for n in run.changed_names if "Reinstall CUDA 12.8 packages missing a file" in n]
    assert [n for n in run.changed_names if n.endswith("ldconfig")], run.changed_names
    assert failing("cuda.nvcc", "cuda.ldconfig") == {}


def test_a_deleted_nvidia_smi_is_reinstalled():
    real = box_sh("readlink -f /usr/bin/nvidia-smi").strip()
    owner = box_sh(f"dpkg -S {real}").split(":")[0]
    box_sh(f"rm {real}")
    failed = failing("gpu.listed")
    assert "nvidia-smi not found" in failed["gpu.listed"]

    run = redeploy()
    assert [n for n in run.changed_names if "Reinstall driver packages missing a file" in n]
    assert box_sh(f"dpkg -S {real}").split(":")[0] == owner
    assert failing("gpu.listed", "persistence") == {}


def test_persistence_switched_off_by_hand_is_switched_back_on():
    box_sh("nvidia-smi -pm 0")
    failed = failing("gpu.persistence")
    assert "persistence mode is not Enabled" in failed["gpu.persistence"]

    run = redeploy()
    assert [n for n in run.changed_names if "persistence mode back on" in n], run.changed_names
    assert failing("gpu.persistence") == {}


def test_a_truncated_model_is_downloaded_again_and_served():
    p = model_stage.plan(config())
    size = int(box_sh(f"stat -c %s {p.path}"))
    box_sh(f"truncate -s {size // 2} {p.path}")
    failed = failing("model.")
    assert f"{p.file} has sha256" in failed["model.checksum"]

    run = redeploy()
    assert [n for n in run.changed_names if f"Download and verify {p.file}" in n]
    assert int(box_sh(f"stat -c %s {p.path}")) == size
    assert failing("model.", "backend.") == {}


def test_a_deleted_llama_server_is_rebuilt_and_started():
    b = llamacpp_build.llama_build(config())
    # lost while running: the next start (a reboot, a crash) finds nothing to run
    box_sh(f"rm {b.binary} && systemctl restart {LLAMA} || true")
    failed = failing("backend.service", "backend.health")
    assert "backend.service" in failed
    assert "backend.health" in failed
    assert box_sh(f"cat {b.directory}/{llamacpp_build.BUILD_INFO}").strip() == b.info

    run = redeploy()
    assert [n for n in run.changed_names if f"Build llama-server {b.tag}" in n]
    assert [n for n in run.changed_names if "(Re)start llama-server" in n]
    assert failing("backend.") == {}


def test_a_deleted_gpu_burn_is_rebuilt():
    build = tools_stage.gpu_burn_build(config())
    box_sh(f"rm {build.directory}/gpu_burn")
    failed = failing("tools.gpu-burn")
    assert "tools.gpu-burn" in failed
    assert box_sh(f"cat {build.directory}/{tools_stage.STAMP}").strip() == build.stamp

    run = redeploy()
    assert [n for n in run.changed_names if "Build gpu-burn" in n]
    assert failing("tools.gpu-burn") == {}


def test_after_the_repairs_a_deploy_changes_nothing_and_every_check_passes():
    run = demo.deploy()
    assert run.no_change, f"changed: {run.changed_names}\n{run.output[-2000:]}"
    checks = demo.checks()
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]
