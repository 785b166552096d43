"""What the sandbox's boxes need to be watched as a fleet (issue 31 E): box k's ports bridged
into box 1's network namespace, a small model volume on box 3, and box k cut from box 1's view.

**Bridges.** Each box has only loopback in its own network namespace. Box 1 is where pyinfra,
the host checks, doctor and (with monitoring on) Prometheus run, so box k's sshd and exporters
are bridged into box 1's namespace the same way as the Debian mirror: a socat pair through a
unix socket (box side: ``UNIX-LISTEN`` -> ``TCP:127.0.0.1:PORT`` in box k's namespace; fleet
side: ``TCP-LISTEN:127.0.0.1:FLEET_PORT`` in box 1's namespace -> ``UNIX-CONNECT``). sshd keeps
its own port (2222 + k - 1); the exporters' ports (node exporter 9100, dcgm-exporter 9400,
gpubox's metrics relay 9401) move by ten per box: box k's are at ``PORT + 10 * (k - 1)`` in box
1's namespace (``fleet_port``). Every socat is recorded in box.json and stopped by PID on
``down``.

**The model volume.** Box 3's ``model_dir`` (``/srv/models``, the default) is a small
filesystem of its own, a size-limited tmpfs mounted on the host under box 3's state directory
and bind-mounted into the box by systemd-nspawn (``MODEL_VOLUMES``), so it outlives the box's
reboots and the first deploy downloads the model onto it. ``fill_model_volume`` fills it over
90 % (a file of zeros beside the model, ``FILL_FILE``), ``empty_model_volume`` removes that
file; ``down`` unmounts it.

**Unreachable.** ``cut(k)`` stops the fleet side of every bridge of box k (sshd and the
exporters, each socat with the connections it forked: its process group), so that from box
1's namespace box k answers nothing, as a box whose network is gone; ``restore(k)`` starts
them again. Box 1 is the fleet's own namespace: it cannot be cut."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from gpubox.sandbox.common import SandboxError
from gpubox.sandbox.identity import BASE_NAME, SSH_HOST, Box, netns_argv
from gpubox.sandbox.processes import (
    alive,
    box_info,
    lock,
    mounts_under,
    spawn,
    wait_for,
    wait_gone,
    write_state,
)

# The exporters' ports on each box (the keys' defaults: node_exporter_port,
# dcgm_exporter_port, metrics_relay_port), bridged into box 1's namespace for box 2 and up.
EXPORTER_PORTS = {"node": 9100, "dcgm": 9400, "backend": 9401}
PORT_STEP = 10
# Box number -> the size of its model volume in MiB, mounted at BOX_MODEL_DIR.
MODEL_VOLUMES = {3: 64}
BOX_MODEL_DIR = "/srv/models"  # the model_dir key's default
FILL_FILE = ".gpubox-standin-fill"
FILL_FRACTION = 0.95


def fleet_port(port: int, k: int) -> int:
    """Where box ``k``'s ``port`` is reached in box 1's namespace (box 1's own: ``port``)."""
    return port + PORT_STEP * (k - 1)


def monitoring_targets(k: int, backend: bool = True) -> dict[str, str]:
    """The ``monitoring_targets`` key of box ``k`` >= 2: where box 1 (the monitor) reaches its
    exporters through the bridges; no backend target for a box that serves nothing."""
    return {
        job: f"{SSH_HOST}:{fleet_port(port, k)}"
        for job, port in EXPORTER_PORTS.items()
        if backend or job != "backend"
    }


def _records(name: str) -> tuple[str, str, str]:
    """box.json's names of a bridge's box side and fleet side, and its socket's file name."""
    if name == "ssh":
        return "ssh_bridge_box", "ssh_bridge_fleet", "ssh.sock"
    return f"bridge_box_{name}", f"bridge_fleet_{name}", f"bridge-{name}.sock"


def bridge_names(k: int) -> list[str]:
    """The bridges of box ``k``: sshd's and each exporter port's (none for box 1)."""
    return [] if k == 1 else ["ssh", *(str(p) for p in EXPORTER_PORTS.values())]


def _ports(box: Box, name: str) -> tuple[int, int]:
    if name == "ssh":
        return box.ssh_port, box.ssh_port
    return int(name), fleet_port(int(name), box.number)


def _spawn_fleet_side(sdir: Path, box: Box, name: str, procs: dict[str, Any]) -> None:
    _, fleet_name, sock = _records(name)
    listen = _ports(box, name)[1]
    procs[fleet_name] = spawn(
        netns_argv(
            [
                "socat",
                f"TCP-LISTEN:{listen},bind={SSH_HOST},reuseaddr,fork",
                f"UNIX-CONNECT:{sdir / sock}",
            ],
            BASE_NAME,
        ),
        sdir / "logs" / f"{fleet_name.replace('_', '-')}.log",
    )


def bridge(sdir: Path, box: Box, name: str, procs: dict[str, Any]) -> None:
    """Bridge box ``box``'s port ``name`` ("ssh" or an exporter's port) into box 1's
    namespace: the socat pair, recorded in ``procs``."""
    if not (Path("/run/netns") / BASE_NAME).exists():
        raise SandboxError(f"box {box.number} needs box 1 up first (its namespace {BASE_NAME})")
    box_name, _, sock = _records(name)
    port = _ports(box, name)[0]
    procs[box_name] = spawn(
        netns_argv(
            [
                "socat",
                f"UNIX-LISTEN:{sdir / sock},fork,unlink-early,mode=600",
                f"TCP:{SSH_HOST}:{port}",
            ],
            box.name,
        ),
        sdir / "logs" / f"{box_name.replace('_', '-')}.log",
    )
    wait_for(lambda: (sdir / sock).exists(), 5, f"the box side of the {name} bridge")
    _spawn_fleet_side(sdir, box, name, procs)


def bridge_all(sdir: Path, box: Box, procs: dict[str, Any]) -> None:
    """Every bridge of box ``box`` (k >= 2): sshd's, then the exporters'."""
    for name in bridge_names(box.number):
        bridge(sdir, box, name, procs)


def process_names(k: int) -> list[str]:
    """box.json's names of every bridge process of box ``k`` (fleet sides first)."""
    names = [_records(n)[1] for n in bridge_names(k)] + [_records(n)[0] for n in bridge_names(k)]
    return names


def socket_names(k: int) -> list[str]:
    return [_records(n)[2] for n in bridge_names(k)]


def _stop_group(record: dict[str, int] | None) -> None:
    """A socat we started, with the connections it forked (its process group: it was
    started in a session of its own), by PID."""
    if alive(record):
        assert record is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record["pid"], signal.SIGTERM)
        if not wait_gone([record], 5):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record["pid"], signal.SIGKILL)
            wait_gone([record], 5)


