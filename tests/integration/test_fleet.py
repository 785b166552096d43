"""A fleet from one inventory (issue 11): three sandbox boxes, as a lab has them (box 1 the
reference, box 2 one Tesla T4 with no NVLink and nothing served, box 3 the reference again),
deployed by one pyinfra run in parallel. A box refused by preflight fails alone while the
others converge; a re-run changes nothing; a fault planted on one box is reported for that
box only. The tests run in order on the same three boxes."""

from __future__ import annotations

import json
import re
import shlex
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


def doctor_json(inventory: str = demo.INVENTORY, codes: tuple[int, ...] = (0, 1)) -> dict:
    argv = demo.in_netns([sys.executable, "-m", "gpubox.doctor", inventory, "--json"])
    proc = subprocess.run(argv, cwd=demo.ROOT, text=True, capture_output=True, timeout=900)
    assert proc.returncode in codes, proc.stdout[-2000:] + proc.stderr[-2000:]
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


# Issue 30 B: a move driven by the key, under Secure Boot, to a patch release, and back without
# the repository; each with a real reboot, on box 1: the reference box, and the box every
# sandbox command (fault, repo, ssh) and the canary test after these take by default. The box
# is moved by an inventory of its own (inventories/sandbox.py's box 1, the key set on top:
# boxes 2 and 3 are not touched), and ends at 570, serving, Secure Boot and faults cleared.
MOVE_INVENTORY = """import runpy

_sandbox = runpy.run_path("{root}/inventories/sandbox.py")
hosts = [
    (name, {{**data, **{values!r}}}) for name, data in _sandbox["hosts"] if name == "gpubox-sandbox"
]
"""
KEPT = "/var/lib/gpubox/driver-kept"


def move(tmp_path, values: dict, full_checks: bool = True) -> str:
    """Deploy box 1 with ``values`` on top of its data (a real deploy: every stage, the
    reboot, the final quick checks), then every host check (``full_checks``: the first move's;
    the later moves' own deploys end with the quick checks, which cover the driver), then a
    second deploy that must change nothing; print the times. Returns the inventory's path."""
    inventory = tmp_path / f"move-{'-'.join(str(v) for v in values.values())}.py"
    inventory.write_text(MOVE_INVENTORY.format(root=demo.ROOT, values=values))
    boot_before = box_sh("cat /proc/sys/kernel/random/boot_id")
    run = demo.deploy(inventory=str(inventory))
    assert run.rc == 0 and not run.failed_hosts, run.output[-4000:]
    assert box_sh("cat /proc/sys/kernel/random/boot_id") != boot_before  # one real reboot
    assert len([n for n in run.changed_names if "Reboot to load the driver" in n]) == 1
    boot = box_sh("systemd-analyze 2>/dev/null | head -n 1 || true").strip()
    assert "quick checks passed" in run.output, run.output[-3000:]
    checked, passed = 0.0, "the deploy's quick checks"
    if full_checks:
        start = time.monotonic()
        checks = demo.checks(inventory=str(inventory))
        checked = time.monotonic() - start
        assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]
        passed = f"{checks.passed} passed"
    again = demo.deploy(inventory=str(inventory))
    assert again.no_change, again.changed_names
    # held again at the new version (the install changed the held packages)
    assert {"nvidia-driver-cuda", "nvidia-kernel-dkms"} <= set(box_sh("apt-mark showhold").split())
    print(
        f"\nmove to {values}: deploy with the reboot {run.seconds:.1f} s (boot: {boot}), host "
        f"checks {checked:.1f} s ({passed}), second deploy {again.seconds:.1f} s "
        "(changed 0)"
    )
    assert "the driver moves from" in run.output
    return str(inventory)


def loaded_module() -> dict[str, str]:
    module = box_sh("modinfo -F filename nvidia-current").strip()
    return {
        "version": box_sh("cat /sys/module/nvidia/version").strip(),
        "taint": box_sh("cat /sys/module/nvidia/taint").strip(),
        "sig_key": box_sh(f"modinfo -F sig_key {module}").strip(),
        "persistence": box_sh(
            "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader"
        ).split(),
    }


