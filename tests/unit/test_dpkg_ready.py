"""dpkg ready: who holds dpkg's locks (the real shell command against real fcntl locks on
temporary files), the bounded wait and its refusal, and what counts as an interrupted dpkg."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpubox.base.errors import DeployRefused
from gpubox.preflight import dpkg_ready as dr

HOLD = (
    "import fcntl, sys, time\n"
    "f = open(sys.argv[1], 'w')\n"
    "fcntl.lockf(f, fcntl.LOCK_EX)\n"  # F_SETLKW: blocks while another process holds it
    "print('locked', flush=True)\n"
    "time.sleep(60)\n"
)


def holder(path: Path) -> subprocess.Popen[str]:
    """A process holding an fcntl write lock on ``path``, as apt and dpkg take theirs."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def probe(*paths: Path) -> dr.LockStatus:
    command = dr.locks_command(tuple(str(p) for p in paths))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    return dr.parse_locks(out.stdout.splitlines())


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()


def test_the_process_holding_an_fcntl_lock_is_named_by_pid_and_command(tmp_path):
    lock, other = tmp_path / "lock-frontend", tmp_path / "lock"
    lock.touch()
    other.touch()
    assert not probe(lock, other).busy
    proc = holder(lock)
    try:
        status = probe(lock, other, tmp_path / "absent")
        assert [(h.lock, h.pid) for h in status.holders] == [(str(lock), proc.pid)]
        assert status.holders[0].comm.startswith("python")
        assert "fcntl.lockf" in status.holders[0].cmdline
        assert status.describe() == f"{lock} held by {status.holders[0]}"
        assert f"PID {proc.pid} (python" in status.describe()
    finally:
        stop(proc)
    assert not probe(lock, other).busy


def test_a_process_waiting_for_the_lock_is_not_its_holder(tmp_path):
    lock = tmp_path / "lock-frontend"
    lock.touch()
    first = holder(lock)
    waiter = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE)
    try:
        # The waiter shows in /proc/locks as a blocked request ("->"), not as a holder.
        deadline = time.monotonic() + 10
        while "->" not in Path("/proc/locks").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "->" in Path("/proc/locks").read_text()
        assert [h.pid for h in probe(lock).holders] == [first.pid]
    finally:
        stop(waiter)
        stop(first)