def cut(k: int) -> dict[str, Any]:
    """Box ``k`` unreachable from box 1's namespace: the fleet side of each of its bridges
    stopped (with the connections it carried). Returns box k's box.json."""
    box = Box.of(k)
    if k == 1:
        raise SandboxError("box 1 is the fleet's own namespace: cut box 2 or higher (--box K)")
    sdir = box.state_dir()
    with lock(sdir):
        info = box_info(sdir)
        for name in bridge_names(k):
            _stop_group(info["processes"].get(_records(name)[1]))
        info["cut"] = True
        write_state(sdir, info)
    return info


def restore(k: int) -> dict[str, Any]:
    """Box ``k`` reachable again: the fleet side of every bridge cut started again (those
    still running are left). Returns box k's box.json."""
    box = Box.of(k)
    if k == 1:
        return box_info(box.state_dir())
    sdir = box.state_dir()
    with lock(sdir):
        info = box_info(sdir)
        procs = info["processes"]
        for name in bridge_names(k):
            if not alive(procs.get(_records(name)[1])):
                _spawn_fleet_side(sdir, box, name, procs)
        info.pop("cut", None)
        write_state(sdir, info)
    return info


# --------------------------------------------------------------------------- the model volume


def volume_dir(sdir: Path) -> Path:
    return sdir / "model-volume"


def mount_model_volume(sdir: Path, box: Box) -> dict[str, Any] | None:
    """Box ``box``'s model volume (MODEL_VOLUMES), mounted on the host: a tmpfs of that size
    under its state directory, for nspawn to bind at BOX_MODEL_DIR. None for other boxes."""
    size = MODEL_VOLUMES.get(box.number)
    if size is None:
        return None
    host_dir = volume_dir(sdir)
    host_dir.mkdir(parents=True, exist_ok=True)
    if not mounts_under(host_dir):
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}m,mode=0755", "tmpfs", str(host_dir)],
            check=True,
        )
    return {"host_dir": str(host_dir), "box_dir": BOX_MODEL_DIR, "size_mib": size}


def unmount_model_volume(sdir: Path) -> None:
    """The model volume unmounted (lazily when busy); nothing when there is none."""
    host_dir = volume_dir(sdir)
    if not (host_dir.exists() and mounts_under(host_dir)):
        return
    if subprocess.run(["umount", str(host_dir)], check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(host_dir)], check=False)


def _volume(info: dict[str, Any]) -> Path:
    volume = info.get("model_volume")
    if not volume:
        boxes = ", ".join(str(k) for k in MODEL_VOLUMES)
        raise SandboxError(
            f"{info['name']} has no model volume of its own (box {boxes} has: --box K)"
        )
    return Path(volume["host_dir"])


def fill_model_volume(
    info: dict[str, Any] | None = None, fraction: float = FILL_FRACTION
) -> dict[str, int]:
    """Fill the box's model volume to ``fraction`` of its size (a file of zeros, FILL_FILE,
    beside the model; written from the host, the box sees it at once). Returns the volume's
    size and its used bytes after."""
    host_dir = _volume(info or box_info())
    fill = host_dir / FILL_FILE
    fill.unlink(missing_ok=True)
    stat = os.statvfs(host_dir)
    size = stat.f_blocks * stat.f_frsize
    used = size - stat.f_bavail * stat.f_frsize
    want = int(size * fraction) - used
    if want > 0:
        with open(fill, "wb") as handle:
            os.posix_fallocate(handle.fileno(), 0, want)
    stat = os.statvfs(host_dir)
    return {"size": size, "used": size - stat.f_bavail * stat.f_frsize}


def empty_model_volume(info: dict[str, Any] | None = None) -> None:
    """Take back what fill_model_volume wrote."""
    (_volume(info or box_info()) / FILL_FILE).unlink(missing_ok=True)
