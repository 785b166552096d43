"""gpubox's box metrics, as the box runs them: the monitoring stage (gpubox.ops.box_metrics)
uploads this file whole and a systemd timer (gpubox-box-metrics.timer) runs it every
monitoring_interval seconds as a oneshot service, as root. It imports nothing but Python's
standard library (like knowledge/watchdog.py).

One run reads the box and writes the node exporter's textfile ``gpubox-box.prom`` (the
``box`` writer of gpubox.knowledge.metrics; a test keeps the names and help equal), whole, to
a temporary name and renamed:

- ``gpubox_reboot_pending``: 1 when the installed NVIDIA driver is not the loaded one. The
  loaded one: /sys/module/nvidia/version, else /proc/driver/nvidia/version's "Kernel Module"
  version (none: no module loaded). The installed one: ``dpkg-query`` of the kernel module's
  package the deploy installed (the settings name it), its upstream version (no epoch, no
  Debian revision). Installed and not loaded, or another version loaded: pending. No package
  installed (or none named): not pending.
- ``gpubox_reboot_pending_since_timestamp_seconds``: the first run that saw it pending (kept
  in the state file until it is no longer pending; 0 when none is).
- ``gpubox_model_download_bytes{model}`` and ``..._size_bytes{model}``: the model download's
  bytes on disk (gpubox.plans.model_script: hf and url download with curl into
  ``<file>.part``, modelscope into the staging directory ``<file>.incomplete/``, and the file
  moves into place once it verifies; vLLM's checkpoint is a directory, hf's partial files in
  its ``.cache``), and the whole file's size: the catalog's, else the verified file's once its
  marker is written (the checkpoint: its marker's sizes), 0 while unknown.
- ``gpubox_model_volume_info{mountpoint}``: the mount point of the filesystem that holds
  model_dir now (the longest mount point of /proc/self/mountinfo above its real path; the
  node exporter's ``mountpoint`` label), read at each run: a volume mounted after the deploy
  counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

# The box writer's metrics, as gpubox.knowledge.metrics defines them: (name, type, help).
METRICS = (
    (
        "gpubox_reboot_pending",
        "gauge",
        "Whether the installed NVIDIA driver is not the loaded one (1): a reboot is pending.",
    ),
    (
        "gpubox_reboot_pending_since_timestamp_seconds",
        "gauge",
        "Since when the installed NVIDIA driver has not been the loaded one (0 when it is).",
    ),
    ("gpubox_model_download_bytes", "gauge", "Bytes of the model's file downloaded so far."),
    (
        "gpubox_model_download_size_bytes",
        "gauge",
        "Bytes of the model's whole file (0 while unknown).",
    ),
    (
        "gpubox_model_volume_info",
        "gauge",
        "Always 1: the mount point of the filesystem that holds model_dir (the node "
        "exporter's node_filesystem_* mountpoint label).",
    ),
)
DEFAULTS = {
    "sys_module_version": "/sys/module/nvidia/version",
    "proc_driver_version": "/proc/driver/nvidia/version",
    "mountinfo": "/proc/self/mountinfo",
}

Sample = tuple[str, dict[str, str], float]


def _number(value: float) -> str:
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(samples: list[Sample]) -> str:
    """Prometheus's text format, each metric's HELP and TYPE once, in METRICS' order."""
    lines = []
    for name, kind, text in METRICS:
        series = [s for s in samples if s[0] == name]
        if not series:
            continue
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for _, labels, value in series:
            pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(
                f"{name}{{{pairs}}} {_number(value)}" if pairs else f"{name} {_number(value)}"
            )
    return "".join(line + "\n" for line in lines)


# --- the driver


def upstream(version: str) -> str:
    """A package version's upstream part: no epoch, no Debian revision."""
    version = version.split(":", 1)[1] if ":" in version else version
    return version.rsplit("-", 1)[0] if "-" in version else version


