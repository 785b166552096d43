"""gpubox bench --llama-bench against the sandbox box, for real: the deploy builds llama-bench
beside llama-server (a CPU build), and `gpubox bench --inventory inventories/sandbox.py
--llama-bench` runs it over SSH on the tiny model, with gpubox-llama-server stopped for the
run and healthy again after it; --split-modes reports the mode llama.cpp refuses on a CPU build
(tensor) as failed with llama.cpp's reason, and names the mode to set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import box_sh

from gpubox import bench as bench_records
from gpubox import demo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sandbox_box")]
HOST = "gpubox-sandbox"
UNIT = "gpubox-llama-server"


def bench(tmp_path: Path, *args: str, key_file: bool = True) -> subprocess.CompletedProcess[str]:
    """`gpubox bench --inventory inventories/sandbox.py ARGS` in the sandbox's network namespace,
    a short served bench (1 stream, 4 requests). Its records go where a user's would (the
    sandbox reads GPUBOX_STATE_DIR too, so it is left alone). ``key_file``: the API key copied
    to a local file and given with --api-key-file; without it the bench reads it from the box
    over the inventory's SSH connection."""
    given = []
    if key_file:
        key = tmp_path / "api-key"
        key.write_text(box_sh("cat /etc/gpubox/api-key"))
        given = ["--api-key-file", str(key)]
    argv = demo.in_netns(
        [
            sys.executable, "-m", "gpubox.bench", "--inventory", demo.INVENTORY,
            *given, "--concurrency", "1", "--requests", "4",
            "--prompt-tokens", "64", "--max-tokens", "32", *args,
        ]
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "GPUBOX_API_KEY"}
    proc = subprocess.run(
        argv, cwd=demo.ROOT, text=True, capture_output=True, timeout=1200, env=env
    )
    print("\n" + proc.stdout + proc.stderr[-3000:])
    return proc


def service_is_back() -> None:
    assert box_sh(f"systemctl is-active {UNIT}", check=False).strip() == "active"
    code = box_sh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/health")
    assert code == "200"
    assert box_sh("test -e /run/gpubox-llama-bench.pid || echo gone").strip() == "gone"


def test_the_deploy_builds_llama_bench():
    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    assert box_sh("ls /opt/llama.cpp/*/bin/llama-bench").strip()
    service_is_back()


def test_llama_bench_beside_the_served_figures(tmp_path):
    out = tmp_path / "bench.json"
    pid_before = box_sh(f"systemctl show -p MainPID --value {UNIT}").strip()
    # as a user runs it: no key copied, the API on the box's loopback (api_host's default)
    proc = bench(tmp_path, "--llama-bench", "--json", str(out), key_file=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"{HOST}: the API at 127.0.0.1:8080 on the box, through an SSH tunnel from " in (
        proc.stderr
    )
    assert box_sh("cat /etc/gpubox/api-key").strip() not in proc.stdout + proc.stderr
    assert f"{HOST}: stopping {UNIT} for llama-bench" in proc.stderr
    assert f"{HOST}: {UNIT} healthy again after" in proc.stderr
    service_is_back()
    # a new server process: it was stopped and started, not left running beside the bench
    assert box_sh(f"systemctl show -p MainPID --value {UNIT}").strip() != pid_before

    [mode] = json.loads(out.read_text())["llama_bench"][HOST]["modes"]
    assert mode["mode"] == "layer" and mode["ok"], mode
    pp512, tg128 = mode["tests"]["pp512"], mode["tests"]["tg128"]
    assert pp512["avg_ts"] > 0 and tg128["avg_ts"] > 0
    assert pp512["split_mode"] == tg128["split_mode"] == "layer"
    assert tg128["backends"] == "CPU" and tg128["n_gpu_layers"] == 999
    assert len(tg128["samples_ts"]) == 3
    for name, test in (("tg128", tg128), ("pp512", pp512)):
        print(f"\n[llama-bench] tiny model {name} {test['avg_ts']:.1f} ± {test['stddev_ts']:.1f}")

    # one table: llama-bench's rows beside the served ones
    table = proc.stdout[proc.stdout.index(f"{HOST}: llama-bench") :].splitlines()
    assert table[1].split()[:3] == ["tok/s", "-sm", "layer"] and "served," in table[1]
    assert table[2].split()[:2] == ["prompt", "(pp512)"] and len(table[2].split()) == 6
    assert table[3].split()[:3] == ["decode", "(tg128)", f"{tg128['avg_ts']:.1f}"]

    record = bench_records.load_record(HOST, "http://127.0.0.1:8080")
    assert record is not None and record["levels"][0]["completed"] == 4  # the served figures
    kept = record["llama_bench"]["modes"]["layer"]["tg128"]["avg_ts"]
    assert kept == pytest.approx(tg128["avg_ts"])


def test_split_modes_name_the_one_to_set(tmp_path):
    proc = bench(tmp_path, "--split-modes", "layer,tensor")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # A CPU build has no device to split a tensor over: llama.cpp refuses the model.
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("  -sm tensor failed: ")]
    assert len(failed) == 1 and "exit status 1" in failed[0], proc.stdout
    assert "-sm layer failed" not in proc.stdout
    [advice] = [ln for ln in proc.stdout.splitlines() if ln.startswith("set llamacpp_split_mode")]
    assert advice.startswith("set llamacpp_split_mode: layer (tg128 ")
    assert advice.endswith(" tok/s vs tensor failed) (already set)")
    service_is_back()
