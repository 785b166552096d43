"""gpubox doctor: gather, evaluate and render on facts from real outputs: the sandbox's
stand-in nvidia-smi, lspci and dcgmi (held byte for byte to real captures by
test_standin.py) under the planted faults, and captured os-release and nvcc outputs. The
driver's dpkg/apt-mark/apt-cache outputs of a converged box are written in the real formats
(the captured ones in tests/fixtures/apt hold no NVIDIA package)."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpubox import bench, doctor
from gpubox.config import load_host_config
from gpubox.sandbox import standin
from gpubox.sandbox.standin import state as st

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PIN = "570.211.01"
NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
CONFIG = load_host_config("box", {"nvlink_links": 2, "llamacpp_cuda": False})
DRIVER = CONFIG.driver_packages("debian")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def _systemctl_show(states: dict[str, str]) -> str:
    blocks = []
    for unit in doctor.SERVICES:
        active = states.get(unit, "inactive")
        load = "not-found" if active == "missing" else "loaded"
        blocks.append(
            f"Id={unit}.service\nLoadState={load}\n"
            f"ActiveState={'inactive' if active == 'missing' else active}\n"
            f"UnitFileState={'' if active == 'missing' else 'enabled'}\n"
        )
    return "\n".join(blocks)


def converged_outputs() -> dict[str, str]:
    """What the non-GPU commands print on a converged Debian 12 box."""
    version = DRIVER.package_version
    policy = "".join(
        f"{name}:\n  Installed: {version}\n  Candidate: {version}\n  Version table:\n"
        f" *** {version} 1001\n        500 http://127.0.0.1:8000/debian12/x86_64  Packages\n"
        f"        100 /var/lib/dpkg/status\n"
        for name in DRIVER.installed
    )
    return {
        "os_release": fixture("os/os-release_debian12_local.txt"),
        "kernel": "6.1.0-28-amd64\n",
        "module_version": PIN + "\n",
        "kernels": "R 6.1.0-28-amd64\nK 6.1.0-28-amd64\nH 6.1.0-28-amd64\nDKMS\n"
        f"D nvidia-current/{PIN}, 6.1.0-28-amd64, x86_64: installed\n",
        "dpkg": fixture("apt/dpkg-query_debian12_local.txt")
        + "".join(f"{name}\t{version}\thi \n" for name in DRIVER.installed),
        "holds": "\n".join(DRIVER.installed) + "\n",
        "policy": policy,
        "nvcc": "/usr/local/cuda-12.8/bin/nvcc\n"
        + fixture("nvcc/nvcc-version_12.8.93_1cat-issue237.txt"),
        "cuda_link": "/usr/local/cuda-12.8\n",
        "services": _systemctl_show(
            {
                "nvidia-persistenced": "active",
                "docker": "active",
                "nvidia-dcgm": "active",
                "gpubox-llama-server": "active",
                "gpubox-vllm": "missing",
            }
        ),
        "docker_info": json.dumps(
            {
                "ServerVersion": "20.10.24+dfsg1",
                "DefaultRuntime": "runc",
                "Runtimes": {"io.containerd.runc.v2": {}, "nvidia": {}, "runc": {}},
            }
        )
        + "\n",
        "health": "200",
        "burnin": json.dumps(
            {
                "date": "2026-02-27T10:00:00+00:00",
                "passed": True,
                "gpu_count": 2,
                "seconds": 3,
                "gpu_burn": {"exit_status": 0, "tested": 2, "gpus": {"0": "OK", "1": "OK"}},
                "dcgm_diag": {"level": 2, "passed": True},
                "problems": [],
            }
        ),
    }


class StandinHost:
    """A host runner: nvidia-smi, lspci and dcgmi are the sandbox's stand-ins on a temporary
    state; every other command prints what ``outputs`` holds for its fact name, and an
    unknown command is "not found" (127), as the shell says."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = st.default_state()
        self.run_dir = root / "run"
        self.run_dir.mkdir()
        (self.run_dir / st.LOADED_DRIVER_FILE).write_text(PIN + "\n")
        (self.run_dir / st.PERSISTENCE_FILE).touch()
        (self.run_dir / st.HOSTENGINE_FILE).write_text(f"{os.getpid()} 127.0.0.1:5555\n")
        (root / "profiling.so").touch()
        self.bin = root / "bin"
        self.bin.mkdir()
        for name, text in (
            ("nvidia-smi", standin.nvidia_smi_source(PIN)),
            ("dcgmi", standin.dcgm_source(standin.DCGMI, "4.4.1")),
            ("lspci", standin.LSPCI.read_text()),
        ):
            (self.bin / name).write_text(text)
        self.outputs = converged_outputs()
        self.names = {cmd: name for name, cmd in doctor.commands(CONFIG, "debian").items()}
        self.ran: list[str] = []

    def __call__(self, command: str) -> doctor.Output:
        self.ran.append(command)
        st.save_state(self.state, self.root / "state.json")
        argv = shlex.split(command)
        if argv[0] in ("nvidia-smi", "dcgmi", "lspci"):
            env = {
                **os.environ,
                st.STATE_ENV: str(self.root / "state.json"),
                st.RUN_ENV: str(self.run_dir),
                st.PROFILING_MODULE_ENV: str(self.root / "profiling.so"),
            }
            result = subprocess.run(
                [sys.executable, str(self.bin / argv[0]), *argv[1:]],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            return doctor.Output(result.returncode, result.stdout, result.stderr)
        name = self.names.get(command)
        if name in self.outputs:
            return doctor.Output(0, self.outputs[name])
        if name == "burnin":
            return doctor.Output(1, "", f"cat: {doctor.BURNIN_RECORD}: No such file or directory")
        return doctor.Output(127, "", f"sh: 1: {argv[0]}: not found")


@pytest.fixture
def host(tmp_path: Path) -> StandinHost:
    return StandinHost(tmp_path)


def check(host: StandinHost, config: Any = CONFIG) -> tuple[dict[str, Any], list[str], str]:
    facts = doctor.gather(host, config)
    view = doctor.describe(config, facts, NOW)
    findings = doctor.evaluate(config, facts, "inventories/box.py", NOW)
    return view, [str(f) for f in findings], doctor.render_text("box", view, findings)


def test_a_converged_box_is_ok_and_every_command_runs_once(host: StandinHost):
    view, findings, text = check(host)
    assert findings == [], findings
    assert sorted(host.ran) == sorted(doctor.commands(CONFIG, "debian").values())
    assert len(host.ran) == len(set(host.ran))
    assert text.endswith("OK: no deviation from the inventory\n")
    lines = text.splitlines()
    assert lines[0] == "== box: Debian GNU/Linux 12 (bookworm), kernel 6.1.0-28-amd64"
    assert lines[1] == f"GPUs      2 found, driver {PIN}"
    assert lines[2].startswith("  GPU 0  Tesla V100-SXM2-32GB  00000000:07:00.0  mem 0/32768 MiB")
    assert "persistence on" in lines[2] and "apps ?" in lines[2]  # the stand-in lists no apps
    assert lines[4].startswith(
        "NVLink    GPU 0 2 up (0, 2), 4 down; GPU 1 2 up (1, 2), 4 down; 25.781 GB/s"
    )
    assert [ln.split()[:3] for ln in lines[6:8]] == [["GPU0", "X", "NV2"], ["GPU1", "NV2", "X"]]
    assert f"Driver    installed {DRIVER.package_version}, loaded {PIN}" in text
    assert "held 2/2" in text and "nvidia-persistenced active, enabled" in text
    assert "CUDA      nvcc 12.8.93 (/usr/local/cuda-12.8/bin/nvcc)" in text
    assert "runtimes io.containerd.runc.v2, nvidia, runc (default runc)" in text
    assert "DCGM      nvidia-dcgm active, enabled, 2 GPU(s) discovered" in text
    assert "/health 200, model qwen3-next (http://127.0.0.1:8080)" in text
    assert "\n          no bench yet (gpubox bench --inventory INVENTORY)\n" in text
    assert view["backend"]["last_bench"] is None
    assert "Burn-in   passed 2026-02-27T10:00:00+00:00, 2 day(s) ago (GPU 0 OK, GPU 1 OK)" in text
    assert view["gpus"]["gpus"][1]["power_limit_w"] == 300.0


def test_planted_faults_gpu_missing(host: StandinHost):
    st.set_gpu_present(host.state, 1, False)
    _, findings, text = check(host)
    assert (
        "GPU missing: expected 2 Tesla V100-SXM2-32GB, found 1; lspci shows 1 NVIDIA 3D "
        "controller(s) -> check the card/power/PCIe; lspci -d 10de:"
    ) in findings
    assert "DCGM discovers 1 GPU(s)" not in text  # dcgm and nvidia-smi agree
    assert any(f.startswith("NVLink link down on GPU 0: 0 active, expected 2") for f in findings)
    assert "Warnings (" in text and "  ! GPU missing" in text


def test_planted_faults_link_down(host: StandinHost):
    st.set_link_active(host.state, 0, 2, False)
    view, findings, _ = check(host)
    fix = "reseat the NVLink bridge/board, check the GPUs' seating; nvidia-smi nvlink -s"
    assert findings == [
        f"NVLink link down on GPU 0: 1 active, expected 2 (inactive: 1, 2, 3, 4, 5) -> {fix}",
        f"NVLink link down on GPU 1: 1 active, expected 2 (inactive: 0, 2, 3, 4, 5) -> {fix}",
    ]
    assert view["nvlink"]["topology"]["matrix"][0][1] == "NV1"  # still joined by the other


def test_planted_faults_persistence_off(host: StandinHost):
    st.set_persistence_forced_off(host.state, True)
    _, findings, text = check(host)
    fix = "sudo systemctl restart nvidia-persistenced; pyinfra inventories/box.py deploy/driver.py"
    assert findings == [
        f"persistence mode off on GPU 0 -> {fix}",
        f"persistence mode off on GPU 1 -> {fix}",
    ]
    assert "persistence OFF" in text


def test_no_driver_loaded_and_tools_missing(host: StandinHost):
    (host.run_dir / st.LOADED_DRIVER_FILE).unlink()
    (host.run_dir / st.HOSTENGINE_FILE).unlink()
    for name in ("nvcc", "cuda_link", "docker_info", "holds"):
        del host.outputs[name]
    host.outputs["services"] = _systemctl_show({"docker": "failed", "nvidia-dcgm": "inactive"})
    host.outputs["health"] = "000"
    _, findings, text = check(host)
    assert (
        "nvidia-smi cannot talk to the driver: no NVIDIA kernel module loaded -> "
        "pyinfra inventories/box.py deploy/driver.py (reboots when allow_reboot; else sudo reboot)"
    ) in findings
    assert (
        "no nvcc on a login shell's PATH -> pyinfra inventories/box.py deploy/cuda.py" in findings
    )
    assert any(f.startswith("/usr/local/cuda resolves to nothing") for f in findings)
    assert any(f.startswith("docker not found -> sudo systemctl start docker") for f in findings)
    assert any(f.startswith("nvidia-dcgm is inactive -> sudo systemctl start") for f in findings)
    assert any(f.startswith("gpubox-llama-server is inactive -> journalctl") for f in findings)
    assert any(f.startswith("nvidia-persistenced is inactive") for f in findings)
    assert "GPUs      nvidia-smi: NVIDIA-SMI has failed" in text
    assert "held 0/?" in text


def test_driver_drift_unheld_and_pin_broken(host: StandinHost):
    host.outputs["holds"] = ""
    host.outputs["policy"] = host.outputs["policy"].replace(
        f"Candidate: {DRIVER.package_version}", "Candidate: 580.105.08-1"
    )
    host.outputs["module_version"] = "580.105.08\n"
    _, findings, _ = check(host)
    fix = "pyinfra inventories/box.py deploy/driver.py"
    assert f"driver packages not held: {', '.join(DRIVER.installed)} -> {fix}" in findings
    assert (
        f"apt would install driver 580.105.08-1, not {DRIVER.package_version} (the pin is "
        f"missing or broken) -> {fix}"
    ) in findings
    assert any(f.startswith(f"loaded driver {PIN}, 580.105.08, configured {PIN}") for f in findings)


def test_a_kernel_update_without_the_module_is_named_with_its_fix(host: StandinHost):
    _, findings, text = check(host)
    assert "Kernels   module built for 6.1.0-28-amd64\n" in text and not findings
    host.outputs["kernels"] += "K 6.1.0-31-amd64\n"
    _, findings, text = check(host)
    assert findings == [
        f"no NVIDIA {PIN} module (dkms status) for kernel(s) 6.1.0-31-amd64: booting one of "
        "them gives no driver -> pyinfra inventories/box.py deploy/driver.py (runs dkms "
        "autoinstall -k KERNEL, or installs that kernel's headers)"
    ]
    assert "Kernels   module built for 6.1.0-28-amd64; MISSING for 6.1.0-31-amd64" in text


def test_burnin_failed_and_required(host: StandinHost):
    required = load_host_config("box", {"nvlink_links": 2, "burnin_required": True})
    del host.outputs["burnin"]
    _, findings, text = check(host, required)
    assert (
        "no burn-in record (/var/lib/gpubox/burnin.json) -> gpubox burnin inventories/box.py"
        in findings
    )
    assert "Burn-in   none recorded" in text
    record = json.loads(converged_outputs()["burnin"])
    record.update(passed=False, problems=["GPU 1: gpu-burn says FAULTY"])
    record["gpu_burn"]["gpus"]["1"] = "FAULTY"
    host.outputs["burnin"] = json.dumps(record)
    _, findings, text = check(host)
    assert (
        "the last burn-in failed: GPU 1: gpu-burn says FAULTY -> gpubox burnin inventories/box.py"
        in findings
    )
    assert "Burn-in   FAILED" in text and "GPU 1 FAULTY" in text


def test_unreachable_host_raises():
    def refuse(command: str) -> doctor.Output:
        raise OSError("Connection refused")

    with pytest.raises(doctor.Unreachable, match="Connection refused"):
        doctor.gather(refuse, CONFIG)


def test_json_is_the_same_report(host: StandinHost):
    st.set_persistence_forced_off(host.state, True)
    facts = doctor.gather(host, CONFIG)
    view = doctor.describe(CONFIG, facts, NOW)
    findings = doctor.evaluate(CONFIG, facts, "inv.py", NOW)
    doc = json.loads(doctor.render_json([doctor.host_report("box", view, findings)]))
    [report] = doc["hosts"]
    assert report["host"] == "box" and report["ok"] is False
    assert [f["message"] for f in report["findings"]] == [
        "persistence mode off on GPU 0",
        "persistence mode off on GPU 1",
    ]
    assert report["findings"][0]["area"] == "gpu"
    assert [g["persistence"] for g in report["gpus"]["gpus"]] == ["Disabled", "Disabled"]
    assert report["nvlink"]["topology"]["devices"] == ["GPU0", "GPU1"]
    assert report["driver"]["loaded"] == PIN


def test_systemctl_show_blocks():
    units = doctor.parse_systemctl_show(_systemctl_show({"docker": "active"}))
    assert units["docker"]["ActiveState"] == "active"
    assert units["gpubox-vllm"]["LoadState"] == "loaded"


def _bench_report(url: str, model: str = "qwen3-next") -> dict[str, Any]:
    def level(n: int, tps: float, ttft: float, tpot: float, failed: int = 0) -> dict[str, Any]:
        return {
            "max_concurrency": n,
            "output_throughput": tps,
            "median_ttft_ms": ttft,
            "median_tpot_ms": tpot,
            "completed": 8 - failed,
            "failed": failed,
        }

    return {
        "endpoint": {"url": url, "model": model},
        "levels": [level(1, 65.4, 120.2, 15.24), level(4, 201.0, 180.0, 19.6, failed=2)],
    }


def test_the_last_bench_figures_are_shown_in_the_backend_section(
    host: StandinHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    url = bench.host_url("box", "gpu1.example", CONFIG.api_port)
    assert url == "http://gpu1.example:8080"
    record = bench.summary_record(_bench_report(url), date="2026-11-30T10:00:00+0100")
    bench.save_record(record, host="box")
    found = bench.load_record("box", url)
    facts = doctor.gather(host, CONFIG)
    view = doctor.describe(CONFIG, facts, NOW, last_bench=found)
    text = doctor.render_text("box", view, doctor.evaluate(CONFIG, facts, "inv.py", NOW))
    assert (
        "\n          last bench 2026-11-30: 1 stream 65 tok/s, TTFT 120 ms, TPOT 15.2 ms; "
        "4 streams 201 tok/s, TTFT 180 ms, TPOT 19.6 ms, 2 FAILED\n"
    ) in text
    report = json.loads(doctor.render_json([doctor.host_report("box", view, [])]))
    assert report["hosts"][0]["backend"]["last_bench"] == record


def test_the_last_bench_is_found_by_url_and_names_another_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    url = bench.host_url("box", None, 8080)
    assert bench.load_record("box", url) is None
    assert doctor.format_bench(None).startswith("no bench yet")
    # `gpubox bench http://box:8080 --model other` keeps it under the URL only.
    bench.save_record(bench.summary_record(_bench_report("http://box:8080/", "other")))
    record = bench.load_record("box", url)
    assert record is not None
    assert doctor.format_bench(record, "qwen3-next").startswith("last bench ")
    assert " of model other: 1 stream 65 tok/s" in doctor.format_bench(record, "qwen3-next")
    assert " of model" not in doctor.format_bench(record, "other")
