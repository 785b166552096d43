"""Read ahead: the fact commands a host's last run read, run again in one round trip.

A re-deploy of a converged box spends most of its time in round trips: pyinfra 3 runs one
command per fact read (about 70 in a no-op run), one after the other, while the stages plan
and again while the operations execute. Most of them read a box that nothing has changed yet.

So each run records which fact commands it ran on each host (the command and how it was run:
sudo and the like), and keeps the list on the controller
(``$XDG_CACHE_HOME/gpubox/readahead/<host>.json``, mode 0600). The next run, right after
dpkg's locks are free (``preflight.run``), runs every one of them in one shell on the box
(``fill``) and answers a fact read of the same command from that output, **as long as the
run has changed nothing on the box**: the first command that is not a fact read (an
operation's command, an upload, a python callback's command) ends it for that host, and every
read after it runs on the box as before. So a no-op run reads the box once; a run that
changes something reads what follows the change live.

What is never kept or answered: a fact that asks a server (its class says ``readahead =
False``: a repository's offers, the Hub's sizes) or is costly and never read in a no-op run
(``NOT_AHEAD``), a command that failed in the read-ahead (it is read alone, where pyinfra
reports it), a command with masked (secret) parts, one run with a password or an
environment. The list is the last run's only, so a fact a newer gpubox no longer reads
costs one extra command once. ``GPUBOX_READAHEAD=0`` turns it off (to compare; nothing else
changes).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MARK = "@@gpubox-readahead"
FORMAT = 1
# connector arguments a kept command may carry; a command with any other set (a password,
# an environment) is neither kept nor answered
KEPT_ARGS = {"_sudo", "_sudo_user", "_su_user", "_doas", "_doas_user", "_shell_executable"}
# facts never read ahead, besides those whose class says ``readahead = False`` (the ones that
# ask a server: a repository's offers, the Hub's sizes): pyinfra's Users reads every account
# (about a second); gpubox reads it only where it creates a user, never in a no-op run
NOT_AHEAD = {"pyinfra.facts.server.Users"}


def ahead(cls: Any) -> bool:
    """Whether reads of this fact class may be kept and answered ahead."""
    return bool(getattr(cls, "readahead", True)) and (
        f"{cls.__module__}.{cls.__name__}" not in NOT_AHEAD
    )


class _HostState:
    def __init__(self) -> None:
        self.reading = 0  # inside a fact read (depth)
        self.live_only = 0  # inside a read of a fact that is never read ahead
        self.quiet = 0  # inside a read-only command of gpubox's own (prefetch, checks)
        self.answers: dict[str, tuple[list[str], list[str]]] = {}
        self.valid = False
        self.read: list[dict[str, Any]] = []
        self.read_keys: set[str] = set()
        self.served = 0
        self.live = 0
        self.changed_by = ""
        self.fill_s = 0.0


_hosts: weakref.WeakKeyDictionary[Any, _HostState] = weakref.WeakKeyDictionary()
_installed = False
_originals: list[tuple[Any, str, Any]] = []


def enabled() -> bool:
    return os.environ.get("GPUBOX_READAHEAD", "1") != "0"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpubox" / "readahead"


def cache_file(host_name: str) -> Path:
    return cache_dir() / (re.sub(r"[^A-Za-z0-9_.@-]", "_", host_name) + ".json")


def _raw(command: Any) -> str | None:
    """The command's text, or None when it has masked (secret) parts."""
    raw = getattr(command, "get_raw_value", None)
    if raw is None:
        return str(command)
    text: str = raw()
    if text != command.get_masked_value():
        return None
    return text