def test_a_move_to_580_under_secure_boot_keeps_570_and_signs_the_new_modules(tmp_path):
    from gpubox import sandbox

    sandbox.plant_fault("secure-boot-enrolled")
    try:
        move(tmp_path, {"driver_branch": "580"})
        seen = loaded_module()
        serial = box_sh("openssl x509 -inform DER -in /var/lib/dkms/mok.pub -noout -serial")
        assert seen["version"] == "580.105.08"
        assert seen["sig_key"].replace(":", "").lstrip("0") == serial.strip().split("=")[1].lstrip(
            "0"
        )
        assert "E" not in seen["taint"], seen  # the kernel verified it (no E taint)
        assert seen["persistence"] == ["Enabled", "Enabled"]
        assert box_sh(f"stat -c '%a %U' {KEPT} {KEPT}/570.211.01").split() == [
            "700",
            "root",
            "700",
            "root",
        ]
        box_sh(f"cd {KEPT}/570.211.01 && sha256sum -c --quiet SHA256SUMS && test -f complete")
        assert "nvidia-driver-cuda=570.211.01-1" in box_sh(f"cat {KEPT}/570.211.01/installed")
    finally:
        sandbox.clear_faults()


def test_a_move_to_the_newer_580_build(tmp_path):
    from gpubox.sandbox.repo_driver import NEWER_580

    move(tmp_path, {"driver_branch": "580", "driver_version": NEWER_580}, full_checks=False)
    seen = loaded_module()
    assert seen["version"] == NEWER_580 and seen["persistence"] == ["Enabled", "Enabled"]
    box_sh(f"cd {KEPT}/580.105.08 && sha256sum -c --quiet SHA256SUMS && test -f complete")


def test_back_to_570_withdrawn_from_the_repository_from_the_kept_packages(tmp_path):
    from gpubox.sandbox import repo

    repo.withdraw("570.211.01")
    try:
        move(tmp_path, {"driver_branch": "570"}, full_checks=False)
        assert loaded_module()["version"] == "570.211.01"
        # installed from the kept packages: apt's only source of 570.211.01 on the box
        policy = box_sh("apt-cache policy nvidia-driver-cuda")
        assert "*** 570.211.01-1 1001" in policy, policy
        assert "file:/var/lib/gpubox/driver-kept-repo ./ Packages" in policy, policy
        box_sh(f"cd {KEPT}/580.900.01 && sha256sum -c --quiet SHA256SUMS && test -f complete")
    finally:
        repo.restore()


def test_a_move_to_a_refused_build_is_rolled_back_automatically():
    """issue 30 C: box 3 moves to 580.105.08, whose module the stand-in loader refuses at boot
    (`gpubox sandbox fault module-refuses`): after the move's reboot the deploy finds no module,
    goes back to 570.211.01 from the kept packages, reboots, verifies, and fails with exit 1
    naming what failed. The box ends where it started: 570 loaded, its packages at 570 and held,
    serving; a deploy at 570 then changes nothing."""
    name, driver = BOXES[2], "nvidia-driver-cuda nvidia-kernel-dkms libcuda1"
    versions = f"dpkg-query -W -f '${{Package}} ${{Version}}\\n' {driver}"
    before = box_sh(versions, box=3)
    assert before.count(" 570.211.01-") == 3, before
    boot = box_sh("cat /proc/sys/kernel/random/boot_id", box=3)
    holds = box_sh("apt-mark showhold", box=3)
    assert {"nvidia-driver-cuda", "nvidia-kernel-dkms"} <= set(holds.split()), holds
    demo.sandbox("fault", "module-refuses", "--version", "580.105.08", "--box", "3")
    try:
        start = time.monotonic()
        argv = [str(demo.BIN / "gpubox"), "deploy", "-y", demo.INVENTORY, "--limit", name]
        rc, _, output = demo.stream(
            demo.in_netns([*argv, "--data", "driver_branch=580"]), merged=True
        )
        took = time.monotonic() - start
        assert rc == 1, output[-4000:]
        assert "driver 580.105.08: the nvidia kernel module is not loaded" in output
        assert "The box is back on driver 570.211.01" in output
        backs = [line.strip() for line in output.splitlines() if "back after" in line]
        print(
            f"\nmove to a refused build and its rollback: {took:.1f} s (deploy, 2 reboots, "
            f"checks); reboots: {backs}"
        )
        assert box_sh("cat /sys/module/nvidia/version", box=3).strip() == "570.211.01"
        assert box_sh("cat /proc/sys/kernel/random/boot_id", box=3) != boot
        assert box_sh(versions, box=3) == before
        assert box_sh("apt-mark showhold", box=3) == holds  # held as before the move
        assert box_sh("systemctl is-active gpubox-llama-server", box=3).strip() == "active"
        start = time.monotonic()
        checks = demo.checks(extra=("-m", "quick", "-k", f"{name}:"))
        print(f"host checks after the rollback: {time.monotonic() - start:.1f} s")
        assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]
        again = demo.deploy(extra=("--limit", name))
        assert again.rc == 0 and again.no_change, again.changed_names
        print(f"deploy at 570 after the rollback: {again.seconds:.1f} s, changed nothing")
    finally:
        demo.sandbox("fault", "clear", check=False)


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


