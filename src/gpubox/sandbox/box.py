"""The sandbox box: a Debian 12 systemd host in systemd-nspawn, reached over SSH.

One box at a time. It lives in its own network namespace (``gpubox-sandbox``): sshd, the
stand-in NVIDIA repository and a bridge to the host's Debian mirror all listen on 127.0.0.1
*inside* that namespace, so nothing touches the host's network and nothing clashes with it.
pyinfra and pytest reach the box by running inside the namespace (``gpubox sandbox exec --``).

Lifecycle:

``up``   root filesystem from the cache (debootstrap once per recipe hash, then a fresh
         ``cp -a`` per box), netns, mirror bridge (socat host <-> unix socket <-> socat in the
         netns), stand-in repository server (which also serves the catalog's llama.cpp sdist
         as a PyPI mirror would and a tiny GGUF model: llamacpp.py, tinymodel.py), a
         Hugging Face Hub and PyPI mirror (hub.py, pypi.py: the tiny model for the real hf
         tool, and that tool's wheels), nspawn under a supervisor that boots the box again
         when it exits with 133 (the box ran ``reboot``), with the host's compiler cache
         bind-mounted at CCACHE_DIR; wait until systemd says running.
``down`` orderly poweroff (SIGTERM to nspawn, SIGKILL after 30 s), then every process we
         started, by PID (never by name: the box's processes are visible on the host), then
         the netns; checks that no process, mount or namespace is left behind.

Everything we start is recorded in ``<state dir>/box.json`` with its PID and kernel start time,
so a recycled PID is never signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gpubox.sandbox.common import (
    HUB_PORT,
    SUITE,
    SandboxError,
    SandboxNotUp,
    cache_dir,
    debian_mirror,
    host_apt_sources,
    process_start_time,
)

# Up to MAX_BOXES boxes at once (gpubox sandbox up --boxes N). Box 1 is "gpubox-sandbox";
# box k is "gpubox-sandbox-k", with its own network namespace, state directory, root
# filesystem copy, SSH port, stand-in GPU state and hostname; the caches are shared. A
# process works on one box at a time: use_box(k), or $GPUBOX_SANDBOX_BOX for our children.
BOX_ENV = "GPUBOX_SANDBOX_BOX"
MAX_BOXES = 4
BASE_NAME = "gpubox-sandbox"
BASE_SSH_PORT = 2222
BOX = 1
NAME = BASE_NAME  # machine name, network namespace, ssh host alias, hostname
NETNS_PATH = Path("/run/netns") / NAME
SSH_PORT = BASE_SSH_PORT
SSH_USER = "root"
SSH_HOST = "127.0.0.1"
REPO_PORT = 8765
REPO_DISTRO = "debian12"
# A fresh Debian install enables main only; the deploy enables contrib itself.
DEBIAN_COMPONENTS = "main"
DEBOOTSTRAP_VARIANT = "minbase"
DEBOOTSTRAP_INCLUDE = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "ca-certificates",
    "gnupg",
    "curl",
    "iproute2",  # testinfra's host.socket() runs ss
    "initramfs-tools",  # the driver stage runs update-initramfs
    "kmod",
    # Debian's kernel build scripts for 6.1 (what linux-headers-*-amd64 depends on): its real
    # scripts/sign-file, with which Debian's real dkms signs the modules it builds (kernel.py)
    "linux-kbuild-6.1",
)
# Bump when the rootfs customisation below changes: it is part of the cache key.
ROOTFS_RECIPE_VERSION = 2
# The container image the host checks run in the box (load_check_image), never from a registry.
CHECK_IMAGE = "gpubox.local/check:1"
# The stand-in dcgm-exporter (load_exporter_image): one layer on the check image, never pulled;
# inventories/sandbox.py names it in catalog_overrides' dcgm.exporter_image, as a mirror would.
EXPORTER_IMAGE = "gpubox.local/dcgm-exporter:4.4.1-4.6.0-standin"
# A compiler cache that outlives the box: <cache dir>/ccache on the host, bind-mounted here in
# every box, so that a llama.cpp build through ccache (CCACHE_DIR set to this, the source and
# build at fixed paths) takes seconds in a fresh box once one box has built it.
CCACHE_DIR = "/var/cache/gpubox-ccache"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0

# nspawn exits with this status when the box ran `reboot` (systemd-nspawn(1)).
NSPAWN_REBOOT_STATUS = 133

# Host commands and the Debian package that provides each.
HOST_COMMANDS = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "dpkg-deb": "dpkg",
    "dpkg-divert": "dpkg",
    "dpkg-scanpackages": "dpkg-dev",
    "apt-ftparchive": "apt-utils",
    "gpg": "gnupg",
    "gpgconf": "gnupg",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "ip": "iproute2",
    "socat": "socat",
}

SSHD_DROPIN_PATH = "etc/ssh/sshd_config.d/10-sandbox.conf"


def sshd_dropin(port: int = BASE_SSH_PORT) -> str:
    return f"""\
# gpubox sandbox: sshd of the local stand-in box (never shipped to a real box).
# Debian's sshd_config includes sshd_config.d/*.conf first, so these settings win.
ListenAddress {SSH_HOST}
Port {port}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""


SSHD_DROPIN = sshd_dropin()


def box_name(k: int) -> str:
    return BASE_NAME if k == 1 else f"{BASE_NAME}-{k}"


def use_box(k: int) -> None:
    """Make box ``k`` (1..MAX_BOXES) the one this process works on."""
    global BOX, NAME, NETNS_PATH, SSH_PORT
    if not 1 <= k <= MAX_BOXES:
        raise SandboxError(f"box {k}: the sandbox has boxes 1 to {MAX_BOXES}")
    BOX, NAME = k, box_name(k)
    NETNS_PATH = Path("/run/netns") / NAME
    SSH_PORT = BASE_SSH_PORT + k - 1


def _box_from_env() -> int:
    value = os.environ.get(BOX_ENV, "1")
    return int(value) if value.isdigit() else 1


use_box(_box_from_env())


Progress = Callable[[str], None]


def _stderr_progress(message: str) -> None:
    print(f"gpubox sandbox: {message}", file=sys.stderr, flush=True)


def _quiet(message: str) -> None:
    pass


# --------------------------------------------------------------------------- paths


def state_dir(k: int | None = None) -> Path:
    """A box's state (the current box's by default): $GPUBOX_STATE_DIR or
    ~/.local/state/gpubox/sandbox for box 1; the same with "-k" for box k."""
    env = os.environ.get("GPUBOX_STATE_DIR")
    base = Path(env) if env else Path.home() / ".local" / "state" / "gpubox" / "sandbox"
    k = BOX if k is None else k
    return base if k == 1 else base.with_name(f"{base.name}-{k}")


def _box_json(sdir: Path) -> Path:
    return sdir / "box.json"


def _src_root() -> Path:
    """The directory that holds the ``gpubox`` package (for our child processes)."""
    return Path(__file__).resolve().parents[2]


# How our detached helpers start (not `-m`: the package imports box.py first).
_HELPER = "import sys; from gpubox.sandbox.{module} import main; sys.exit(main(sys.argv[1:]))"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env[BOX_ENV] = str(BOX)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_src_root()), env.get("PYTHONPATH", "")) if p
    )
    return env


# --------------------------------------------------------------------------- processes


def _alive(record: dict[str, int] | None) -> bool:
    if not record:
        return False
    return process_start_time(record["pid"]) == record["start_time"]


def _signal(record: dict[str, int] | None, sig: int) -> bool:
    """Signal a process we started, only if it is still that process."""
    if not _alive(record):
        return False
    assert record is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(record["pid"], sig)
    return True


