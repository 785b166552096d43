"""gpubox doctor and gpubox nvlink against the sandbox box after a deploy: a converged box is
OK, and each planted fault (a GPU missing, an NVLink link down, persistence off) is named
with its fix; nvlink labels the stand-in's traffic. The tests run in order on one box."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import box_sh, plant

from gpubox import demo
from gpubox.sandbox.standin import state as standin_state

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sandbox_box")]


def gpubox(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m gpubox.<module> ARGS` in the sandbox's network namespace (as the CLI's
    `gpubox doctor` / `gpubox nvlink` run them)."""
    argv = demo.in_netns([sys.executable, "-m", f"gpubox.{module}", *args])
    return subprocess.run(argv, cwd=demo.ROOT, text=True, capture_output=True, timeout=600)


def doctor_json() -> tuple[int, dict]:
    proc = gpubox("doctor", demo.INVENTORY, "--json")
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    [report] = json.loads(proc.stdout)["hosts"]
    return proc.returncode, report


def messages(report: dict) -> list[str]:
    return [f"{f['message']} -> {f['fix']}" for f in report["findings"]]


def test_a_deployed_box_is_ok():
    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    before = box_sh("dpkg -l | sha256sum; systemctl list-units --state=active | sha256sum")
    rc, report = doctor_json()
    assert rc == 0 and report["ok"], messages(report)
    assert len(report["gpus"]["gpus"]) == 2 and report["dcgm"]["gpus"] == 2
    assert report["backend"]["health"] == 200
    text = gpubox("doctor", demo.INVENTORY)
    assert text.returncode == 0 and "OK: no deviation from the inventory" in text.stdout
    assert box_sh("dpkg -l | sha256sum; systemctl list-units --state=active | sha256sum") == (
        before
    )


def test_bench_measures_the_real_llama_server(tmp_path):
    key = tmp_path / "api-key"
    key.write_text(box_sh("cat /etc/gpubox/api-key"))
    out = tmp_path / "bench.json"
    proc = gpubox(
        "bench",
        "http://127.0.0.1:8080",
        "--model",
        "qwen3-next",
        "--api-key-file",
        str(key),
        "--concurrency",
        "1,2",
        "--requests",
        "4",
        "--prompt-tokens",
        "16",
        "--max-tokens",
        "16",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    print("\n" + proc.stdout)
    report = json.loads(out.read_text())
    print(json.dumps(report, indent=1)[:1500])
    assert "TTFT" in proc.stdout


def test_a_missing_gpu_is_named():
    plant(lambda s: standin_state.set_gpu_present(s, 1, False))
    try:
        rc, report = doctor_json()
        assert rc == 1
        assert (
            "GPU missing: expected 2 Tesla V100-SXM2-32GB, found 1; lspci shows 1 NVIDIA 3D "
            "controller(s) -> check the card/power/PCIe; lspci -d 10de:"
        ) in messages(report)
    finally:
        plant(lambda s: standin_state.set_gpu_present(s, 1, True))


def test_a_link_down_is_named():
    plant(lambda s: standin_state.set_link_active(s, 0, 2, False))
    try:
        rc, report = doctor_json()
        assert rc == 1
        found = messages(report)
        assert any(m.startswith("NVLink link down on GPU 0: 1 active, expected 2") for m in found)
        assert any(m.startswith("NVLink link down on GPU 1: 1 active, expected 2") for m in found)
    finally:
        plant(lambda s: standin_state.set_link_active(s, 0, 2, True))


def test_persistence_off_is_named():
    plant(lambda s: standin_state.set_persistence_forced_off(s, True))
    try:
        proc = gpubox("doctor", demo.INVENTORY)
        assert proc.returncode == 1
        assert "persistence mode off on GPU 0 -> sudo systemctl restart nvidia-persistenced" in (
            proc.stdout
        )
        assert "persistence mode off on GPU 1" in proc.stdout
    finally:
        plant(lambda s: standin_state.set_persistence_forced_off(s, False))
    rc, report = doctor_json()
    assert rc == 0, messages(report)


def test_nvlink_labels_the_traffic():
    def traffic(s: dict) -> None:
        standin_state.set_gpu_nvlink_traffic(s, 0, 25_000_000_000, 24_500_000_000)
        standin_state.set_gpu_nvlink_traffic(s, 1, 24_500_000_000, 25_000_000_000)

    plant(traffic)
    try:
        proc = gpubox("nvlink", demo.INVENTORY, "--count", "3", "--interval", "0.2")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "NVLink traffic on gpubox-sandbox, sample 3" in proc.stdout
        assert "warming up" in proc.stdout  # the first samples of the profiling fields
        last = proc.stdout.split("sample 3")[1]
        assert "GPU 0  25.0 GB/s  24.5 GB/s  49.5 GB/s" in last
        assert "all    49.5 GB/s  49.5 GB/s  99.0 GB/s" in last
    finally:
        plant(lambda s: [standin_state.set_gpu_nvlink_traffic(s, i, 0, 0) for i in (0, 1)])
