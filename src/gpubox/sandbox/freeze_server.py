#!/usr/bin/python3
"""A fault of the sandbox (issue 31 E), never shipped to a real box: the API server frozen,
again and again. It runs IN the box (python3, standard library only), as the transient unit
``gpubox-standin-freeze-server`` that ``gpubox sandbox fault server-frozen`` starts.

Every TICK_S it reads the main PID of the unit gpubox's watchdog watches (``unit`` in the
watchdog's settings, /etc/gpubox/watchdog.json) and, once a start of it answers ``GET
/health`` with 200 at the watchdog's ``url``, freezes that process (SIGSTOP), as a server
that hangs after its load: it holds its port and answers nothing. The watchdog restarts the
unit (systemd sends SIGCONT after SIGTERM to a stopped process); the new process is frozen in
turn as soon as it answers healthy, so the watchdog restarts it again and again. It stops on
SIGTERM (``systemctl stop``, ``fault server-frozen --off``, ``fault clear``) or after MAX_S,
and then lets the last process it froze go on (SIGCONT)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

CONFIG = "/etc/gpubox/watchdog.json"
TICK_S = 0.5
MAX_S = 3600.0
HEALTH_TIMEOUT_S = 2.0

_stop = False


def main_pid(unit):
    """The unit's main PID (0: not running)."""
    out = subprocess.run(
        ["systemctl", "show", "-p", "MainPID", "--value", unit],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return int(out) if out.isdigit() else 0


def healthy(base):
    try:
        with urllib.request.urlopen(base + "/health", timeout=HEALTH_TIMEOUT_S) as reply:
            return reply.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def step(unit, base, frozen, read_pid=main_pid, is_healthy=healthy, kill=os.kill):
    """One look: freeze a new process of ``unit`` that answers healthy; returns the PID
    frozen last."""
    pid = read_pid(unit)
    if pid and pid != frozen and is_healthy(base):
        kill(pid, signal.SIGSTOP)
        print(f"froze {unit} (pid {pid}) after it answered /health 200", flush=True)
        return pid
    return frozen


def on_signal(signum, frame):
    global _stop
    _stop = True


def main(argv):
    with open(argv[0] if argv else CONFIG, encoding="utf-8") as f:
        settings = json.load(f)
    unit, base = settings["unit"], settings["url"].rstrip("/")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    frozen = 0
    deadline = time.monotonic() + MAX_S
    try:
        while not _stop and time.monotonic() < deadline:
            frozen = step(unit, base, frozen)
            time.sleep(TICK_S)
    finally:
        if frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGCONT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