def _wait_gone(records: Sequence[dict[str, int] | None], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        for record in records:
            if record:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(record["pid"], os.WNOHANG)  # reap our own children
        if not any(_alive(r) for r in records):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _stop(record: dict[str, int] | None, timeout: float = 5.0) -> None:
    if _signal(record, signal.SIGTERM) and not _wait_gone([record], timeout):
        _signal(record, signal.SIGKILL)
        _wait_gone([record], 5.0)


def _spawn(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> dict[str, int]:
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


def _spawn_server(
    sdir: Path, module: str, args: Sequence[str], supervisor: dict[str, int]
) -> dict[str, int]:
    """``gpubox.sandbox.MODULE serve ARGS`` (repo.py, hub.py) in the box's network namespace,
    logging to logs/MODULE-server.log; it exits when ``supervisor`` is gone."""
    argv = [sys.executable, "-c", _HELPER.format(module=module), "serve", *args]
    argv += ["--watch-pid", str(supervisor["pid"])]
    argv += ["--watch-start-time", str(supervisor["start_time"])]
    return _spawn(netns_argv(argv), sdir / "logs" / f"{module}-server.log", env=_child_env())


def _namespace(pid: int, kind: str = "pid") -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _all_pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def _box_init(nspawn: dict[str, int] | None) -> dict[str, int] | None:
    """The box's init: the first process under nspawn in another PID namespace."""
    if not _alive(nspawn):
        return None
    assert nspawn is not None
    host = _namespace(os.getpid())
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(pid)
    todo = list(children.get(nspawn["pid"], []))
    while todo:
        pid = todo.pop(0)
        ns = _namespace(pid)
        start = process_start_time(pid)
        if ns is not None and ns != host and start is not None:
            return {"pid": pid, "start_time": start}
        todo.extend(children.get(pid, []))
    return None


def box_pid_namespace(nspawn: dict[str, int] | None) -> str | None:
    """The PID namespace of the box nspawn runs (its init and every process in the box)."""
    init = _box_init(nspawn)
    return _namespace(init["pid"]) if init else None


def processes_in_namespace(namespace: str | None) -> list[int]:
    """PIDs of the processes in a PID namespace (``box_pid_namespace``), seen from the host."""
    if namespace is None:
        return []
    return [pid for pid in _all_pids() if _namespace(pid) == namespace]


def box_processes(info: dict[str, Any] | None = None) -> list[int]:
    """Host PIDs of the processes running in the box now (they show in the host's ps)."""
    info = info or box_info()
    record = _nspawn_full_record(Path(info["state_dir"]))
    namespace = record.get("pid_namespace") or box_pid_namespace(
        _nspawn_record(Path(info["state_dir"]))
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


# --------------------------------------------------------------------------- host checks


def check_host() -> None:
    """Root and the host packages the sandbox needs; names the apt packages if missing."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the sandbox needs root (debootstrap, systemd-nspawn, ip netns)")
    missing = sorted({pkg for cmd, pkg in HOST_COMMANDS.items() if not shutil.which(cmd)})
    if missing:
        problems.append(
            "missing host packages: "
            + " ".join(missing)
            + f" (apt-get install -y {' '.join(missing)})"
        )
    if problems:
        raise SandboxError("; ".join(problems))


# --------------------------------------------------------------------------- Debian mirror


def _security_mirror(mirror: str) -> str | None:
    """The host's bookworm-security URL, if it is on the same host:port as the mirror."""
    want = _host_port(mirror)
    for uri, suite in host_apt_sources():
        if suite == f"{SUITE}-security" and _host_port(uri) == want:
            return uri.rstrip("/")
    return None


def _host_port(url: str) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise SandboxError(f"the Debian mirror must be an http(s) URL, not {url!r}")
    return parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)


# --------------------------------------------------------------------------- root filesystem


def rootfs_recipe() -> dict[str, Any]:
    return {
        "suite": SUITE,
        "variant": DEBOOTSTRAP_VARIANT,
        "include": list(DEBOOTSTRAP_INCLUDE),
        "sshd_dropin": SSHD_DROPIN,
        "recipe_version": ROOTFS_RECIPE_VERSION,
        "arch": os.uname().machine,
    }


def rootfs_key() -> str:
    blob = json.dumps(rootfs_recipe(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _debootstrap_progress(line: str, seen: set[str], progress: Progress, started: float) -> None:
    # debootstrap prints one "I: Retrieving/Validating/Extracting/Unpacking/Configuring X"
    # per package: report each phase once.
    match = re.match(
        r"I: (Retrieving|Extracting|Unpacking|Configuring|Installing|Base system)", line
    )
    if not match:
        return
    phase = match.group(1)
    if phase not in seen:
        seen.add(phase)
        progress(f"  debootstrap: {phase.lower()} ... ({time.monotonic() - started:.0f} s)")


def build_rootfs(
    dest: Path, mirror: str, progress: Progress = _stderr_progress, log: Path | None = None
) -> None:
    """debootstrap a pristine box root filesystem into ``dest`` and customise it."""
    log = log or dest.parent / f"{dest.name}.log"
    started = time.monotonic()
    argv = [
        "debootstrap",
        f"--variant={DEBOOTSTRAP_VARIANT}",
        "--include=" + ",".join(DEBOOTSTRAP_INCLUDE),
        SUITE,
        str(dest),
        mirror,
    ]
    progress(
        f"building the box root filesystem (debootstrap {SUITE} from {mirror}; "
        "about 1-2 minutes, once per recipe)"
    )
    seen: set[str] = set()
    with open(log, "w") as logf:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            _debootstrap_progress(line, seen, progress, started)
        rc = proc.wait()
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise SandboxError(f"debootstrap failed (exit {rc}); log {log}:\n{tail}")
    _customise_pristine(dest)
    progress(f"root filesystem built in {time.monotonic() - started:.0f} s")


def _customise_pristine(root: Path) -> None:
    # Debian sources are written per box (the mirror may change); without a reachable
    # source apt would wait on DNS.
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    for lists in (root / "var/lib/apt/lists").glob("*"):
        if lists.is_file() and lists.name != "lock":
            lists.unlink()
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    dropin = root / SSHD_DROPIN_PATH
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(SSHD_DROPIN)
    (root / "etc/hostname").write_text(BASE_NAME + "\n")
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (root / "usr/local/sbin").mkdir(parents=True, exist_ok=True)


def ensure_rootfs(rebuild: bool = False, progress: Progress = _stderr_progress) -> Path:
    """The cached pristine root filesystem for the current recipe (built if missing)."""
    base = cache_dir() / "rootfs"
    base.mkdir(parents=True, exist_ok=True)
    pristine = base / rootfs_key()
    marker = pristine / ".gpubox-rootfs-complete"
    if marker.exists() and not rebuild:
        return pristine
    tmp = base / f"{pristine.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build_rootfs(tmp, debian_mirror(), progress, log=base / f"{pristine.name}.log")
        (tmp / ".gpubox-rootfs-complete").write_text(json.dumps(rootfs_recipe(), indent=1))
        if pristine.exists():
            _delete_in_background(pristine, base)
        tmp.rename(pristine)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in base.iterdir():  # pristine trees of older recipes
        if old.is_dir() and old != pristine and not old.name.startswith("."):
            if ".building-" in old.name:
                continue
            _delete_in_background(old, base)
        elif old.suffix == ".log" and old.stem != pristine.name:
            old.unlink()
    return pristine


def _remove_detached(path: Path) -> None:
    """``rm -rf`` of ``path`` (not crossing into other file systems) in a detached process."""
    subprocess.Popen(
        ["rm", "-rf", "--one-file-system", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _delete_in_background(path: Path, trash_parent: Path) -> None:
    """Move ``path`` aside and delete it in a detached process (deleting takes long)."""
    trash = trash_parent / f".trash-{path.name}-{secrets.token_hex(4)}"
    try:
        path.rename(trash)
    except OSError:
        return
    _remove_detached(trash)


def _clean_old_boxes(boxes: Path, keep: Path) -> None:
    for old in boxes.iterdir():
        if old == keep or old.name.startswith(".trash-"):
            continue
        if old.is_dir() and not mounts_under(old):
            _delete_in_background(old, boxes)
    for trash in boxes.glob(".trash-*"):  # an interrupted earlier deletion
        _remove_detached(trash)


def _prepare_box_rootfs(root: Path, mirror: str, pubkey: str) -> None:
    """Per-box settings of a fresh copy: keys, identity, apt sources, hosts, hardware, and a
    stand-in of the running kernel's image and headers (for DKMS)."""
    (root / SSHD_DROPIN_PATH).write_text(sshd_dropin(SSH_PORT))
    (root / "etc/hostname").write_text(NAME + "\n")
    (root / "root/.ssh/authorized_keys").write_text(pubkey)
    os.chmod(root / "root/.ssh/authorized_keys", 0o600)
    (root / "etc/machine-id").write_text(secrets.token_hex(16) + "\n")
    mirror_host, _ = _host_port(mirror)
    (root / "etc/hosts").write_text(
        "# gpubox sandbox: the Debian mirror is bridged to 127.0.0.1 inside the box's\n"
        "# network namespace (a socat pair through a unix socket on the host).\n"
        "127.0.0.1\tlocalhost\n"
        f"127.0.1.1\t{NAME}\n"
        f"127.0.0.1\t{mirror_host}\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
    )
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    # No DNS in the namespace: a lookup of an unknown name fails at once instead of waiting.
    resolv.write_text(
        "# gpubox sandbox: no DNS inside the box's network namespace\n"
        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
    )
    suites = f"{SUITE} {SUITE}-updates"
    sources = (
        "# gpubox sandbox: Debian through the host's mirror (bridged into the namespace)\n"
        f"Types: deb\nURIs: {mirror}\nSuites: {suites}\nComponents: {DEBIAN_COMPONENTS}\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    security = _security_mirror(mirror)
    if security:
        sources += (
            f"\nTypes: deb\nURIs: {security}\nSuites: {SUITE}-security\n"
            f"Components: {DEBIAN_COMPONENTS}\n"
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        )
    (root / "etc/apt/sources.list.d/debian.sources").write_text(sources)
    install_hardware(root)
    # The box runs the host's kernel: a stand-in of its image and headers, so that Debian's
    # real dkms builds the (stand-in) NVIDIA module for it (kernel.py, STANDINS.md).
    from gpubox.sandbox import kernel

    kernel.install_kernel(root, os.uname().release)


# --------------------------------------------------------------------------- hardware


# The boot unit of the stand-in kernel modules other than NVIDIA's (standin/boot-modules).
BOOT_MODULES = "/usr/local/lib/gpubox-standin/boot-modules"
BOOT_MODULES_UNIT = "gpubox-standin-boot-modules.service"
BOOT_MODULES_UNIT_TEXT = f"""\
# gpubox sandbox stand-in (never shipped to a real box): the kernel modules the box's hardware
# gets at boot (nouveau for the display card, when the state says so). STANDINS.md.
[Unit]
Description=gpubox sandbox stand-in: load the display card's kernel module
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target display-manager.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={BOOT_MODULES}

[Install]
WantedBy=sysinit.target
"""


def install_hardware(root: Path) -> None:
    """The box's stand-in "hardware": the GPU state file, the lspci and mokutil stand-ins (in
    /usr/local/sbin, and in /usr/bin past a local diversion of pciutils' lspci and mokutil's
    own), and the boot unit of the display card's module."""
    from gpubox.sandbox import standin
    from gpubox.sandbox.standin import state as standin_state

    hardware = standin_state.t4_state() if BOX == 2 else standin_state.default_state()
    standin_state.save_state(hardware, _in_box(root, standin.STATE_PATH))
    # Maintainer scripts run with apt's DPkg::Path (/usr/sbin:/usr/bin:/sbin:/bin), without
    # /usr/local/sbin: Debian's nvidia-legacy-check preinst runs `lspci -mn` (STANDINS.md). A
    # local dpkg diversion keeps pciutils' own lspci, once installed, at lspci.distrib, so the
    # stand-in answers in /usr/bin too.
    subprocess.run(
        [
            "dpkg-divert",
            f"--root={root}",
            "--local",
            "--rename",
            "--divert",
            "/usr/bin/lspci.distrib",
            "--add",
            "/usr/bin/lspci",
        ],
        check=True,
        capture_output=True,
    )
    for path in ("usr/local/sbin/lspci", "usr/bin/lspci"):
        lspci = root / path
        lspci.parent.mkdir(parents=True, exist_ok=True)
        lspci.write_bytes(standin.LSPCI.read_bytes())
        lspci.chmod(0o755)
    # mokutil likewise: Debian's mokutil package, once the product installs it, keeps its
    # binary at mokutil.distrib and the stand-in answers from the firmware state
    # (standin/mokutil; without EFI, as on a box without the fault, it answers as the real
    # one does in a container).
    subprocess.run(
        [
            "dpkg-divert",
            f"--root={root}",
            "--local",
            "--rename",
            "--divert",
            "/usr/bin/mokutil.distrib",
            "--add",
            "/usr/bin/mokutil",
        ],
        check=True,
        capture_output=True,
    )
    for path in ("usr/local/sbin/mokutil", "usr/bin/mokutil"):
        mokutil = root / path
        mokutil.parent.mkdir(parents=True, exist_ok=True)
        mokutil.write_bytes(standin.MOKUTIL.read_bytes())
        mokutil.chmod(0o755)
    boot_modules = _in_box(root, BOOT_MODULES)
    boot_modules.parent.mkdir(parents=True, exist_ok=True)
    boot_modules.write_bytes(standin.BOOT_MODULES.read_bytes())
    boot_modules.chmod(0o755)
    units = root / "etc/systemd/system"
    (units / BOOT_MODULES_UNIT).write_text(BOOT_MODULES_UNIT_TEXT)
    wants = units / "sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / BOOT_MODULES_UNIT
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{BOOT_MODULES_UNIT}")


def _in_box(root: Path, path: Path | str) -> Path:
    return root / str(path).lstrip("/")


# The faults ``plant_fault`` knows: name -> what it does.
FAULTS = {
    "gpu-missing": "GPU --gpu (default 1) falls off the bus: gone from lspci and nvidia-smi",
    "gpu-unbound": "GPU --gpu (default 1) stays on the bus but the driver does not bind it",
    "nvlink-down": "NVLink port --link (default 2) of GPU --gpu (default 0) and its peer go down",
    "persistence-off": "persistence mode reads Off even while nvidia-persistenced keeps it on",
    "secure-boot": "UEFI Secure Boot on, the DKMS signing key not enrolled (stand-in mokutil)",
    "secure-boot-enrolled": "Secure Boot on and the box's DKMS key (/var/lib/dkms/mok.pub, "
    "made as Debian's dkms makes it when missing) enrolled long ago",
    "desktop": "a graphical desktop: graphical.target, gdm.service (display-manager.service) "
    "running, user owner logged in to a Wayland session on seat0, nouveau driving the GT 710",
    "runfile-driver": "what NVIDIA's .run installer leaves: its files and nvidia-uninstall",
}


def hardware_state(info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The box's stand-in hardware state (standin/STATE.md), read from its root filesystem."""
    from gpubox.sandbox import standin
    from gpubox.sandbox.standin import state as standin_state

    info = info or box_info()
    return standin_state.load_state(_in_box(Path(info["rootfs"]), standin.STATE_PATH))


def save_hardware_state(new: dict[str, Any], info: dict[str, Any] | None = None) -> None:
    """Replace the box's stand-in hardware state (atomic; the stand-ins see it at once)."""
    from gpubox.sandbox import standin
    from gpubox.sandbox.standin import state as standin_state

    info = info or box_info()
    standin_state.save_state(new, _in_box(Path(info["rootfs"]), standin.STATE_PATH))


def _runner(info: dict[str, Any]) -> Callable[[str, str | None], subprocess.CompletedProcess[str]]:
    return lambda command, stdin: ssh(command, check=False, timeout=600, info=info, input=stdin)


def plant_fault(
    name: str,
    gpu: int | None = None,
    link: int | None = None,
    info: dict[str, Any] | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """Plant a fault (one of FAULTS) in the running box; returns the new stand-in state.

    Faults add up; ``clear_faults()`` restores the reference hardware and undoes what the
    firmware and desktop faults planted in the box. Configuration faults (a stopped service, a
    removed hold, ...) are planted over SSH instead: they are the box's. ``version``: the
    runfile driver's version (runfile-driver only)."""
    from gpubox.sandbox import faults
    from gpubox.sandbox.standin import state as standin_state

    info = info or box_info()
    current = hardware_state(info)
    if name == "gpu-missing":
        standin_state.set_gpu_present(current, 1 if gpu is None else gpu, False)
    elif name == "gpu-unbound":
        standin_state.set_gpu_driver_bound(current, 1 if gpu is None else gpu, False)
    elif name == "nvlink-down":
        standin_state.set_link_active(
            current, 0 if gpu is None else gpu, 2 if link is None else link, False
        )
    elif name == "persistence-off":
        standin_state.set_persistence_forced_off(current, True)
    elif name in ("secure-boot", "secure-boot-enrolled"):
        faults.plant_secure_boot(current, _runner(info), enrolled=name == "secure-boot-enrolled")
    elif name == "desktop":
        standin_state.set_display_driver(current, "nouveau")
        save_hardware_state(current, info)
        faults.plant_desktop(_runner(info))
    elif name == "runfile-driver":
        faults.plant_runfile(Path(info["rootfs"]), version)
    else:
        raise SandboxError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    save_hardware_state(current, info)
    return current


def clear_faults(info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Restore the reference hardware (standin.state.default_state(), without EFI) and undo
    what the secure-boot-enrolled and desktop faults planted in the box (the runfile-driver
    fault's files stay: a fresh box has none)."""
    from gpubox.sandbox import faults
    from gpubox.sandbox.standin import state as standin_state

    info = info or box_info()
    fresh = standin_state.t4_state() if info.get("box", 1) == 2 else standin_state.default_state()
    save_hardware_state(fresh, info)
    if Path(info["rootfs"], faults.MARKER_DIR.lstrip("/")).exists():
        ssh("bash -s", timeout=600, info=info, input=faults.clear_script())
    return fresh


def mok_screen(
    answer: str, password: str | None = None, info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What someone at the console does at the box's next boot's MOK screen: "enroll" with
    the password given to ``mokutil --import`` (pending keys become enrolled when it matches;
    a wrong one enrolls nothing), or "timeout" (nobody answers: the request is discarded, as
    MokManager does after about 10 s). It takes effect when the box boots again (a test then
    runs ``systemctl reboot`` and ``wait_ready(since_boot_id=...)``); a reboot without an
    answer is a timeout. Returns the new stand-in state."""
    from gpubox.sandbox.standin import state as standin_state

    info = info or box_info()
    current = hardware_state(info)
    try:
        standin_state.mok_screen(current, answer, password)
    except ValueError as exc:
        raise SandboxError(str(exc)) from exc
    save_hardware_state(current, info)
    return current


def _firmware_at_boot(rootfs: Path) -> str | None:
    """What the box's firmware does before the OS boots again: shim's MOK screen (applies the
    answer ``mok_screen`` prepared, or times out). Run by the supervisor before a reboot."""
    from gpubox.sandbox import standin
    from gpubox.sandbox.standin import state as standin_state

    path = _in_box(rootfs, standin.STATE_PATH)
    try:
        current = standin_state.load_state(path)
    except (OSError, ValueError):
        return None
    outcome = standin_state.apply_mok_screen(current)
    if outcome is not None:
        standin_state.save_state(current, path)
    return outcome


# --------------------------------------------------------------------------- check image


def load_check_image(info: dict[str, Any] | None = None) -> str:
    """The container image for the host checks, built in the box and loaded into its Docker
    (once; quick when it is there): busybox and python3 from the box's own Debian packages,
    enough to run the stand-in nvidia-smi that the stand-in container toolkit mounts. Needs
    Docker installed in the box. Returns the image name (box.json ``check_image``)."""
    from gpubox.sandbox import repo_debs

    info = info or box_info()
    name = info.get("check_image", CHECK_IMAGE)
    script = (repo_debs.PACKAGES_DIR / "check-image" / "build-check-image").read_text()
    result = ssh(["python3", "-", name], check=False, timeout=600, info=info, input=script)
    if result.returncode != 0 or result.stdout.strip().splitlines()[-1:] != [name]:
        raise SandboxError(
            f"could not build the check image {name} in the box (exit {result.returncode}):\n"
            f"{result.stderr}{result.stdout}"
        )
    return name


def load_exporter_image(info: dict[str, Any] | None = None) -> str:
    """The stand-in dcgm-exporter image, built in the box on the check image (loaded first)
    and loaded into its Docker (once; quick when it is there): the stand-in program and the
    recorded metrics of ``packages/dcgm-exporter``, and the product's own ``exporter_label.py``
    (the Hostname rule, written once). Returns the image name (box.json ``exporter_image``)."""
    from gpubox import exporter_label
    from gpubox.sandbox import repo_debs

    info = info or box_info()
    name = info.get("exporter_image", EXPORTER_IMAGE)
    check = load_check_image(info)
    here = repo_debs.PACKAGES_DIR / "dcgm-exporter"
    files = {
        "dcgm-exporter": (here / "dcgm-exporter").read_text(),
        "metrics.prom": (here / "metrics.prom").read_text(),
        "exporter_label.py": Path(exporter_label.__file__).read_text(),
    }
    script = f"FILES = {json.dumps(files)}\n" + (here / "build-exporter-image").read_text()
    result = ssh(["python3", "-", name, check], check=False, timeout=300, info=info, input=script)
    if result.returncode != 0 or result.stdout.strip().splitlines()[-1:] != [name]:
        raise SandboxError(
            f"could not build the stand-in exporter image {name} in the box "
            f"(exit {result.returncode}):\n{result.stderr}{result.stdout}"
        )
    return name


def load_check_images(
    progress: Progress = _stderr_progress,
) -> list[tuple[dict[str, Any], str | SandboxError]]:
    """load_check_image in every box that is up, box 1 first: (its box.json, the image's name
    or why it could not be loaded there). A box that fails does not keep the others from
    theirs. Raises SandboxNotUp when no box is up."""
    infos = box_infos()
    if not infos:
        raise SandboxNotUp("sandbox is not up: run gpubox sandbox up")
    results: list[tuple[dict[str, Any], str | SandboxError]] = []
    for info in infos:
        try:
            image = load_check_image(info)
        except SandboxError as exc:
            results.append((info, exc))  # the caller says why
        else:
            results.append((info, image))
            progress(f"{info['name']}: check image {image} loaded")
    return results


# --------------------------------------------------------------------------- state


def _read_state(sdir: Path) -> dict[str, Any] | None:
    try:
        return json.loads(_box_json(sdir).read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise SandboxError(f"{_box_json(sdir)} is not valid JSON ({exc})") from exc


def _write_state(sdir: Path, state: dict[str, Any]) -> None:
    path = _box_json(sdir)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def _lock(sdir: Path) -> Iterator[None]:
    sdir.mkdir(parents=True, exist_ok=True)
    with open(sdir / "lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise SandboxError(f"another gpubox sandbox command holds {sdir / 'lock'}") from exc
        yield


def box_info(sdir: Path | None = None) -> dict[str, Any]:
    """The running box's connection facts (box.json); raises SandboxNotUp if it is not up."""
    sdir = sdir or state_dir()
    state = _read_state(sdir)
    if state is None or state.get("state") != "up":
        raise SandboxNotUp("sandbox is not up: run gpubox sandbox up")
    if not _alive(state["processes"].get("supervisor")):
        raise SandboxNotUp(
            "sandbox is not running (its supervisor is gone): "
            "run gpubox sandbox down, then gpubox sandbox up"
        )
    current = _nspawn_record(sdir)  # a reboot starts a new nspawn under the same supervisor
    if current and current != state["processes"].get("nspawn"):
        state["processes"]["nspawn"] = current
    return state


def is_up(sdir: Path | None = None) -> bool:
    try:
        box_info(sdir)
    except SandboxNotUp:
        return False
    return True


# --------------------------------------------------------------------------- ssh


def _ensure_key(sdir: Path) -> Path:
    key = sdir / "id_ed25519"
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpubox-sandbox", "-f", str(key)],
            check=True,
        )
    return key


def _write_ssh_config(sdir: Path, key: Path) -> Path:
    path = sdir / "ssh_config"
    settings = (
        f"    HostName {SSH_HOST}\n"
        f"    Port {SSH_PORT}\n"
        f"    User {SSH_USER}\n"
        f"    IdentityFile {key}\n"
        "    IdentitiesOnly yes\n"
        "    StrictHostKeyChecking no\n"
        "    UserKnownHostsFile /dev/null\n"
        "    LogLevel ERROR\n"
    )
    path.write_text(
        "# gpubox sandbox: reach the box from inside its network namespace\n"
        "# (gpubox sandbox exec -- ssh -F THIS gpubox-sandbox; testinfra --ssh-config=THIS)\n"
        f"Host {NAME}\n{settings}\n"
        "# from any network namespace, through the box's own\n"
        f"Host {NAME}.fleet\n{settings}"
        f"    ProxyCommand {' '.join(proxy_command())}\n"
    )
    return path


def proxy_command(k: int | None = None) -> list[str]:
    """An ssh ProxyCommand that reaches box ``k``'s sshd through its network namespace."""
    k = BOX if k is None else k
    port = BASE_SSH_PORT + k - 1
    return ["ip", "netns", "exec", box_name(k), "socat", "STDIO", f"TCP:{SSH_HOST}:{port}"]


def netns_argv(argv: Sequence[str], netns: str | None = None) -> list[str]:
    """``argv`` run inside a box's network namespace (the current box's by default)."""
    return ["ip", "netns", "exec", netns or NAME, *argv]


def ssh_argv(info: dict[str, Any], command: Sequence[str] = (), tty: bool = False) -> list[str]:
    """An ssh command line into the box of ``info`` (to run on the host: it enters the
    box's namespace)."""
    options = ["-F", info["ssh_config"], "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    options.append("-t" if tty else "-T")
    alias = info.get("ssh_host_alias", NAME)
    argv = ["ssh", *options, alias, *(["--", *command] if command else [])]
    return netns_argv(argv, info.get("netns"))


def ssh(
    command: str | Sequence[str],
    check: bool = True,
    timeout: float | None = 300,
    info: dict[str, Any] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command in the box over SSH; returns stdout/stderr as text."""
    info = info or box_info()
    argv = ssh_argv(info, [command] if isinstance(command, str) else command)
    # input= or stdin=, never both (gevent's subprocess refuses stdin=None beside input=)
    feed: dict[str, Any] = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **feed)
    if check and result.returncode != 0:
        raise SandboxError(
            f"in the box: {command!r} exited {result.returncode}:\n{result.stderr}{result.stdout}"
        )
    return result


def wait_ready(
    timeout: float = READY_TIMEOUT_S,
    info: dict[str, Any] | None = None,
    since_boot_id: str | None = None,
) -> str:
    """Wait until the box answers over SSH and systemd has finished booting.

    Returns the system state ("running" or "degraded"). With ``since_boot_id``, first waits
    for a boot with a different boot id (after a reboot).
    """
    info = info or box_info()
    deadline = time.monotonic() + timeout
    last = ""
    script = "cat /proc/sys/kernel/random/boot_id; systemctl is-system-running --wait"
    while time.monotonic() < deadline:
        try:
            result = ssh(
                script, check=False, timeout=max(5.0, deadline - time.monotonic()), info=info
            )
        except subprocess.TimeoutExpired:
            break
        lines = result.stdout.split()
        if result.returncode != 255 and len(lines) >= 2 and lines[0] != since_boot_id:
            state = lines[-1]
            if state in ("running", "degraded"):
                return state
            last = state
        else:
            last = (result.stderr.strip().splitlines() or [""])[-1]
        time.sleep(0.2)
    log = Path(info["state_dir"]) / "logs" / "nspawn.log"
    tail = (
        "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        if log.exists()
        else ""
    )
    raise SandboxError(
        f"the box did not become ready in {timeout:.0f} s (last: {last!r});"
        f" console log {log}:\n{tail}"
    )


def failed_units(info: dict[str, Any] | None = None) -> str:
    return ssh("systemctl --failed --no-pager", check=False, info=info).stdout


# --------------------------------------------------------------------------- supervisor


def _nspawn_argv(rootfs: Path, ccache: Path) -> list[str]:
    return [
        "systemd-nspawn",
        "--quiet",
        "--register=no",  # required when the host's PID 1 is not systemd
        "--keep-unit",
        "--console=read-only",
        "-M",
        NAME,
        "-D",
        str(rootfs),
        f"--network-namespace-path={NETNS_PATH}",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        f"--bind={ccache}:{CCACHE_DIR}",
        # the box's own loaded kernel modules, empty at every boot (the host's /sys/module is
        # read-only in the box and shows the host's): the stand-in module units write there
        "--tmpfs=/sys/module:mode=0755",
        # Docker inside the box: iptables/bridges, runc's keyring and
        # cgroup v2 device filter.
        "--capability=CAP_NET_ADMIN",
        "--system-call-filter=@keyring bpf",
        "--boot",
    ]


def _supervise(sdir: Path) -> int:
    """The supervisor: boot the box, boot it again after a reboot (exit 133), stop otherwise."""
    spec = json.loads((sdir / "nspawn.json").read_text())
    stop_flag = sdir / "stopping"
    log_path = sdir / "logs" / "nspawn.log"
    env = dict(os.environ, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1")
    current: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for proc in current:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    boots = 0
    while not stopping and not stop_flag.exists():
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                spec["argv"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        current[:] = [proc]
        boots += 1
        record: dict[str, Any] = {
            "pid": proc.pid,
            "start_time": process_start_time(proc.pid) or 0,
            "boot": boots,
        }
        _write_nspawn_record(sdir, record)
        print(f"{time.strftime('%H:%M:%S')} boot {boots}: nspawn pid {proc.pid}", flush=True)
        # The box's init (PID 1 of its PID namespace): down needs it if nspawn dies first,
        # since the box's processes outlive a killed nspawn.
        deadline = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < deadline:
            init = _box_init(record)
            if init is not None:
                record["init"] = init
                record["pid_namespace"] = _namespace(init["pid"])
                _write_nspawn_record(sdir, record)
                break
            time.sleep(0.02)
        while True:
            try:
                rc = proc.wait()
                break
            except InterruptedError:
                continue
        current.clear()
        print(f"{time.strftime('%H:%M:%S')} nspawn exited with status {rc}", flush=True)
        if rc != NSPAWN_REBOOT_STATUS:
            break
        print(f"{time.strftime('%H:%M:%S')} the box rebooted: booting it again", flush=True)
        if "rootfs" in spec:
            outcome = _firmware_at_boot(Path(spec["rootfs"]))
            if outcome:
                print(f"{time.strftime('%H:%M:%S')} MOK screen: {outcome}", flush=True)
    # nspawn.pid stays: down reads the box's init from it (the box outlives a killed nspawn)
    return 0


def _write_nspawn_record(sdir: Path, record: dict[str, Any]) -> None:
    tmp = sdir / "nspawn.pid.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, sdir / "nspawn.pid")


def _nspawn_full_record(sdir: Path) -> dict[str, Any]:
    try:
        record: dict[str, Any] = json.loads((sdir / "nspawn.pid").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return record


def _nspawn_record(sdir: Path) -> dict[str, int] | None:
    try:
        record = json.loads((sdir / "nspawn.pid").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return {"pid": record["pid"], "start_time": record["start_time"]}


# --------------------------------------------------------------------------- served files


def ensure_served_files(progress: Progress = _quiet) -> tuple[dict[str, Path], dict[str, Any]]:
    """What the loopback server publishes beside the stand-in repositories, from caches of
    their own: the catalog's llama.cpp source (PyPI's llama-cpp-python sdist, unchanged, at a
    path that mirrors files.pythonhosted.org), the tiny GGUF model and the stand-in 1Panel
    release package (onepanel.py). Returns (URL path -> file, the box.json facts)."""
    from gpubox.sandbox import llamacpp, onepanel, tinymodel

    try:
        source = llamacpp.ensure_sdist(cache_dir() / "llamacpp", progress)
        model = tinymodel.ensure(cache_dir() / "models")
    except (llamacpp.LlamaCppSourceError, tinymodel.TinyModelError) as exc:
        raise SandboxError(str(exc)) from exc
    server = f"http://127.0.0.1:{REPO_PORT}/"
    files = {
        source["served_path"]: Path(source["path"]),
        tinymodel.URL_PATH: Path(model["path"]),
    }
    panel = onepanel.ensure(cache_dir() / "1panel")
    files.update(panel["files"])
    facts: dict[str, Any] = {
        # the only llama.cpp override of the sandbox inventory: a PyPI mirror's URL
        "llamacpp_url": server + source["served_path"],
        "model_url": server + tinymodel.URL_PATH,
        "model_file": model["file"],
        "model_sha256": model["sha256"],
        "model_size": model["size"],
        "model_reply": model["reply"],
        **onepanel.facts(server, panel),
    }
    return files, facts


def _prepare_hub(
    sdir: Path, served: dict[str, Path], progress: Progress
) -> tuple[list[str], dict[str, Any]]:
    """The Hub and PyPI mirror's arguments and box.json facts (hub.py): the tiny model in a
    Hub repository, the wheels of the hf tool in a simple index."""
    from gpubox.sandbox import hub, pypi, tinymodel

    try:
        return hub.prepare(cache_dir(), sdir, served[tinymodel.URL_PATH], progress)
    except pypi.PyPIMirrorError as exc:
        raise SandboxError(str(exc)) from exc


# --------------------------------------------------------------------------- up / down


def up(
    rebuild: bool = False, progress: Progress = _stderr_progress, sdir: Path | None = None
) -> dict[str, Any]:
    """Bring the box up (if it is not) and return its box.json facts."""
    check_host()
    sdir = sdir or state_dir()
    with _lock(sdir):
        state = _read_state(sdir)
        if state is not None:
            if (
                state.get("state") == "up"
                and _alive(state["processes"].get("supervisor"))
                and not rebuild
            ):
                progress("the sandbox is already up")
                return state
            progress("cleaning up the previous sandbox first")
            _down(sdir, state, progress)
        elif NETNS_PATH.exists():
            raise SandboxError(
                f"network namespace {NAME} exists but this state dir ({sdir}) has no box: "
                "another gpubox sandbox (other GPUBOX_STATE_DIR?) may be up; bring it down "
                f"there, or remove the namespace with: ip netns delete {NAME}"
            )
        return _up(sdir, rebuild, progress)


def _up(sdir: Path, rebuild: bool, progress: Progress) -> dict[str, Any]:
    from gpubox.sandbox import repo_build

    started = time.monotonic()
    mirror = debian_mirror()
    mirror_host, mirror_port = _host_port(mirror)
    pristine = ensure_rootfs(rebuild=rebuild, progress=progress)
    repo = repo_build.ensure_repo(cache_dir() / "repo", rebuild=rebuild, progress=progress)
    served, served_facts = ensure_served_files(progress)
    hub_args, hub_facts = _prepare_hub(sdir, served, progress)
    ccache = cache_dir() / "ccache"
    ccache.mkdir(parents=True, exist_ok=True)

    boxes = cache_dir() / "boxes" / NAME
    boxes.mkdir(parents=True, exist_ok=True)
    box_dir = boxes / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    rootfs = box_dir / "rootfs"
    (sdir / "logs").mkdir(parents=True, exist_ok=True)
    for stale in ("stopping", "nspawn.pid", "mirror.sock", "ssh.sock"):
        (sdir / stale).unlink(missing_ok=True)
    key = _ensure_key(sdir)
    known_hosts = sdir / "known_hosts"
    known_hosts.write_text("")  # a new box may have new host keys on the same address
    ssh_config = _write_ssh_config(sdir, key)

    state: dict[str, Any] = {
        "name": NAME,
        "box": BOX,
        "state": "starting",
        "state_dir": str(sdir),
        "rootfs": str(rootfs),
        "netns": NAME,
        "netns_path": str(NETNS_PATH),
        "ssh_hostname": SSH_HOST,
        "ssh_port": SSH_PORT,
        "ssh_user": SSH_USER,
        "ssh_key": str(key),
        "ssh_known_hosts_file": str(known_hosts),
        "ssh_config": str(ssh_config),
        "ssh_host_alias": NAME,
        "debian_mirror": mirror,
        "check_image": CHECK_IMAGE,
        "exporter_image": EXPORTER_IMAGE,
        "processes": {},
    }
    state.update(repo_build.repo_facts(repo, REPO_PORT))
    state.update(served_facts)
    state.update(hub_facts)
    state.update(ccache_dir=CCACHE_DIR, ccache_host_dir=str(ccache))
    _write_state(sdir, state)

    try:
        t0 = time.monotonic()
        progress(f"copying the root filesystem to {rootfs}")
        box_dir.mkdir()
        subprocess.run(["cp", "-a", "--reflink=auto", str(pristine), str(rootfs)], check=True)
        (rootfs / ".gpubox-rootfs-complete").unlink(missing_ok=True)
        _prepare_box_rootfs(rootfs, mirror, Path(f"{key}.pub").read_text())
        _clean_old_boxes(boxes, box_dir)
        state["timings"] = {"copy_s": round(time.monotonic() - t0, 2)}

        # network namespace: lo only; forwarding on for Docker's bridge inside the box
        subprocess.run(["ip", "netns", "add", NAME], check=True)
        subprocess.run(["ip", "-n", NAME, "link", "set", "lo", "up"], check=True)
        subprocess.run(netns_argv(["sysctl", "-qw", "net.ipv4.ip_forward=1"]), check=True)

        # the Debian mirror, bridged into the namespace through a unix socket
        sock = sdir / "mirror.sock"
        procs = state["processes"]
        procs["mirror_socat_host"] = _spawn(
            [
                "socat",
                f"UNIX-LISTEN:{sock},fork,unlink-early,mode=600",
                f"TCP:{mirror_host}:{mirror_port}",
            ],
            sdir / "logs" / "socat-host.log",
        )
        _write_state(sdir, state)
        _wait_for(lambda: sock.exists(), 5, "the host side of the mirror bridge")
        procs["mirror_socat_netns"] = _spawn(
            netns_argv(
                [
                    "socat",
                    f"TCP-LISTEN:{mirror_port},bind=127.0.0.1,reuseaddr,fork",
                    f"UNIX-CONNECT:{sock}",
                ]
            ),
            sdir / "logs" / "socat-netns.log",
        )
        _write_state(sdir, state)

        # the supervisor, then the stand-in repository server (which exits with it)
        (sdir / "nspawn.json").write_text(
            json.dumps({"argv": _nspawn_argv(rootfs, ccache), "rootfs": str(rootfs)})
        )
        procs["supervisor"] = _spawn(
            [sys.executable, "-c", _HELPER.format(module="box"), "supervise", str(sdir)],
            sdir / "logs" / "supervisor.log",
            env=_child_env(),
        )
        _write_state(sdir, state)
        procs["repo_server"] = _spawn_server(
            sdir,
            "repo",
            [
                "--root",
                str(repo),
                "--bind",
                "127.0.0.1",
                "--port",
                str(REPO_PORT),
                *(f"--file={url_path}={path}" for url_path, path in served.items()),
            ],
            procs["supervisor"],
        )
        _write_state(sdir, state)
        _wait_for(
            lambda: _listening(procs["mirror_socat_netns"], mirror_port),
            5,
            "the namespace side of the mirror bridge",
        )
        _wait_for(
            lambda: _listening(procs["repo_server"], REPO_PORT),
            10,
            "the stand-in repository server",
        )
        # the Hugging Face Hub and PyPI mirror (hub.py), which exits with the supervisor too
        procs["hub_server"] = _spawn_server(sdir, "hub", hub_args, procs["supervisor"])
        _write_state(sdir, state)
        _wait_for(lambda: _listening(procs["hub_server"], HUB_PORT), 10, "the Hub and PyPI mirror")
        if BOX > 1:
            _bridge_ssh(sdir, procs)
            _write_state(sdir, state)
        _wait_for(lambda: _nspawn_record(sdir) is not None, 10, "systemd-nspawn to start")
        procs["nspawn"] = _nspawn_record(sdir)
        t1 = time.monotonic()
        progress("booting the box")
        system_state = wait_ready(info=state)
        state["timings"]["boot_s"] = round(time.monotonic() - t1, 2)
    except BaseException:
        progress("bringing the half-started sandbox down again")
        with contextlib.suppress(Exception):
            _down(sdir, state, _quiet)
        raise

    state["state"] = "up"
    state["system_state"] = system_state
    state["timings"]["up_s"] = round(time.monotonic() - started, 2)
    _write_state(sdir, state)
    progress(
        f"up in {state['timings']['up_s']:.1f} s: {state['repo_url']} and "
        f"ssh {SSH_USER}@{SSH_HOST}:{SSH_PORT} inside network namespace {NAME}"
    )
    if system_state != "running":
        raise SandboxError(
            f"the box is up but {system_state}; failed units:\n" + failed_units(state)
        )
    return state


def _bridge_ssh(sdir: Path, procs: dict[str, Any]) -> None:
    """Box k's sshd, reachable at 127.0.0.1:SSH_PORT in box 1's network namespace too, where
    pyinfra, the host checks and doctor run for the sandbox (gpubox sandbox exec): a socat
    pair through a unix socket, as the Debian mirror's bridge."""
    fleet_netns = Path("/run/netns") / BASE_NAME
    if not fleet_netns.exists():
        raise SandboxError(f"box {BOX} needs box 1 up first (its namespace {BASE_NAME})")
    sock = sdir / "ssh.sock"
    procs["ssh_bridge_box"] = _spawn(
        netns_argv(
            [
                "socat",
                f"UNIX-LISTEN:{sock},fork,unlink-early,mode=600",
                f"TCP:{SSH_HOST}:{SSH_PORT}",
            ]
        ),
        sdir / "logs" / "ssh-bridge-box.log",
    )
    _wait_for(lambda: sock.exists(), 5, "the box side of the ssh bridge")
    procs["ssh_bridge_fleet"] = _spawn(
        netns_argv(
            [
                "socat",
                f"TCP-LISTEN:{SSH_PORT},bind={SSH_HOST},reuseaddr,fork",
                f"UNIX-CONNECT:{sock}",
            ],
            BASE_NAME,
        ),
        sdir / "logs" / "ssh-bridge-fleet.log",
    )


def up_boxes(
    count: int, rebuild: bool = False, progress: Progress = _stderr_progress
) -> list[dict[str, Any]]:
    """Boxes 1 to ``count`` up (one after another: they share the caches); their box.json."""
    if not 1 <= count <= MAX_BOXES:
        raise SandboxError(f"--boxes {count}: the sandbox runs 1 to {MAX_BOXES} boxes")
    current, infos = BOX, []
    try:
        for k in range(1, count + 1):
            use_box(k)
            named = progress if k == 1 else _named(progress, NAME)
            infos.append(up(rebuild=rebuild and k == 1, progress=named))
    finally:
        use_box(current)
    return infos


def down_all(progress: Progress = _stderr_progress) -> list[dict[str, Any]]:
    """Every box down (those with a state or a network namespace); a report per box."""
    current, reports = BOX, []
    try:
        for k in range(MAX_BOXES, 0, -1):  # box 1 last: the others' ssh bridges run in its netns
            use_box(k)
            if k > 1 and not (state_dir() / "box.json").exists() and not NETNS_PATH.exists():
                continue
            reports.append(down(progress if k == 1 else _named(progress, NAME)))
    finally:
        use_box(current)
    return reports


def box_infos() -> list[dict[str, Any]]:
    """box.json of every box that is up, box 1 first."""
    infos = []
    for k in range(1, MAX_BOXES + 1):
        with contextlib.suppress(SandboxNotUp):
            infos.append(box_info(state_dir(k)))
    return infos


def _named(progress: Progress, name: str) -> Progress:
    return lambda message: progress(f"{name}: {message}")


def _listening(record: dict[str, int], port: int) -> bool:
    """Whether anything listens on TCP ``port`` in the namespace of process ``record``."""
    if not _alive(record):
        raise SandboxError(f"process {record['pid']} exited (see the logs in the state dir)")
    try:
        table = Path(f"/proc/{record['pid']}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    want = f":{port:04X}"
    return any(line.split()[1].endswith(want) and line.split()[3] == "0A" for line in table)


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SandboxError(f"timed out waiting for {what}")
        time.sleep(0.05)


def down(progress: Progress = _stderr_progress, sdir: Path | None = None) -> dict[str, Any]:
    """Power the box off and remove everything ``up`` started. Returns a report dict."""
    check_host()
    sdir = sdir or state_dir()
    with _lock(sdir):
        state = _read_state(sdir)
        if state is None:
            leftover = NETNS_PATH.exists()
            if leftover:
                raise SandboxError(
                    f"no sandbox in {sdir}, but network namespace {NAME} exists "
                    f"(another state dir?); remove it with: ip netns delete {NAME}"
                )
            progress("the sandbox is not up")
            return {"was_up": False}
        return _down(sdir, state, progress)


def _down(sdir: Path, state: dict[str, Any], progress: Progress) -> dict[str, Any]:
    started = time.monotonic()
    procs: dict[str, dict[str, int]] = state.get("processes", {})
    (sdir / "stopping").write_text("")  # the supervisor must not boot the box again
    nspawn = _nspawn_record(sdir) or procs.get("nspawn")
    record = _nspawn_full_record(sdir)
    init = record.get("init") or _box_init(nspawn)
    pid_namespace = record.get("pid_namespace") or box_pid_namespace(nspawn)
    supervisor = procs.get("supervisor")
    rootfs = Path(state["rootfs"])
    if _alive(nspawn):
        progress("powering the box off")
        _signal(nspawn, signal.SIGTERM)  # nspawn turns SIGTERM into an orderly poweroff
    elif _alive(init):
        # nspawn is gone but the box runs on (it outlives a killed nspawn): no orderly way left
        progress("systemd-nspawn is gone but the box still runs: killing its init")
        _signal(init, signal.SIGKILL)
    _signal(supervisor, signal.SIGTERM)  # forwards SIGTERM to a nspawn it started meanwhile
    if not _wait_gone([nspawn, supervisor], STOP_TIMEOUT_S):
        progress(f"the box did not power off in {STOP_TIMEOUT_S:.0f} s: killing it")
        latest = _nspawn_record(sdir)
        for rec in (nspawn, latest, supervisor):
            _signal(rec, signal.SIGKILL)
        _wait_gone([nspawn, latest, supervisor], 10)
    # killing PID 1 of the box's PID namespace takes every process in the box with it
    if _signal(init, signal.SIGKILL):
        _wait_gone([init], 10)
    for name in (
        "ssh_bridge_fleet",
        "ssh_bridge_box",
        "hub_server",
        "repo_server",
        "mirror_socat_netns",
        "mirror_socat_host",
    ):
        _stop(procs.get(name))
    # the box's own processes die with its PID namespace's init; make sure, by PID
    for pid in processes_in_namespace(pid_namespace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes_in_namespace(pid_namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    if NETNS_PATH.exists():
        subprocess.run(["ip", "netns", "delete", NAME], check=False)
    with contextlib.suppress(OSError):  # nspawn's lock file for the box's directory
        st = rootfs.stat()
        Path(f"/run/systemd/nspawn/locks/inode-{st.st_dev}:{st.st_ino}").unlink()
    for name in ("mirror.sock", "ssh.sock", "nspawn.pid", "nspawn.json"):
        (sdir / name).unlink(missing_ok=True)

    problems = []
    alive = [f"{n} ({r['pid']})" for n, r in procs.items() if _alive(r)]
    if alive:
        problems.append("still running: " + ", ".join(alive))
    if processes_in_namespace(pid_namespace):
        problems.append(f"processes still in the box: {processes_in_namespace(pid_namespace)}")
    if rootfs.exists() and mounts_under(rootfs):
        problems.append(f"mounts left under {rootfs}: {mounts_under(rootfs)}")
    if NETNS_PATH.exists():
        problems.append(f"network namespace {NAME} still exists")
    if problems:
        raise SandboxError("down left things behind: " + "; ".join(problems))
    last = sdir / "last-box.json"
    with contextlib.suppress(FileNotFoundError):
        os.replace(_box_json(sdir), last)
    (sdir / "stopping").unlink(missing_ok=True)
    seconds = time.monotonic() - started
    progress(f"down in {seconds:.1f} s")
    return {
        "was_up": True,
        "down_s": round(seconds, 2),
        "rootfs": str(rootfs),
        "pid_namespace": pid_namespace,
    }


def status(sdir: Path | None = None) -> dict[str, Any]:
    """What is known about the box: {"up": bool, ...box.json facts, "system_state"}."""
    sdir = sdir or state_dir()
    state = _read_state(sdir)
    if state is None:
        return {"up": False, "state_dir": str(sdir)}
    report = dict(state)
    procs = state.get("processes", {})
    nspawn = _nspawn_record(sdir)
    if nspawn:
        report["processes"] = dict(procs, nspawn=nspawn)
    report["alive"] = {name: _alive(rec) for name, rec in report["processes"].items()}
    report["up"] = state.get("state") == "up" and report["alive"].get("supervisor", False)
    if report["up"]:
        result = ssh("systemctl is-system-running", check=False, timeout=20, info=state)
        report["system_state"] = result.stdout.strip() or result.stderr.strip()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Internal entry point of our detached helper processes."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "supervise":
        return _supervise(Path(args[1]))
    print("usage: python -m gpubox.sandbox.box supervise STATE_DIR", file=sys.stderr)
    return 2


def plant_kernel(
    version: str,
    headers: bool = True,
    run_hooks: bool = True,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Plant a second stand-in kernel in the running box, as if a kernel update had installed
    ``linux-image-<version>`` (and ``linux-headers-<version>`` with ``headers``). With
    ``run_hooks`` it then runs what those packages' postinst scripts run for DKMS:
    ``run-parts --arg=<version> /etc/kernel/header_postinst.d`` (headers) and DKMS's
    ``/etc/kernel/postinst.d/dkms <version> /boot/vmlinuz-<version>`` (image; the other image
    hooks, such as initramfs-tools', are not run for a stand-in kernel). Returns what was
    planted and the hooks' output; afterwards ``dkms status`` in the box shows whether the
    NVIDIA module was built for the new kernel (only with its headers)."""
    from gpubox.sandbox import kernel

    info = info or box_info()
    kernel.check_version(version)
    root = Path(info["rootfs"])
    written = kernel.install_kernel(root, version, headers)
    out: dict[str, Any] = {"version": version, "headers": headers, "files": written, "hooks": []}
    if run_hooks:
        commands = []
        if headers:
            commands.append(
                "if [ -d /etc/kernel/header_postinst.d ]; then run-parts --report "
                f"--exit-on-error --arg={version} /etc/kernel/header_postinst.d; fi"
            )
        commands.append(
            "if [ -x /etc/kernel/postinst.d/dkms ]; then /etc/kernel/postinst.d/dkms "
            f"{version} /boot/vmlinuz-{version}; fi"
        )
        for command in commands:
            result = ssh(command, check=False, timeout=600, info=info)
            out["hooks"].append(
                {
                    "command": command,
                    "returncode": result.returncode,
                    "output": result.stdout + result.stderr,
                }
            )
            if result.returncode != 0:
                raise SandboxError(
                    f"in the box: the kernel hook for {version} failed "
                    f"({result.returncode}): {command}\n{result.stderr}{result.stdout}"
                )
    return out


if __name__ == "__main__":
    sys.exit(main())