def _executor(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The connector arguments that matter to what a command reads, or None when the command
    is run in a way that is not kept (a password, an environment, a pty, stdin)."""
    kept: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in ("print_output", "print_input"):
            continue
        if not value:
            continue
        if key not in KEPT_ARGS:
            if key in ("_timeout", "_success_exit_codes", "_retries", "_retry_delay"):
                continue
            return None
        if not isinstance(value, (str, bool, int)):
            return None
        kept[key] = value
    return kept


def key_of(command: str, executor: dict[str, Any]) -> str:
    return json.dumps([command, executor], sort_keys=True)


def _real(host: Any) -> Any:
    """The host object behind pyinfra's context proxy (``from pyinfra import host``)."""
    module = getattr(type(host), "_get_module", None)
    return host._get_module() if module is not None else host


def _state(host: Any) -> _HostState:
    host = _real(host)
    found = _hosts.get(host)
    if found is None:
        found = _hosts[host] = _HostState()
    return found


def install() -> None:
    """Wrap pyinfra's fact reads and the host's commands (once per process; nothing when
    GPUBOX_READAHEAD=0)."""
    global _installed
    if _installed or not enabled():
        return
    _installed = True
    import atexit

    from pyinfra.api import facts as pyinfra_facts
    from pyinfra.api.host import Host
    from pyinfra.connectors.util import CommandOutput, OutputLine

    get_fact = pyinfra_facts._get_fact

    def _get_fact(state: Any, host: Any, cls: Any, *args: Any, **kwargs: Any) -> Any:
        s = _state(host)
        s.reading += 1
        live = not ahead(cls)
        s.live_only += live
        try:
            return get_fact(state, host, cls, *args, **kwargs)
        finally:
            s.reading -= 1
            s.live_only -= live

    run_shell_command = Host.run_shell_command

    def _run_shell_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        s = _state(self)
        if not s.reading:
            if not s.quiet and s.valid:
                s.valid = False
                s.changed_by = str(command)[:80]
            return run_shell_command(self, command, *args, **kwargs)
        text, executor = _raw(command), _executor(kwargs)
        if text is None or executor is None or s.live_only:
            return run_shell_command(self, command, *args, **kwargs)
        key = key_of(text, executor)
        if key not in s.read_keys:
            s.read_keys.add(key)
            s.read.append({"command": text, "executor": executor})
        if s.valid and key in s.answers:
            s.served += 1
            stdout, stderr = s.answers[key]
            lines = [OutputLine("stdout", line) for line in stdout]
            lines += [OutputLine("stderr", line) for line in stderr]
            return True, CommandOutput(lines)
        s.live += 1
        return run_shell_command(self, command, *args, **kwargs)

    def _changes(method: Any) -> Any:
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            s = _state(self)
            if s.valid and not s.quiet:
                s.valid = False
                s.changed_by = f"{method.__name__} {args[1] if len(args) > 1 else ''}"[:80]
            return method(self, *args, **kwargs)

        return wrapped

    for owner, name, new in (
        (pyinfra_facts, "_get_fact", _get_fact),
        (Host, "run_shell_command", _run_shell_command),
        (Host, "put_file", _changes(Host.put_file)),
        (Host, "rsync", _changes(Host.rsync)),
    ):
        _originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)
    atexit.register(save_all)


def uninstall() -> None:
    """Undo ``install`` and forget every host (for tests: nothing is saved)."""
    global _installed
    import atexit

    while _originals:
        owner, name, original = _originals.pop()
        setattr(owner, name, original)
    atexit.unregister(save_all)
    _hosts.clear()
    _installed = False


@contextlib.contextmanager
def quiet(host: Any) -> Iterator[None]:
    """Around a read-only command of gpubox's own that is not a fact read (prefetch, the
    quick checks): it does not end the read-ahead's answers."""
    s = _state(host)
    s.quiet += 1
    try:
        yield
    finally:
        s.quiet -= 1


def has(host: Any, command: str, executor: dict[str, Any]) -> bool:
    s = _hosts.get(_real(host))
    clean = _executor(executor)
    return bool(
        s is not None and s.valid and clean is not None and key_of(command, clean) in s.answers
    )