# Issue 31 E: the fleet watched by itself. The same three boxes, deployed again with
# inventories/sandbox_monitoring.py (inventories/sandbox.py's hosts with the monitoring keys
# on top): box 1 the monitor (the real Prometheus, Alertmanager and node exporter from Debian's
# packages), every box's exporters bridged into box 1's namespace (gpubox.sandbox.fleet), a
# scrape and rule evaluation every 3 s and a fast watchdog (the keys, not code paths). Faults
# are planted on box 3 together when they do not hide each other, and each alert's time to
# fire and to clear is printed. Box 2 (the T4 that serves nothing) fires no backend alert.
# The tests run in this order on what the earlier ones left: the dashboard's queries read the
# requests the clean-fleet test sent.
MONITORING_INVENTORY = "inventories/sandbox_monitoring.py"
PROMETHEUS = "http://127.0.0.1:9090"
INTERVAL_S = 3  # the inventory's monitoring_interval
ALERT_BUDGET_S = 180  # each planted fault fires within 3 minutes, and clears within 3
BOX3 = BOXES[2]
# Box 1, 2 and 3's scrape targets: the node exporter and dcgm-exporter everywhere, the
# backend's /metrics where a backend serves (not box 2).
TARGETS = 8
# The sandbox's boxes run driver 570, which NVIDIA's tables no longer list (catalog.yml:
# "unlisted since the 615 edition", eol null): gpubox reports it past its end of life, as it
# would for a real box on 570. Every other alert is a fault.
EXPECTED_ON_A_CLEAN_FLEET = {"DriverBranchEndOfLife"}
BACKEND_ALERTS = {"BackendDown", "BackendHung", "RequestsFailing", "OutputTokensPerSecondLow"}


def prometheus(path: str, **params: str) -> dict:
    """GET Prometheus's HTTP API on box 1 (the monitor) with the box's real curl."""
    args = " ".join(f"--data-urlencode {shlex.quote(f'{k}={v}')}" for k, v in params.items())
    out = box_sh(f"curl -sfG -m 10 {args} {PROMETHEUS}{path}", box=1)
    reply = json.loads(out)
    assert reply["status"] == "success", reply
    return reply["data"]


def firing() -> set[tuple[str, str]]:
    """(alertname, host) of every alert firing now."""
    return {
        (a["labels"]["alertname"], a["labels"].get("host", ""))
        for a in prometheus("/api/v1/alerts")["alerts"]
        if a["state"] == "firing"
    }


def unexpected(alerts: set[tuple[str, str]]) -> set[tuple[str, str]]:
    return {(name, host) for name, host in alerts if name not in EXPECTED_ON_A_CLEAN_FLEET}


def watch(want: dict[str, tuple[bool, float]], budget: float = ALERT_BUDGET_S) -> dict[str, float]:
    """Poll box 3's alerts until each alert of ``want`` is firing (True) or not (False);
    ``want``: alert -> (firing, since when: a time.monotonic()). Returns the seconds each took
    from its own start; fails naming the alerts still waiting after ``budget`` seconds."""
    took: dict[str, float] = {}
    while True:
        now = set(name for name, host in firing() if host == BOX3)
        for name, (should_fire, since) in want.items():
            if name not in took and (name in now) == should_fire:
                took[name] = time.monotonic() - since
        waiting = [n for n, (_, since) in want.items() if n not in took]
        if not waiting:
            return took
        late = [n for n in waiting if time.monotonic() - want[n][1] > budget]
        assert not late, f"{late} not {'firing' if want[late[0]][0] else 'cleared'} within " \
            f"{budget:.0f} s; firing now: {sorted(now)}"  # fmt: skip
        time.sleep(1)


def report(what: str, took: dict[str, float]) -> None:
    print("\n" + "; ".join(f"{name} {what} in {seconds:.0f} s" for name, seconds in took.items()))


