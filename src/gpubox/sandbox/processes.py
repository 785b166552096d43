"""The processes and namespaces of a sandbox box, and box.json, where they are recorded.

Everything ``box.up`` starts is recorded in ``<state dir>/box.json`` with its PID and kernel
start time, so a recycled PID is never signalled; the box's own processes (they show in the
host's ps) are found by their PID namespace, the one of the box's init under
systemd-nspawn. The supervisor (supervisor.py) keeps nspawn's record in ``nspawn.pid``, since
a reboot starts a new nspawn. Processes are stopped by PID, never by name."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gpubox.sandbox.common import SandboxError, SandboxNotUp, process_start_time
from gpubox.sandbox.identity import BOX_ENV, MAX_BOXES, Box, current, netns_argv

# How our detached helpers start (not `-m`: the package imports box.py first).
HELPER = "import sys; from gpubox.sandbox.{module} import main; sys.exit(main(sys.argv[1:]))"


def _src_root() -> Path:
    """The directory that holds the ``gpubox`` package (for our child processes)."""
    return Path(__file__).resolve().parents[2]


def child_env(box: Box) -> dict[str, str]:
    """The environment of a process we start for ``box``: it works on the same box."""
    env = dict(os.environ)
    env[BOX_ENV] = str(box.number)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_src_root()), env.get("PYTHONPATH", "")) if p
    )
    return env


# --------------------------------------------------------------------------- processes


def alive(record: dict[str, int] | None) -> bool:
    if not record:
        return False
    return process_start_time(record["pid"]) == record["start_time"]


def send_signal(record: dict[str, int] | None, sig: int) -> bool:
    """Signal a process we started, only if it is still that process."""
    if not alive(record):
        return False
    assert record is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(record["pid"], sig)
    return True


def wait_gone(records: Sequence[dict[str, int] | None], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        for record in records:
            if record:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(record["pid"], os.WNOHANG)  # reap our own children
        if not any(alive(r) for r in records):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def stop(record: dict[str, int] | None, timeout: float = 5.0) -> None:
    if send_signal(record, signal.SIGTERM) and not wait_gone([record], timeout):
        send_signal(record, signal.SIGKILL)
        wait_gone([record], 5.0)


def spawn(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> dict[str, int]:
    """Start a detached process (own session, no terminal) that outlives this one."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    start = process_start_time(proc.pid)
    if start is None:
        proc.wait()
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-5:])
        raise SandboxError(f"{' '.join(argv)} exited at once ({proc.returncode}); {log}:\n{tail}")
    return {"pid": proc.pid, "start_time": start}


def spawn_helper(
    box: Box, module: str, args: Sequence[str], log: Path, netns: bool = False
) -> dict[str, int]:
    """``gpubox.sandbox.MODULE``'s ``main(ARGS)`` as a detached process working on ``box``
    (in its network namespace with ``netns``)."""
    argv = [sys.executable, "-c", HELPER.format(module=module), *args]
    return spawn(netns_argv(argv, box.name) if netns else argv, log, env=child_env(box))


def spawn_server(
    sdir: Path, box: Box, module: str, args: Sequence[str], supervisor: dict[str, int]
) -> dict[str, int]:
    """``gpubox.sandbox.MODULE serve ARGS`` (repo.py, hub.py) in the box's network namespace,
    logging to logs/MODULE-server.log; it exits when ``supervisor`` is gone."""
    args = ["serve", *args, "--watch-pid", str(supervisor["pid"])]
    args += ["--watch-start-time", str(supervisor["start_time"])]
    return spawn_helper(box, module, args, sdir / "logs" / f"{module}-server.log", netns=True)