def load(host_name: str) -> list[dict[str, Any]]:
    """The last run's fact commands for this host ([] when none, unreadable, or another
    format)."""
    try:
        data = json.loads(cache_file(host_name).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return []
    entries = data.get("commands")
    if not isinstance(entries, list):
        return []
    return [
        e
        for e in entries
        if isinstance(e, dict)
        and isinstance(e.get("command"), str)
        and isinstance(e.get("executor"), dict)
    ]


def script(commands: list[str]) -> str:
    """One shell script that runs each command in a subshell of its own, side by side (they
    only read; most of their time is starting processes), waits for them all, and prints per
    command a line: MARK, its index, its exit status, its stdout in base64."""
    lines = ["d=$(mktemp -d) || exit 1; trap 'rm -rf \"$d\"' EXIT"]
    for i, command in enumerate(commands):
        lines.append(
            f'{{ (\n{command}\n) >"$d/{i}" </dev/null 2>/dev/null; echo $? >"$d/{i}.r"; }} &'
        )
    lines.append("wait")
    lines.append(
        f"for i in {' '.join(str(i) for i in range(len(commands)))}; do "
        f"o=$(base64 -w0 < \"$d/$i\"); printf '{MARK} %s %s %s\\n' "
        '"$i" "$(cat "$d/$i.r")" "${o:--}"; done'
    )
    return "\n".join(lines)


def parse(stdout_lines: list[str], count: int) -> dict[int, list[str]]:
    """The stdout lines of each command of ``script`` that exited 0, by index."""
    found: dict[int, list[str]] = {}
    for line in stdout_lines:
        words = line.split(" ")
        if len(words) != 4 or words[0] != MARK or words[2] != "0":
            continue
        try:
            index = int(words[1])
            text = "" if words[3] == "-" else base64.b64decode(words[3]).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        if not 0 <= index < count:
            continue
        found[index] = (text[:-1] if text.endswith("\n") else text).split("\n") if text else []
    return found


def fill() -> int:
    """Run the current host's last-run fact commands in one round trip (one per set of
    connector arguments) and answer reads of them until the run changes the box. Returns how
    many answers it holds."""
    if not _installed:
        return 0
    from pyinfra import host

    s = _state(host)
    if s.answers:
        return len(s.answers)
    began = time.monotonic()
    try:
        return _fill(host, s)
    finally:
        s.fill_s = time.monotonic() - began


def _fill(host: Any, s: _HostState) -> int:
    groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for entry in load(host.name):
        executor = _executor(entry["executor"])
        if executor is None:
            continue
        group = json.dumps(executor, sort_keys=True)
        groups.setdefault(group, (executor, []))[1].append(entry["command"])
    for executor, commands in groups.values():
        try:
            with quiet(host):
                ok, out = host.run_shell_command(script(commands), print_output=False, **executor)
        except Exception:  # noqa: BLE001 - each is then read alone
            continue
        if not ok:
            continue
        for index, stdout in parse(out.stdout_lines, len(commands)).items():
            s.answers[key_of(commands[index], executor)] = (stdout, [])
    s.valid = bool(s.answers)
    return len(s.answers)


def report(host: Any) -> dict[str, Any]:
    """What the read-ahead did on this host in this run (for the benchmarks)."""
    s = _hosts.get(_real(host))
    if s is None:
        return {}
    return {
        "held": len(s.answers),
        "served": s.served,
        "live": s.live,
        "read": len(s.read),
        "ended_by": s.changed_by,
        "fill_s": round(s.fill_s, 3),
    }


def reports() -> dict[str, dict[str, Any]]:
    """``report`` of every host of this run, by name."""
    return {host.name: report(host) for host in list(_hosts.keys())}


def save_all() -> None:
    """Keep each host's fact commands of this run for the next one."""
    for host, s in list(_hosts.items()):
        if not s.read:
            continue
        path = cache_file(host.name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"format": FORMAT, "commands": s.read}, f)
            os.replace(tmp, path)
        except OSError:
            continue
