"""The sandbox integration tier: a fresh box per test module, stopped after it, except the
SHARED_BOX modules, which run first, in that order, on one box."""

from __future__ import annotations

import json
import os
import time

import pytest

from gpubox import sandbox
from gpubox.commands import demo
from gpubox.sandbox.standin import state as standin_state

STATE_PATH = "/var/lib/gpubox-standin/state.json"


def box_sh(command: str, stdin: str | None = None, check: bool = True, box: int = 1) -> str:
    """Run a shell command in the box (box ``box`` of a fleet); return its stdout."""
    info = sandbox.box_info(sandbox.state_dir(box))
    proc = sandbox.ssh(command, check=False, input=stdin, info=info)
    if check and proc.returncode != 0:
        raise AssertionError(f"in the box: {command!r} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


def plant(change, box: int = 1) -> None:
    """Edit the stand-in GPUs' state in the box (box ``box``): change(state) -> None."""
    state = json.loads(box_sh(f"cat {STATE_PATH}", box=box))
    change(state)
    box_sh(
        f"cat > {STATE_PATH}.new && mv {STATE_PATH}.new {STATE_PATH}",
        stdin=standin_state.dumps_state(state),
        box=box,
    )


@pytest.fixture(scope="module")
def sandbox_box():
    demo.sandbox("down", check=False)
    demo.sandbox("up")
    yield
    demo.sandbox("down", check=False)


# Modules that share one box: they run first, in this order, before every other module (each
# other module boots a fresh box of its own). The first converges the box with its first
# test; each leaves the box converged for the next (a fault it plants, it takes back), and
# the next starts with a deploy that finds nothing to do. A first deploy costs about 100 s
# of this 2-core machine; a deploy that changes nothing, about 15.
SHARED_BOX = ("test_doctor.py", "test_repair.py")


@pytest.fixture(scope="session")
def shared_box():
    demo.sandbox("down", check=False)
    demo.sandbox("up")
    yield
    demo.sandbox("down", check=False)


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        name = item.path.name
        return SHARED_BOX.index(name) if name in SHARED_BOX else len(SHARED_BOX)

    items.sort(key=rank)  # stable: file order within each module and among the others


# ---------------------------------------------------------------- where the tier's time goes
#
# pytest --durations gives wall time only, and `time make test` counts the harness's own
# processes (pytest, pyinfra, ssh) but not the boxes', whose processes are not its children.
# Per module this records the wall time, the CPU the harness used, the CPU the sandbox used
# (each box's process tree and its servers, while its tests ran), the CPU the whole machine
# was busy and the CPU the hypervisor took from it (steal): a slow run on a machine busy with
# other work shows as "other" and steal, a slower deploy as more sandbox CPU.

_HZ = os.sysconf("SC_CLK_TCK")
_TIMES: dict[str, dict[str, float]] = {}


def _machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since it booted (/proc/stat)."""
    with open("/proc/stat", encoding="ascii") as handle:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (
            int(x) for x in handle.readline().split()[1:9]
        )
    return (user + nice + system + irq + softirq) / _HZ, steal / _HZ


def _proc_table() -> dict[int, tuple[int, int, float]]:
    """pid -> (parent pid, start time, CPU seconds of it and its reaped children)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        cpu = sum(int(x) for x in fields[11:15]) / _HZ  # utime stime cutime cstime
        table[int(name)] = (int(fields[1]), int(fields[19]), cpu)
    return table


def _sandbox_cpu() -> dict[tuple[int, int], float]:
    """CPU seconds of each sandbox process tree that is up now, by (pid, start time) of its
    root: each box's supervisor (nspawn and the box below it) and its servers."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    trees: dict[tuple[int, int], float] = {}
    try:
        infos = sandbox.box_infos()
    except Exception:  # a box.json being rewritten: this measurement never fails a test
        return trees
    for info in infos:
        for record in info.get("processes", {}).values():
            if not record or record.get("pid") in seen:
                continue
            root = table.get(record["pid"])
            if root is None or root[1] != record.get("start_time"):
                continue
            total, stack = 0.0, [record["pid"]]
            while stack:
                pid = stack.pop()
                if pid in seen or pid not in table:
                    continue
                seen.add(pid)
                total += table[pid][2]
                stack += children.get(pid, [])
            trees[(record["pid"], record["start_time"])] = total
    return trees


def _cpu_speed() -> float:
    """A fixed piece of work (a Python loop) per CPU second of this process, in millions of
    iterations: how fast the machine's CPU is now, apart from waiting for it (a slower machine
    makes every deploy slower without any change to the code)."""
    start = time.process_time()
    total = 0
    for i in range(2_000_000):
        total += i
    return 2.0 / max(time.process_time() - start, 1e-6)


_SPEED: list[float] = []


def pytest_sessionstart(session):
    _SPEED.append(_cpu_speed())


def _harness_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    row = _TIMES.setdefault(item.nodeid.split("::")[0], {})
    busy, steal, harness, wall = *_machine_cpu(), _harness_cpu(), time.monotonic()
    yield
    busy1, steal1 = _machine_cpu()
    for key, value in (
        ("wall", time.monotonic() - wall),
        ("harness", _harness_cpu() - harness),
        ("busy", busy1 - busy),
        ("steal", steal1 - steal),
    ):
        row[key] = row.get(key, 0.0) + value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    # the boxes are up while a test runs (its module's fixture boots them before the first
    # and stops them after the last); a tree that ends during the test counts up to its start
    before = _sandbox_cpu()
    yield
    after = _sandbox_cpu()
    row = _TIMES.setdefault(item.nodeid.split("::")[0], {})
    used = sum(cpu - before.get(key, 0.0) for key, cpu in after.items())
    row["sandbox"] = row.get("sandbox", 0.0) + used


def pytest_terminal_summary(terminalreporter):
    if not _TIMES:
        return
    cores = os.cpu_count() or 1
    write = terminalreporter.write_line
    terminalreporter.section("sandbox tier: where the time went (seconds)")
    speeds = [*_SPEED, _cpu_speed()]
    write(
        "CPU speed (a Python loop, millions of iterations per CPU second): "
        + " at the start, ".join(f"{v:.1f}" for v in speeds)
        + " at the end"
    )
    write(
        f"{'module':44} {'wall':>7} {'harness':>8} {'sandbox':>8} {'other':>7} {'steal':>7}"
        f" {'idle':>7}   (CPU s; {cores} cores)"
    )
    total: dict[str, float] = {}
    for module, row in [*_TIMES.items(), ("total", total)]:
        if module != "total":
            for key, value in row.items():
                total[key] = total.get(key, 0.0) + value
        wall = row.get("wall", 0.0)
        harness, box, busy = row.get("harness", 0.0), row.get("sandbox", 0.0), row.get("busy", 0.0)
        other = busy - harness - box
        idle = wall * cores - busy - row.get("steal", 0.0)
        write(
            f"{module[-44:]:44} {wall:7.1f} {harness:8.1f} {box:8.1f} {other:7.1f}"
            f" {row.get('steal', 0.0):7.1f} {idle:7.1f}"
        )
