"""A fresh server's first boot and a killed deploy, on the sandbox box: dpkg's lock held by a
real process refuses the run (nothing changed) past apt_lock_timeout, or is waited for and the
deploy converges; a deploy killed while dpkg unpacks the driver leaves dpkg interrupted, and
the next run finishes dpkg's work by itself, converges and passes the host checks. The tests
run in order on one box."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import box_sh

from gpubox.commands import demo
from gpubox.preflight import dpkg_ready as dr

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sandbox_box")]

FRONTEND = "/var/lib/dpkg/lock-frontend"
# What a refused run must leave as it was: the packages, dpkg's database and journal, /etc.
SNAPSHOT = (
    "set -o pipefail; dpkg -l | sha256sum; sha256sum /var/lib/dpkg/status; "
    "ls -A /var/lib/dpkg/updates; "
    "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum"
)
LOCK_UNIT = "gpubox-test-dpkg-lock"
KILLER_UNIT = "gpubox-test-dpkg-killer"
KILLED = "/run/gpubox-test-dpkg-killed"

# Freeze dpkg (SIGSTOP) while it unpacks one of the NVIDIA driver's packages, and record its
# PID and its apt-get's. A shell
# loop in the box: over SSH a poll would miss an unpack that takes a second. The test then
# kills pyinfra, dpkg and apt-get with SIGKILL, as a killed deploy leaves them.
KILLER = r"""
end=$(( $(date +%s) + $1 ))
while [ "$(date +%s)" -lt "$end" ]; do
  for d in /proc/[0-9]*; do
    { read -r c < "$d/comm"; } 2>/dev/null || continue
    [ "$c" = dpkg ] || continue
    a=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)
    case "$a" in *--unpack*) ;; *) continue ;; esac
    # apt hands dpkg many packages as a directory of links (--recursive DIR)
    debs="$a $(ls /tmp/apt-dpkg-install-* 2>/dev/null | tr '\n' ' ')"
    case "$debs" in *nvidia*) ;; *) continue ;; esac
    # dpkg's latest journal entry marks a package it is unpacking "reinstreq": the worst
    # moment, when dpkg itself refuses to configure the package afterwards
    last=$(ls /var/lib/dpkg/updates/0* 2>/dev/null | tail -n 1)
    [ -n "$last" ] && grep -q reinstreq "$last" 2>/dev/null || continue
    p=${d#/proc/}
    pp=$(awk '{print $4}' "$d/stat")
    kill -STOP "$p"
    printf '%s\t%s\t%s\n' "$p" "$pp" "$debs" > KILLED
    exit 0
  done
  sleep 0.02
done
exit 1
""".replace("KILLED", KILLED)


def lock_status() -> dr.LockStatus:
    return dr.parse_locks(box_sh(f"{dr.locks_command()}; true").splitlines())


def dpkg_state() -> dr.DpkgState:
    return dr.parse_dpkg_state(box_sh(dr.dpkg_state_command()).splitlines())


def start_unit(unit: str, command: str) -> None:
    box_sh(f"systemctl stop {unit} 2>/dev/null; true")
    box_sh(f"systemd-run --unit={unit} --collect --quiet {command}")


def wait_for_holder(lock: str, comm: str, timeout: float = 120) -> dr.Holder:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for holder in lock_status().holders:
            if holder.lock == lock and holder.comm == comm:
                return holder
        time.sleep(0.5)
    raise AssertionError(f"no {comm} took {lock} in {timeout:.0f} s: {lock_status().describe()}")


def report(capsys, text: str) -> None:
    with capsys.disabled():
        print(f"\n{text}")


def test_a_lock_held_past_apt_lock_timeout_refuses_the_run_and_changes_nothing(capsys):
    before = box_sh(SNAPSHOT)
    start_unit(
        LOCK_UNIT,
        "python3 -c \"import fcntl, time; f = open('/var/lib/dpkg/lock-frontend', 'w'); "
        'fcntl.lockf(f, fcntl.LOCK_EX); time.sleep(300)"',
    )
    try:
        holder = wait_for_holder(FRONTEND, "python3")
        run = demo.deploy(extra=("--data", "apt_lock_timeout=5"))
    finally:
        box_sh(f"systemctl stop {LOCK_UNIT} 2>/dev/null; true")
    assert run.rc != 0
    assert "dpkg is busy, nothing was changed:" in run.output, run.output[-3000:]
    assert "gpubox-sandbox: apt_lock_timeout: dpkg is still busy after 5 s" in run.output
    assert f"{FRONTEND} held by PID {holder.pid} (python3: " in run.output
    assert "raise apt_lock_timeout (now 5 s) in the inventory" in run.output
    assert "Starting operation" not in run.output
    assert box_sh(SNAPSHOT) == before
    refusal = next(line for line in run.output.splitlines() if "apt_lock_timeout:" in line)
    report(capsys, f"refused after {run.seconds:.0f} s:{refusal}")


def test_first_deploy_waits_for_apt_holding_dpkgs_lock_then_converges(capsys):
    # What a fresh server does on its first boot: apt-daily refreshes the lists, then
    # unattended-upgrades holds dpkg's lock while it installs (here for 45 s).
    start_unit(
        LOCK_UNIT,
        "sh -c \"apt-get update -qq && apt-get -y -o 'DPkg::Pre-Invoke::=sleep 45' "
        'install --reinstall kmod"',
    )
    holder = wait_for_holder(FRONTEND, "apt-get")
    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    progress = [line.strip() for line in run.output.splitlines() if "waiting for dpkg:" in line]
    assert progress, run.output[-3000:]
    assert f"{FRONTEND} held by PID {holder.pid} (apt-get: apt-get -y -o " in progress[0]
    free = re.search(r"dpkg is free after (\d+) s", run.output)
    assert free, run.output[-3000:]
    waited = int(free.group(1))
    assert 20 <= waited <= 120
    assert box_sh(f"cat {dr.CONF_FILE}").splitlines()[-1] == 'DPkg::Lock::Timeout "900";'
    assert box_sh("dpkg-query -W -f='${db:Status-Abbrev}' kmod").strip() == "ii"
    report(
        capsys,
        f"first boot: the deploy waited {waited} s for dpkg's lock, then converged "
        f"({run.seconds:.0f} s in all); it printed:\n  " + "\n  ".join(progress),
    )


def pyinfra_pid(pid: int) -> int:
    """The pyinfra process the deploy's wrapper (ip netns exec) became or started."""
    todo = [pid]
    while todo:
        each = todo.pop(0)
        try:
            cmdline = Path(f"/proc/{each}/cmdline").read_bytes().split(b"\0")
            children = Path(f"/proc/{each}/task/{each}/children").read_text().split()
        except OSError:
            continue
        if any(arg.endswith(b"/pyinfra") for arg in cmdline):
            return each
        todo += [int(c) for c in children]
    raise AssertionError(f"no pyinfra process under PID {pid}")


def test_a_deploy_killed_while_the_driver_unpacks_is_recovered_by_the_next_run(capsys):
    # The box runs the pinned driver: put the 580 stand-ins in, so that the deploy unpacks
    # the 570 packages again (the drift test's careless `apt install`).
    packages = box_sh(
        "dpkg-query -W -f='${Package} ${Version}\\n' | awk '$2 ~ /^570\\.211\\.01-/ {print $1}'"
    ).split()
    assert len(packages) >= 5, packages
    box_sh("apt-mark unhold " + " ".join(packages))
    box_sh(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "
        + " ".join(f"{p}=580.105.08-1" for p in packages)
    )
    box_sh(f"rm -f {KILLED} && cat > /run/gpubox-test-killer.sh", stdin=KILLER)
    start_unit(KILLER_UNIT, "sh /run/gpubox-test-killer.sh 900")

    argv = demo.in_netns(
        [str(demo.BIN / "pyinfra"), "-y", "--json", demo.INVENTORY, "deploy/full.py"]
    )
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            argv, cwd=demo.ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            killed = ""
            deadline = time.monotonic() + 900
            while not killed and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
                killed = box_sh(f"cat {KILLED} 2>/dev/null; true").strip()
            alive = proc.poll() is None
            if alive:
                os.kill(pyinfra_pid(proc.pid), signal.SIGKILL)  # the deploy is killed
            if killed:  # and dpkg, mid-unpack, with the apt-get that ran it
                dpkg_pid, apt_pid, debs = killed.split("\t")
                box_sh(f"kill -9 {dpkg_pid} {apt_pid}")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            box_sh(f"systemctl stop {KILLER_UNIT} 2>/dev/null; true")
        log.seek(0)
        output = log.read()
    assert killed, f"dpkg's unpack of the driver was never caught:\n{output[-3000:]}"
    assert alive, f"the deploy ended before it was killed:\n{output[-3000:]}"

    interrupted = dpkg_state()
    assert interrupted.interrupted and interrupted.journal, interrupted
    apt = box_sh("apt-get install -y kmod 2>&1; true")
    assert "dpkg was interrupted, you must manually run 'dpkg --configure -a'" in apt

    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    recovered = [n for n in run.changed_names if "Finish dpkg's interrupted run" in n]
    assert len(recovered) == 1 and run.changed_names[0] == recovered[0], run.changed_names
    assert not dpkg_state().interrupted
    demo.load_check_image()  # the GPU containers' image, imported (never from a registry)
    checks = demo.checks()
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]

    again = demo.deploy()
    assert again.no_change, f"changed: {again.changed_names}\n{again.output[-2000:]}"
    report(
        capsys,
        f"killed the deploy, dpkg (PID {dpkg_pid}) and its apt-get (PID {apt_pid}) while dpkg "
        f"unpacked {len(re.findall(r'nvidia', debs))} NVIDIA package file(s); the box was left "
        f"with "
        f"{interrupted.describe()}; the next deploy ran {recovered[0]!r} first and converged "
        f"({run.seconds:.0f} s); host checks: {checks.passed} passed; a further deploy "
        "changed nothing",
    )