def fault(name: str, *extra: str) -> float:
    """Plant (or with --off take back) a fault on box 3; returns when it was planted."""
    at = time.monotonic()
    demo.sandbox("fault", name, *extra, "--box", "3")
    return at


def test_monitoring_deploys_on_every_box_and_a_rerun_changes_nothing():
    from concurrent.futures import ThreadPoolExecutor

    from gpubox import sandbox

    start = time.monotonic()

    def load(k: int) -> str:  # the stand-in dcgm-exporter's image, into box k's Docker
        return sandbox.load_exporter_image(sandbox.box_info(sandbox.state_dir(k)))

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(load, (1, 2, 3)))
    images_s = time.monotonic() - start
    run = demo.deploy(inventory=MONITORING_INVENTORY)
    assert run.rc == 0 and not run.failed_hosts, run.output[-4000:]
    again = demo.deploy(inventory=MONITORING_INVENTORY)
    print(
        f"\nstand-in exporter images {images_s:.1f} s; monitoring deploy of 3 boxes: "
        f"{run.seconds:.1f} s; again: {again.seconds:.1f} s"
    )
    assert again.no_change, again.changed_names


def test_a_clean_fleet_fires_no_alert():
    """Every target up (the deploy waited for each one's first scrape) and, after a few
    requests to box 1 (for the dashboard's rates, next) and two more evaluations, nothing
    pending or firing but the end-of-life note."""
    targets = [
        t
        for t in prometheus("/api/v1/targets")["activeTargets"]
        if t["labels"]["job"] in ("node", "dcgm", "backend")
    ]
    down = [(t["labels"].get("host"), t["labels"]["job"]) for t in targets if t["health"] != "up"]
    assert len(targets) == TARGETS and not down, (len(targets), down)
    jobs = {(t["labels"]["host"], t["labels"]["job"]) for t in targets}
    assert (BOXES[1], "backend") not in jobs and (BOXES[2], "backend") in jobs
    bench_box_1()
    time.sleep(2 * INTERVAL_S + 1)  # two scrapes and evaluations after the requests
    alerts = prometheus("/api/v1/alerts")["alerts"]
    assert not unexpected({(a["labels"]["alertname"], a["labels"]["host"]) for a in alerts}), [
        (a["labels"], a["state"]) for a in alerts
    ]
    # the stand-in exporter's values are box 3's own: two V100s, every NVLink healthy
    temps = prometheus("/api/v1/query", query=f'DCGM_FI_DEV_GPU_TEMP{{host="{BOX3}"}}')
    assert len(temps["result"]) == 2
    t4 = prometheus("/api/v1/query", query=f'DCGM_FI_DEV_GPU_TEMP{{host="{BOXES[1]}"}}')
    assert [r["metric"]["modelName"] for r in t4["result"]] == ["Tesla T4"]