def loaded_driver(settings: dict[str, Any]) -> str | None:
    """The loaded NVIDIA kernel module's version, None when none is loaded."""
    try:
        with open(settings["sys_module_version"], encoding="utf-8") as f:
            found = f.read().strip()
        if found:
            return found
    except OSError:
        pass
    try:
        with open(settings["proc_driver_version"], encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.211.01  Tue ..." (the open
    # modules: "NVIDIA UNIX Open Kernel Module for x86_64  570.211.01  Release Build ...")
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            words = line.split()
            return next((w for w in words if w[:1].isdigit() and "." in w), None)
    return None


def installed_driver(package: str | None) -> str | None:
    """The upstream version of ``package`` as dpkg has it installed, None when it is not."""
    if not package:
        return None
    try:
        done = subprocess.run(
            ["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Version}\n", package],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = done.stdout.split()
    if done.returncode != 0 or len(words) < 2 or words[0][1:2] != "i":
        return None
    return upstream(words[-1])


def reboot(state: dict[str, Any], installed: str | None, loaded: str | None, now: float):
    """(pending, since, the new state): pending when a driver is installed and another one,
    or none, is loaded; since the first run that saw it, kept in the state."""
    pending = installed is not None and installed != loaded
    since = (state.get("pending_since") or now) if pending else None
    return (
        pending,
        since,
        {**state, "pending_since": since, "installed": installed, "loaded": loaded},
    )


# --- the model


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size if os.path.isfile(path) else 0
    except OSError:
        return 0


def tree_bytes(path: str) -> int:
    """Bytes of every regular file under ``path`` (its own size when it is a file)."""
    if not os.path.isdir(path):
        return _size(path)
    total = 0
    for root, _, names in os.walk(path):
        total += sum(
            _size(os.path.join(root, n)) for n in names if not os.path.islink(os.path.join(root, n))
        )
    return total


def model_samples(model: dict[str, Any]) -> list[Sample]:
    """The download's bytes so far and the whole size, for the model the settings name."""
    labels = {"model": model["name"]}
    path, marker = model["path"], model["marker"]
    size = int(model.get("size") or 0)
    if model.get("kind") == "directory":
        done = tree_bytes(path)
        if not size:
            size = _marker_sizes(marker)
    else:
        done = _size(path) + _size(f"{path}.part") + tree_bytes(f"{path}.incomplete")
        if not size and os.path.isfile(marker) and os.path.isfile(path):
            size = _size(path)  # verified: its size is the whole
    return [
        ("gpubox_model_download_bytes", labels, float(done)),
        ("gpubox_model_download_size_bytes", labels, float(size)),
    ]


def _marker_sizes(marker: str) -> int:
    """The checkpoint's size from its marker's ``file SIZE NAME`` lines (0: no marker)."""
    try:
        with open(marker, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    sizes = [line.split(" ", 2)[1] for line in lines if line.startswith("file ")]
    return sum(int(s) for s in sizes if s.isdigit())


# --- the model volume


def _unescape(field: str) -> str:
    """A mountinfo path: octal escapes (\\040 a space) decoded."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mountpoint(directory: str, mountinfo: str) -> str:
    """The mount point holding ``directory`` (its nearest existing parent, symlinks resolved):
    the longest mount point above it in ``mountinfo`` (the last mounted of equals); without a
    readable mountinfo, the walk up to where st_dev changes."""
    path = directory
    while not os.path.exists(path) and path not in ("", "/"):
        path = os.path.dirname(path)
    path = os.path.realpath(path or "/")
    try:
        with open(mountinfo, encoding="utf-8") as f:
            points = [_unescape(line.split()[4]) for line in f if len(line.split()) > 4]
    except OSError:
        points = []
    best = None
    for point in points:
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best)):
            best = point
    if best is not None:
        return best
    while path != "/" and os.stat(path).st_dev == os.stat(os.path.dirname(path)).st_dev:
        path = os.path.dirname(path)
    return path


# --- one run


def samples(settings: dict[str, Any], state: dict[str, Any], now: float):
    """The run's samples and the new state."""
    pending, since, new = reboot(
        state, installed_driver(settings.get("driver_package")), loaded_driver(settings), now
    )
    found: list[Sample] = [
        ("gpubox_reboot_pending", {}, 1.0 if pending else 0.0),
        ("gpubox_reboot_pending_since_timestamp_seconds", {}, float(since or 0)),
    ]
    if settings.get("model"):
        found += model_samples(settings["model"])
    volume = mountpoint(settings["model_dir"], settings["mountinfo"])
    found.append(("gpubox_model_volume_info", {"mountpoint": volume}, 1.0))
    return found, new


def write(path: str, text: str) -> None:
    """``text`` into ``path`` whole: a temporary name beside it (not ``*.prom``), renamed."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    with open(argv[1] if len(argv) > 1 else "/etc/gpubox/box-metrics.json", encoding="utf-8") as f:
        settings = {**DEFAULTS, **json.load(f)}
    try:
        with open(settings["state_file"], encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {}
    found, new = samples(settings, state, time.time())
    write(settings["textfile"], render(found))
    if new != state:
        write(settings["state_file"], json.dumps(new) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
