"""A fleet from one inventory (issue 11): three sandbox boxes, as a lab has them (box 1 the
reference, box 2 one Tesla T4 with no NVLink and nothing served, box 3 the reference again),
deployed by one pyinfra run in parallel. A box refused by preflight fails alone while the
others converge; a re-run changes nothing; a fault planted on one box is reported for that
box only. The tests run in order on the same three boxes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from conftest import box_sh, plant

from gpubox.commands import demo
from gpubox.sandbox.standin import state as standin_state

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("fleet")]

BOXES = ["gpubox-sandbox", "gpubox-sandbox-2", "gpubox-sandbox-3"]
SNAPSHOT = (  # what a refused run must leave as it was: packages and every file in /etc
    "set -o pipefail; dpkg -l | sha256sum; "
    "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum"
)


@pytest.fixture(scope="module")
def fleet():
    demo.sandbox("down", check=False)
    demo.sandbox("up", "--boxes", "3")
    yield
    demo.sandbox("down", check=False)


def doctor_json() -> dict:
    argv = demo.in_netns([sys.executable, "-m", "gpubox.doctor", demo.INVENTORY, "--json"])
    proc = subprocess.run(argv, cwd=demo.ROOT, text=True, capture_output=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_inventory_lists_every_box_with_its_own_data():
    from gpubox.remote import inventory

    hosts = dict(inventory.load(str(demo.ROOT / demo.INVENTORY)))
    assert list(hosts) == BOXES
    assert (hosts["gpubox-sandbox-2"]["gpu_model"], hosts["gpubox-sandbox-2"]["gpu_count"]) == (
        "Tesla T4",
        1,
    )
    assert hosts["gpubox-sandbox-2"]["backend"] == "none"
    assert len({d["ssh_port"] for d in hosts.values()}) == 3  # each box its own SSH port
    names = {box_sh("hostname", box=k).strip() for k in (1, 2, 3)}
    assert names == set(BOXES)


def test_a_box_refused_by_preflight_fails_alone_and_the_others_converge():
    plant(lambda s: standin_state.set_gpu_present(s, 1, False), box=3)
    before = box_sh(SNAPSHOT, box=3)
    start = time.monotonic()
    run = demo.deploy()
    print(f"\nfirst deploy of 3 boxes (box 3 refused): {time.monotonic() - start:.1f} s")
    assert run.failed_hosts == ["gpubox-sandbox-3"], (run.failed_hosts, run.output[-3000:])
    assert "gpubox-sandbox-3" in run.output and "gpu_count: lspci shows 1" in run.output
    assert box_sh(SNAPSHOT, box=3) == before
    checks = demo.checks(extra=("-m", "quick", "-k", "gpubox-sandbox: or gpubox-sandbox-2:"))
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]
    assert {"gpubox-sandbox", "gpubox-sandbox-2"} <= checks.hosts


def test_the_refused_box_converges_once_its_gpu_is_back_and_every_box_passes():
    plant(lambda s: standin_state.set_gpu_present(s, 1, True), box=3)
    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    checks = demo.checks(extra=("-m", "quick"))
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]
    assert checks.hosts == set(BOXES)


def test_a_rerun_changes_nothing_on_any_box():
    start = time.monotonic()
    run = demo.deploy()
    print(f"\nno-op deploy of 3 boxes: {time.monotonic() - start:.1f} s")
    assert run.no_change, run.changed_names


def test_one_image_command_serves_every_box():
    """`gpubox sandbox image` loads the host checks' container image into every box that is
    up (not box 1 alone), so the GPU container checks pass on each box without --box K."""
    image = demo.sandbox("image", quiet=True).stdout.strip()
    for k in (1, 2, 3):
        found = box_sh(f"docker image inspect --format '{{{{.Id}}}}' {image}", box=k)
        assert found.startswith("sha256:"), (k, found)
    checks = demo.checks(extra=("-k", "docker.gpus-all or docker.daemon-reload"))
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]
    assert checks.hosts == set(BOXES)


def test_a_fault_on_one_box_is_reported_for_that_box_only():
    box_sh("systemctl stop gpubox-llama-server", box=3)
    try:
        report = doctor_json()
        checks = demo.checks(extra=("-m", "quick"))
    finally:
        box_sh("systemctl start gpubox-llama-server", box=3)
    rows = {row["host"]: row for row in report["fleet"]}
    assert [rows[name]["deviations"] for name in BOXES[:2]] == [0, 0], report["fleet"]
    assert rows["gpubox-sandbox-3"]["deviations"] >= 2
    failing = {r["host"]: {f["check"] for f in r["findings"]} for r in report["hosts"]}
    assert failing["gpubox-sandbox"] == failing["gpubox-sandbox-2"] == set()
    assert {"backend.service", "backend.health"} <= failing["gpubox-sandbox-3"]
    assert set(checks.by_host) == {"gpubox-sandbox-3"}, checks.by_host.keys()
    assert {"backend.service", "backend.health"} <= set(checks.by_host["gpubox-sandbox-3"])


def test_a_failing_canary_stops_the_fleet_and_a_passing_one_lets_it_through(tmp_path):
    """`gpubox deploy --canary 1` (issue 30 D) with a change whose canary fails: box 1 moved
    to 580.105.08, whose module the box's kernel refuses (the stand-in's fault). The run exits
    1 and boxes 2 and 3 keep their packages (dpkg's status) and their boot. Then, the fault
    cleared, the same command without the change puts box 1 back at 570 as a canary that
    passes: its full checks, its short bench against the baseline `gpubox bench` recorded at
    the start (the tolerance set wide: a CPU server beside other tests varies), then the rest.
    The baseline goes where a user's would (the sandbox reads GPUBOX_STATE_DIR too)."""
    box1 = tmp_path / "box1.py"  # an inventory of box 1 alone, for its baseline bench
    box1.write_text(
        "import runpy\n"
        f"hosts = [h for h in runpy.run_path({str(demo.ROOT / demo.INVENTORY)!r})['hosts']"
        f" if h[0] == {BOXES[0]!r}]\n"
    )
    start = time.monotonic()
    bench = [str(demo.BIN / "gpubox"), "bench", "--inventory", str(box1), "--concurrency", "1"]
    bench += ["--requests", "3", "--prompt-tokens", "32", "--max-tokens", "32"]
    rc, _, output = demo.stream(demo.in_netns(bench), merged=True)
    assert rc == 0, output[-3000:]
    baseline_s = time.monotonic() - start
    untouched = "sha256sum /var/lib/dpkg/status; cat /proc/sys/kernel/random/boot_id"
    before = {k: box_sh(untouched, box=k) for k in (2, 3)}
    demo.sandbox("fault", "module-refuses", "--version", "580.105.08", "--box", "1")
    try:
        start = time.monotonic()
        rc, output = canary_deploy("--data", "driver_branch=580")
        failing_s = time.monotonic() - start
    finally:
        demo.sandbox("fault", "clear", "--box", "1")
    assert rc == 1, output[-4000:]
    assert f"canary: deploying {BOXES[0]}" in output
    assert f"canary: FAILED on {BOXES[0]}: " in output, output[-4000:]
    assert f"canary: the rest was not deployed: {BOXES[1]}, {BOXES[2]}" in output
    assert "deploying the rest" not in output
    assert {k: box_sh(untouched, box=k) for k in (2, 3)} == before
    start = time.monotonic()
    rc, output = canary_deploy("--data", "canary_bench_tolerance=90")
    passing_s = time.monotonic() - start
    assert rc == 0, output[-4000:]
    assert f"canary: checks on {BOXES[0]}" in output
    assert re.search(
        rf"canary: bench on {BOXES[0]}: [\d.]+ tok/s vs baseline [\d.]+ tok/s "
        r"\([+-][\d.]+%, tolerance 90%\)",
        output,
    ), output[-4000:]
    assert f"canary: passed; deploying the rest: {BOXES[1]}, {BOXES[2]}" in output
    print(
        f"\ncanary: baseline bench {baseline_s:.1f} s, failing canary run {failing_s:.1f} s, "
        f"passing canary run (box 1 back at 570, then the rest) {passing_s:.1f} s"
    )


def canary_deploy(*extra: str) -> tuple[int, str]:
    """`gpubox deploy INVENTORY --canary 1 -y ...` as a user types it: (exit code, output)."""
    argv = [str(demo.BIN / "gpubox"), "deploy", demo.INVENTORY, "--canary", "1", "-y", *extra]
    rc, _, output = demo.stream(demo.in_netns(argv), merged=True)
    return rc, output
