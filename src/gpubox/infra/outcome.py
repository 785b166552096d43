"""What a deploy run tells `gpubox deploy` beyond pyinfra's exit status: which hosts stopped
on purpose, waiting for their owner (a Secure Boot key to enroll, a reboot to consent to:
gpubox.base.errors.HostStopped), and which hosts failed.

`gpubox deploy` sets GPUBOX_OUTCOME_FILE for the pyinfra run; the deploy records each stopped
host, and at exit writes {"stopped": [...], "failed": [...]} there. `gpubox deploy` then exits
4 (reach.WAITING) when every failed host is one that stopped on purpose, else 1. A plain
`pyinfra` run sets no file and writes nothing.
"""

from __future__ import annotations

import atexit
import json
import os

from gpubox.remote import reach

ENV = "GPUBOX_OUTCOME_FILE"
_stopped: set[str] = set()
_registered = False


def stopped(host_name: str) -> None:
    """Record that this host's deploy stopped on purpose (and write the file at exit)."""
    global _registered
    _stopped.add(host_name)
    if not _registered and os.environ.get(ENV):
        atexit.register(write)
        _registered = True


def write() -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    failed: list[str] = []
    try:
        from pyinfra.context import ctx_state  # off `gpubox deploy`, which runs pyinfra as a child

        if ctx_state.isset():
            failed = sorted(h.name for h in ctx_state.get().failed_hosts)
    except Exception:  # noqa: BLE001 - without it, gpubox deploy says 1, as pyinfra does
        failed = []
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"stopped": sorted(_stopped), "failed": failed}, f)
    except OSError:
        pass


def exit_code(path: str, rc: int) -> int:
    """gpubox deploy's exit code from pyinfra's ``rc`` and the outcome file at ``path``."""
    if rc == 0:
        return reach.OK
    if rc == 2:
        return reach.BAD_INPUT  # pyinfra (click) refused an option: nothing ran
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        stopped, failed = set(data["stopped"]), set(data["failed"])
    except (OSError, ValueError, KeyError, TypeError):
        return reach.DEVIATES
    if stopped and failed and failed <= stopped:
        return reach.WAITING
    return reach.DEVIATES


def failed_hosts(path: str) -> list[str]:
    """The hosts the run at ``path`` failed (none when it wrote no file)."""
    try:
        with open(path, encoding="utf-8") as f:
            return sorted(str(name) for name in json.load(f)["failed"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