def bench_box_1() -> None:
    """Three short requests to box 1's API with `gpubox bench`, as a user sends them."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        box1 = f"{tmp}/box1.py"
        with open(box1, "w", encoding="utf-8") as f:
            f.write(
                "import runpy\n"
                f"hosts = [h for h in runpy.run_path({str(demo.ROOT / MONITORING_INVENTORY)!r})"
                f"['hosts'] if h[0] == {BOXES[0]!r}]\n"
            )
        bench = [str(demo.BIN / "gpubox"), "bench", "--inventory", box1, "--concurrency", "1"]
        bench += ["--requests", "3", "--prompt-tokens", "32", "--max-tokens", "32"]
        rc, _, output = demo.stream(demo.in_netns(bench), merged=True)
    assert rc == 0, output[-3000:]


def test_every_gpu_and_llamacpp_panel_of_the_dashboard_returns_series():
    """Issue 31 D, evaluated against the sandbox's real Prometheus: each GPU and llama.cpp
    panel's query returns series (box 1 served the clean-fleet test's requests)."""
    from gpubox.knowledge import dashboard  # helper D's query extraction

    board = dashboard.load()
    queries = dashboard.queries(board, "gpu") + dashboard.queries(board, "llamacpp", BOXES[0])
    assert queries
    empty = [
        (title, expr)
        for title, expr in queries
        if not prometheus("/api/v1/query", query=expr)["result"]
    ]
    assert not empty, empty


def test_each_fault_on_box_3_fires_its_alert_and_clears_within_three_minutes():
    """Faults that do not hide each other go together. Box 3 cut off hides every other
    alert of it, so it goes first, alone, and doctor runs while it fires (doctor reaches box 1
    and 2, says box 3 is unreachable and shows its alert from the monitor). The next faults
    are planted as soon as it is back, while BoxDown clears: NVLink down, the model volume
    filled and the server frozen again after each restart (a frozen server's /metrics does
    not answer either: BackendDown). Once those have cleared, a GPU missing (which takes its
    NVLink links down too, so not with nvlink-down) and the backend stopped (the watchdog
    passes no probe while it is stopped: BackendHung would hold). The rules' for: count
    evaluations (monitoring_interval 3 s: for 1m is 6s)."""
    start = time.monotonic()
    fired: dict[str, float] = {}
    cleared: dict[str, float] = {}
    try:
        t_cut = fault("unreachable")
        fired.update(watch({"BoxDown": (True, t_cut)}))
        doctor = doctor_json(MONITORING_INVENTORY, codes=(3,))  # 3: a host unreachable
        t0 = fault("unreachable", "--off")
        for name in ("nvlink-down", "volume-full", "server-frozen"):
            fault(name)
        took = watch(
            {
                "BoxDown": (False, t0),
                **{a: (True, t0) for a in ("NvlinkDown", "ModelVolumeFull", "BackendHung")},
            }
        )
        cleared["BoxDown"] = took.pop("BoxDown")
        fired.update(took)
        restarts = prometheus(
            "/api/v1/query", query=f'gpubox_watchdog_restarts_total{{host="{BOX3}"}}'
        )["result"]
        t1 = time.monotonic()
        for name in ("nvlink-down", "volume-full", "server-frozen"):
            fault(name, "--off")
        took = watch(
            {a: (False, t1) for a in ("NvlinkDown", "ModelVolumeFull", "BackendHung")}
            | {"BackendDown": (False, t1)}  # the frozen server's, if it fired
        )
        cleared.update((k, v) for k, v in took.items() if k != "BackendDown")
        t2 = fault("gpu-missing")
        box_sh("systemctl stop gpubox-llama-server", box=3)
        fired.update(watch({"GpuMissing": (True, t2), "BackendDown": (True, t2)}))
        t3 = fault("gpu-missing", "--off")
        box_sh("systemctl start gpubox-llama-server", box=3)
        cleared.update(watch({"GpuMissing": (False, t3), "BackendDown": (False, t3)}))
    finally:
        demo.sandbox("fault", "clear", "--box", "3", check=False)
        box_sh("systemctl start gpubox-llama-server", box=3, check=False)
    report("fired", fired)
    report("cleared", cleared)
    print(f"all faults, fired and cleared: {time.monotonic() - start:.0f} s")
    # the frozen server was restarted again and again (BackendHung counts two in an hour)
    assert restarts and float(restarts[0]["value"][1]) >= 2, restarts
    # doctor, box 3 cut off: box 3 unreachable, its BoxDown shown from the monitor; nothing
    # unexpected on boxes 1 and 2
    unreachable = {row["host"] for row in doctor["hosts"] if row.get("unreachable")}
    assert unreachable == {BOX3}, doctor["hosts"]
    alerts = doctor_alerts(doctor)
    assert "BoxDown" in alerts.get(BOX3, set()), alerts
    assert not alerts.get(BOXES[0], set()) - EXPECTED_ON_A_CLEAN_FLEET, alerts
    assert not alerts.get(BOXES[1], set()) - EXPECTED_ON_A_CLEAN_FLEET, alerts


def doctor_alerts(report: dict) -> dict[str, set[str]]:
    """Host -> the names of the alerts doctor shows firing for it (its JSON's per-host
    "alerts": {"monitor", "firing": [{"alert": NAME, ...}], "error"})."""
    found: dict[str, set[str]] = {}
    for row in report["hosts"]:
        view = row.get("alerts") or {}
        assert view.get("error") is None, view
        found[row["host"]] = {a["alert"] for a in view.get("firing") or []}
    return found


def test_box_2_which_serves_nothing_never_fired_a_backend_alert():
    names = "|".join(sorted(BACKEND_ALERTS))
    query = f'count_over_time(ALERTS{{host="{BOXES[1]}",alertname=~"{names}"}}[1h])'
    assert prometheus("/api/v1/query", query=query)["result"] == []
    # ... while box 3's did fire (the query can see them)
    query = query.replace(BOXES[1], BOX3)
    assert prometheus("/api/v1/query", query=query)["result"] != []
