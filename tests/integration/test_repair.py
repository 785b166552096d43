"""A re-deploy repairs what the host checks catch (issue 8 item H), on the sandbox box: each
fault is planted on the converged box, the matching host check fails, a re-deploy puts the
file back, the check passes. Faults: nvcc and the CUDA runtime library deleted (apt still
counts their packages installed), the model file truncated (verified once, so it used to be
skipped), llama-server deleted, gpu-burn's binary deleted (their build markers still match),
nvidia-smi deleted (the file behind Debian's `nvidia` alternative). The tests run in order on
one box."""

from __future__ import annotations

import json
import subprocess
import sys

import panel_record
import pytest
from conftest import box_sh

from gpubox.base import layout
from gpubox.commands import demo
from gpubox.config import HostConfig, load_host_config
from gpubox.plans import llamacpp as plan_llamacpp
from gpubox.plans import model as plan_model
from gpubox.remote import inventory
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
    p = plan_model.plan(config())
    size = int(box_sh(f"stat -c %s {p.path}"))
    box_sh(f"truncate -s {size // 2} {p.path}")
    failed = failing("model.")
    assert f"{p.file} has sha256" in failed["model.checksum"]

    run = redeploy()
    assert [n for n in run.changed_names if f"Download and verify {p.file}" in n]
    assert int(box_sh(f"stat -c %s {p.path}")) == size
    assert failing("model.", "backend.") == {}


def test_a_deleted_llama_server_is_rebuilt_and_started():
    b = plan_llamacpp.llama_build(config())
    # lost while running: the next start (a reboot, a crash) finds nothing to run
    box_sh(f"rm {b.binary} && systemctl restart {LLAMA} || true")
    failed = failing("backend.service", "backend.health")
    assert "backend.service" in failed
    assert "backend.health" in failed
    assert box_sh(f"cat {b.directory}/{plan_llamacpp.BUILD_INFO}").strip() == b.info

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


# The optional server panel (1Panel v2, docs/panel.md) on the converged box: deploy/panel.py
# alone, with panel: "1panel" set through a derived inventory (the sandbox's stand-in release
# package through catalog_overrides, inventories/sandbox.py). The panel is left installed and
# running: the sandbox inventory's panel is "none", so the final deploy below leaves it alone
# and its checks do not apply.

PANEL_INSTALL_SH_MARK = "/var/lib/gpubox-standin/1panel-install-sh-ran"


@pytest.fixture(scope="module")
def panel_inventory(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("panel") / "sandbox_panel.py"
    path.write_text(
        "import runpy\n"
        f"hosts = runpy.run_path({str(demo.ROOT / demo.INVENTORY)!r})['hosts']\n"
        "hosts = [(name, {**data, 'panel': '1panel'}) for name, data in hosts]\n"
    )
    return str(path)


def panel_checks(inventory_file: str) -> demo.CheckRun:
    run = demo.checks(inventory=inventory_file, extra=("-k", "panel"))
    assert run.passed + run.failed == 4, run.output[-2000:]
    return run


def gpubox_doctor(inventory_file: str) -> str:
    argv = demo.in_netns([sys.executable, "-m", "gpubox.doctor", inventory_file])
    proc = subprocess.run(argv, cwd=demo.ROOT, text=True, capture_output=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_the_panel_installs_without_its_installer_on_gpuboxs_docker(panel_inventory):
    daemon_before = box_sh(f"cat {layout.DAEMON_JSON}")
    run = demo.deploy("deploy/panel.py", inventory=panel_inventory)
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    assert [n for n in run.changed_names if "Mask the password in 1pctl" in n], run.changed_names
    checks = panel_checks(panel_inventory)
    assert checks.failed == 0, checks.failures
    password = box_sh(f"cat {layout.PANEL_PASSWORD}").strip()
    assert box_sh(f"stat -c '%U %a' {layout.PANEL_PASSWORD} {layout.PANEL_ENTRANCE}").split("\n")[
        :2
    ] == ["root 600", "root 600"]
    problems = panel_record.check(
        lambda script: box_sh("bash -s", stdin=script),
        base_dir="/opt",
        version=demo.box_info()["panel_version"],
        password=password,
    )
    assert not problems, "\n".join(problems)
    assert password not in run.output
    # 1Panel's install.sh never ran (the stand-in's marks a run), Docker is gpubox's own
    assert box_sh(f"test -e {PANEL_INSTALL_SH_MARK} && echo ran || echo never").strip() == "never"
    assert box_sh(f"cat {layout.DAEMON_JSON}") == daemon_before
    assert "nvidia" in json.loads(daemon_before)["runtimes"]
    assert box_sh("docker info --format '{{.ServerVersion}}'").strip()
    # the verified tarball is kept for a re-run, the unpacked package is not
    cached = box_sh(f"ls {layout.PANEL_CACHE}").split()
    assert cached == [f"1panel-{demo.box_info()['panel_version']}-linux-amd64.tar.gz"], cached


def test_a_panel_redeploy_changes_nothing(panel_inventory):
    run = demo.deploy("deploy/panel.py", inventory=panel_inventory)
    assert run.no_change, f"changed: {run.changed_names}\n{run.output[-2000:]}"


def test_a_stopped_panel_is_named_by_the_checks_and_doctor_and_started_again(panel_inventory):
    box_sh(f"systemctl stop {layout.PANEL_CORE}")
    failed = panel_checks(panel_inventory).failures
    assert "1panel-core is inactive and enabled" in failed["panel.services"], failed
    text = gpubox_doctor(panel_inventory)
    assert "Panel     1Panel v2.3.2, core inactive/enabled" in text, text
    assert "[panel.services] " in text and "1panel-core is inactive" in text
    run = demo.deploy("deploy/panel.py", inventory=panel_inventory)
    assert run.rc == 0 and [n for n in run.changed_names if "1panel-core running" in n]
    assert [n for n in run.changed_names if "(1panel-core started)" in n], run.changed_names
    assert panel_checks(panel_inventory).failed == 0


def test_after_the_repairs_a_deploy_changes_nothing_and_every_check_passes():
    run = demo.deploy()
    assert run.no_change, f"changed: {run.changed_names}\n{run.output[-2000:]}"
    checks = demo.checks()
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]