def listening(record: dict[str, int], port: int) -> bool:
    """Whether anything listens on TCP ``port`` in the namespace of process ``record``."""
    if not alive(record):
        raise SandboxError(f"process {record['pid']} exited (see the logs in the state dir)")
    try:
        table = Path(f"/proc/{record['pid']}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    want = f":{port:04X}"
    return any(line.split()[1].endswith(want) and line.split()[3] == "0A" for line in table)


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SandboxError(f"timed out waiting for {what}")
        time.sleep(0.05)


# --------------------------------------------------------------------------- namespaces


def namespace_of(pid: int, kind: str = "pid") -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _all_pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def box_init(nspawn: dict[str, int] | None) -> dict[str, int] | None:
    """The box's init: the first process under nspawn in another PID namespace."""
    if not alive(nspawn):
        return None
    assert nspawn is not None
    host = namespace_of(os.getpid())
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(pid)
    todo = list(children.get(nspawn["pid"], []))
    while todo:
        pid = todo.pop(0)
        ns = namespace_of(pid)
        start = process_start_time(pid)
        if ns is not None and ns != host and start is not None:
            return {"pid": pid, "start_time": start}
        todo.extend(children.get(pid, []))
    return None


def box_pid_namespace(nspawn: dict[str, int] | None) -> str | None:
    """The PID namespace of the box nspawn runs (its init and every process in the box)."""
    init = box_init(nspawn)
    return namespace_of(init["pid"]) if init else None


def processes_in_namespace(namespace: str | None) -> list[int]:
    """PIDs of the processes in a PID namespace (``box_pid_namespace``), seen from the host."""
    if namespace is None:
        return []
    return [pid for pid in _all_pids() if namespace_of(pid) == namespace]


def box_processes(info: dict[str, Any] | None = None) -> list[int]:
    """Host PIDs of the processes running in the box now (they show in the host's ps)."""
    info = info or box_info()
    record = nspawn_full_record(Path(info["state_dir"]))
    namespace = record.get("pid_namespace") or box_pid_namespace(
        nspawn_record(Path(info["state_dir"]))
    )
    return processes_in_namespace(namespace)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or under ``path`` in the host's mount namespace."""
    target = str(path.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == target or point.startswith(target + "/"):
            found.append(point)
    return found


# --------------------------------------------------------------------------- nspawn's record


def write_nspawn_record(sdir: Path, record: dict[str, Any]) -> None:
    tmp = sdir / "nspawn.pid.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, sdir / "nspawn.pid")


def nspawn_full_record(sdir: Path) -> dict[str, Any]:
    try:
        record: dict[str, Any] = json.loads((sdir / "nspawn.pid").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return record


def nspawn_record(sdir: Path) -> dict[str, int] | None:
    try:
        record = json.loads((sdir / "nspawn.pid").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return {"pid": record["pid"], "start_time": record["start_time"]}


# --------------------------------------------------------------------------- box.json


def _box_json(sdir: Path) -> Path:
    return sdir / "box.json"


def read_state(sdir: Path) -> dict[str, Any] | None:
    try:
        return json.loads(_box_json(sdir).read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise SandboxError(f"{_box_json(sdir)} is not valid JSON ({exc})") from exc


def write_state(sdir: Path, state: dict[str, Any]) -> None:
    path = _box_json(sdir)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def retire_state(sdir: Path) -> None:
    """box.json becomes last-box.json (the box is down)."""
    with contextlib.suppress(FileNotFoundError):
        os.replace(_box_json(sdir), sdir / "last-box.json")


@contextlib.contextmanager
def lock(sdir: Path) -> Iterator[None]:
    sdir.mkdir(parents=True, exist_ok=True)
    with open(sdir / "lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise SandboxError(f"another gpubox sandbox command holds {sdir / 'lock'}") from exc
        yield


def box_info(sdir: Path | None = None) -> dict[str, Any]:
    """The running box's connection facts (box.json; the current box's by default); raises
    SandboxNotUp if it is not up."""
    sdir = sdir or current().state_dir()
    state = read_state(sdir)
    if state is None or state.get("state") != "up":
        raise SandboxNotUp("sandbox is not up: run gpubox sandbox up")
    if not alive(state["processes"].get("supervisor")):
        raise SandboxNotUp(
            "sandbox is not running (its supervisor is gone): "
            "run gpubox sandbox down, then gpubox sandbox up"
        )
    now = nspawn_record(sdir)  # a reboot starts a new nspawn under the same supervisor
    if now and now != state["processes"].get("nspawn"):
        state["processes"]["nspawn"] = now
    return state


def is_up(sdir: Path | None = None) -> bool:
    try:
        box_info(sdir)
    except SandboxNotUp:
        return False
    return True


def box_infos() -> list[dict[str, Any]]:
    """box.json of every box that is up, box 1 first."""
    infos = []
    for k in range(1, MAX_BOXES + 1):
        with contextlib.suppress(SandboxNotUp):
            infos.append(box_info(Box.of(k).state_dir()))
    return infos