def test_an_flock_lock_does_not_count_it_never_blocks_apt(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    with lock.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        assert not probe(lock).busy


def test_parse_locks_reads_holders_and_running_apt_units():
    status = dr.parse_locks(
        [
            "held\t/var/lib/dpkg/lock-frontend\t812\tunattended-upgr\t/usr/bin/python3 "
            "/usr/bin/unattended-upgrade --download-only",
            "held\t/var/lib/dpkg/lock-frontend\t812\tunattended-upgr\t/usr/bin/python3 "
            "/usr/bin/unattended-upgrade --download-only",
            "held\t/var/lib/dpkg/lock\t0\t\t",
            "unit\tapt-daily.service\tinactive",
            "unit\tapt-daily-upgrade.service\tactivating",
            "garbage line",
        ]
    )
    assert [h.pid for h in status.holders] == [812, 0]
    assert status.units == ("apt-daily-upgrade.service",)
    assert status.describe() == (
        "/var/lib/dpkg/lock-frontend held by PID 812 (unattended-upgr: /usr/bin/python3 "
        "/usr/bin/unattended-upgrade --download-only); /var/lib/dpkg/lock held by a process "
        "outside this PID namespace; apt-daily-upgrade.service running"
    )
    idle = dr.parse_locks(["unit\tapt-daily.service\tinactive", "unit\tapt-daily.service\t"])
    assert not idle.busy and idle.describe() == "free"


HELD = dr.LockStatus(
    (dr.Holder("/var/lib/dpkg/lock-frontend", 812, "apt-get", "apt-get install -y vim"),)
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


def test_wait_returns_at_once_when_dpkg_is_free():
    logs: list[str] = []
    clock = Clock()
    waited = dr.wait_until_free(
        "box", 900, lambda: dr.LockStatus(), logs.append, clock, clock.sleep
    )
    assert waited == 0 and logs == []


def test_wait_names_the_holder_every_15_s_then_goes_on_when_it_is_gone():
    clock = Clock()
    logs: list[str] = []
    free_at = clock.now + 44

    def look() -> dr.LockStatus:
        return HELD if clock.now < free_at else dr.LockStatus()

    waited = dr.wait_until_free("box", 900, look, logs.append, clock, clock.sleep)
    assert 44 <= waited <= 47
    progress = [line for line in logs if "waiting for dpkg" in line]
    assert len(progress) == 3  # at 0, 15 and 30 s: not at every poll
    assert progress[0] == (
        "box: waiting for dpkg: /var/lib/dpkg/lock-frontend held by PID 812 "
        "(apt-get: apt-get install -y vim) (0 s of apt_lock_timeout 900 s)"
    )
    assert logs[-1] == f"box: dpkg is free after {waited:.0f} s; the deploy goes on"


def test_wait_refuses_past_apt_lock_timeout_naming_host_lock_holder_and_key():
    clock = Clock()
    logs: list[str] = []
    with pytest.raises(DeployRefused) as refused:
        dr.wait_until_free("gpu-1", 20, lambda: HELD, logs.append, clock, clock.sleep)
    message = str(refused.value)
    assert message.startswith("dpkg is busy, nothing was changed:\n  - gpu-1: apt_lock_timeout:")
    assert "dpkg is still busy after 20 s" in message
    assert "/var/lib/dpkg/lock-frontend held by PID 812 (apt-get: apt-get install -y vim)" in (
        message
    )
    assert "raise apt_lock_timeout (now 20 s) in the inventory" in message
    assert clock.now - 100 == 20  # the last sleep stops at the bound, not past it


def test_apt_lock_timeout_0_refuses_at_once_without_waiting():
    clock = Clock()
    with pytest.raises(DeployRefused):
        dr.wait_until_free("gpu-1", 0, lambda: HELD, lambda _: None, clock, clock.sleep)
    assert clock.now == 100


def test_the_execution_time_wait_gives_up_naming_the_holder(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    proc = holder(lock)
    try:
        command = dr.wait_command(2, interval=1, paths=(str(lock),))
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        assert out.returncode == 1
        assert "dpkg is still busy after 2 s (apt_lock_timeout)" in out.stderr
        assert f"{lock}\t{proc.pid}\tpython" in out.stderr
    finally:
        stop(proc)
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_dpkgs_journal_and_half_done_packages_mean_interrupted():
    state = dr.parse_dpkg_state(
        [
            "journal\t0000",
            "journal\t0001",
            "journal\ttmp.i",  # dpkg's temporary file: apt ignores it too
            "status\tiU \tnvidia-kernel-dkms",
            "status\tiHR\tnvidia-driver-cuda",
            "status\tiF \tnvidia-persistenced",
            "status\tii \tvim",  # installed: never listed, even if the filter let it through
            "status\trc \told-package",
            "audit\tThe following packages are only half configured, probably due to problems",
        ]
    )
    assert state.interrupted
    assert state.journal == ("0000", "0001")
    assert state.unfinished == (
        ("nvidia-kernel-dkms", "unpacked, not configured"),
        ("nvidia-driver-cuda", "reinstall required, half-installed"),
        ("nvidia-persistenced", "half-configured"),
    )
    assert state.describe() == (
        "dpkg's journal holds 2 pending update(s); nvidia-kernel-dkms (unpacked, not "
        "configured), nvidia-driver-cuda (reinstall required, half-installed), "
        "nvidia-persistenced (half-configured)"
    )


def test_a_consistent_dpkg_is_not_interrupted_whatever_audit_says():
    # dpkg --audit also reports things --configure -a cannot fix (a missing md5sums file):
    # acting on them would make every deploy change something.
    state = dr.parse_dpkg_state(
        ["journal\ttmp.ci", "audit\tThe following packages are missing the md5sums control file"]
    )
    assert not state.interrupted
    assert state.describe() == "dpkg is consistent"
    assert not dr.parse_dpkg_state([]).interrupted


def test_triggers_pending_count_as_interrupted():
    assert dr.parse_dpkg_state(["status\tit \tman-db"]).unfinished == (
        ("man-db", "triggers pending"),
    )


def test_recovery_waits_configures_unpacks_again_then_lets_apt_repair():
    commands = dr.recovery_commands(600)
    assert commands[0] == dr.wait_command(600)
    assert commands[1].startswith("DEBIAN_FRONTEND=noninteractive dpkg --configure -a ")
    assert "--force-confold" in commands[1]
    assert commands[2] == dr.REINSTALL
    assert commands[3].startswith(
        "DEBIAN_FRONTEND=noninteractive apt-get -y -o DPkg::Lock::Timeout=600 "
    )
    assert commands[3].endswith(" --allow-downgrades --allow-change-held-packages -f install")
    assert subprocess.run(["sh", "-n", "-c", dr.REINSTALL]).returncode == 0


def test_apts_lock_timeout_file_holds_the_inventorys_bound():
    text = dr.lock_timeout_conf(900)
    settings = [line for line in text.splitlines() if not line.startswith("//")]
    assert settings == ['DPkg::Lock::Timeout "900";']
    assert dr.lock_timeout_conf(-5).endswith('DPkg::Lock::Timeout "0";\n')


def test_apt_update_waits_for_the_lists_lock_first():
    # apt-get update ignores DPkg::Lock::Timeout: the operation waits for its lock itself.
    (command,) = dr.apt_update._inner(30)
    assert command == dr.wait_command(30, paths=("/var/lib/apt/lists/lock",)) + " && apt-get update"
