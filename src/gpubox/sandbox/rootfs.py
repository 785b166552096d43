"""The root filesystem of a sandbox box: the recipe (debootstrap of Debian 12 with the
packages a fresh install has, and what the sandbox changes), the pristine tree built once per
recipe hash and cached, and each box's own copy prepared for it (SSH key, identity, apt
sources through the bridged Debian mirror, hosts, no DNS, the stand-in "hardware" and a
stand-in of the running kernel's image and headers for DKMS). Old copies are deleted in
detached processes (deleting takes long)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpubox.sandbox import kernel, standin
from gpubox.sandbox.box_ssh import SSHD_DROPIN, SSHD_DROPIN_PATH, sshd_dropin
from gpubox.sandbox.common import SUITE, SandboxError, cache_dir, debian_mirror, host_apt_sources
from gpubox.sandbox.identity import BASE_NAME, Box
from gpubox.sandbox.processes import mounts_under
from gpubox.sandbox.standin import state as standin_state

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


Progress = Callable[[str], None]


def stderr_progress(message: str) -> None:
    print(f"gpubox sandbox: {message}", file=sys.stderr, flush=True)


def quiet(message: str) -> None:
    pass


# --------------------------------------------------------------------------- Debian mirror


def _security_mirror(mirror: str) -> str | None:
    """The host's bookworm-security URL, if it is on the same host:port as the mirror."""
    want = host_port(mirror)
    for uri, suite in host_apt_sources():
        if suite == f"{SUITE}-security" and host_port(uri) == want:
            return uri.rstrip("/")
    return None


def host_port(url: str) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise SandboxError(f"the Debian mirror must be an http(s) URL, not {url!r}")
    return parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)


# --------------------------------------------------------------------------- the pristine tree


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
    dest: Path, mirror: str, progress: Progress = stderr_progress, log: Path | None = None
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


def ensure_rootfs(rebuild: bool = False, progress: Progress = stderr_progress) -> Path:
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
            delete_in_background(pristine, base)
        tmp.rename(pristine)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in base.iterdir():  # pristine trees of older recipes
        if old.is_dir() and old != pristine and not old.name.startswith("."):
            if ".building-" in old.name:
                continue
            delete_in_background(old, base)
        elif old.suffix == ".log" and old.stem != pristine.name:
            old.unlink()
    return pristine


def remove_detached(path: Path) -> None:
    """``rm -rf`` of ``path`` (not crossing into other file systems) in a detached process."""
    subprocess.Popen(
        ["rm", "-rf", "--one-file-system", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def delete_in_background(path: Path, trash_parent: Path) -> None:
    """Move ``path`` aside and delete it in a detached process (deleting takes long)."""
    trash = trash_parent / f".trash-{path.name}-{secrets.token_hex(4)}"
    try:
        path.rename(trash)
    except OSError:
        return
    remove_detached(trash)


def clean_old_boxes(boxes: Path, keep: Path) -> None:
    for old in boxes.iterdir():
        if old == keep or old.name.startswith(".trash-"):
            continue
        if old.is_dir() and not mounts_under(old):
            delete_in_background(old, boxes)
    for trash in boxes.glob(".trash-*"):  # an interrupted earlier deletion
        remove_detached(trash)


def prepare_box_rootfs(root: Path, box: Box, mirror: str, pubkey: str) -> None:
    """Per-box settings of a fresh copy: keys, identity, apt sources, hosts, hardware, and a
    stand-in of the running kernel's image and headers (for DKMS)."""
    (root / SSHD_DROPIN_PATH).write_text(sshd_dropin(box.ssh_port))
    (root / "etc/hostname").write_text(box.name + "\n")
    (root / "root/.ssh/authorized_keys").write_text(pubkey)
    os.chmod(root / "root/.ssh/authorized_keys", 0o600)
    (root / "etc/machine-id").write_text(secrets.token_hex(16) + "\n")
    mirror_host, _ = host_port(mirror)
    (root / "etc/hosts").write_text(
        "# gpubox sandbox: the Debian mirror is bridged to 127.0.0.1 inside the box's\n"
        "# network namespace (a socat pair through a unix socket on the host).\n"
        "127.0.0.1\tlocalhost\n"
        f"127.0.1.1\t{box.name}\n"
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
    install_hardware(root, box)
    # The box runs the host's kernel: a stand-in of its image and headers, so that Debian's
    # real dkms builds the (stand-in) NVIDIA module for it (kernel.py, STANDINS.md).
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


def reference_hardware(k: int) -> dict[str, Any]:
    """Box ``k``'s stand-in hardware as it boots (standin/STATE.md): two V100s with NVLink;
    box 2, one Tesla T4."""
    return standin_state.t4_state() if k == 2 else standin_state.default_state()


def _divert_to_standin(root: Path, name: str, source: Path) -> None:
    """/usr/bin/NAME past a local dpkg diversion (the package's own binary, once installed,
    lands at NAME.distrib), and the stand-in at /usr/local/sbin/NAME and /usr/bin/NAME."""
    subprocess.run(
        [
            "dpkg-divert",
            f"--root={root}",
            "--local",
            "--rename",
            "--divert",
            f"/usr/bin/{name}.distrib",
            "--add",
            f"/usr/bin/{name}",
        ],
        check=True,
        capture_output=True,
    )
    for path in (f"usr/local/sbin/{name}", f"usr/bin/{name}"):
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(0o755)


def install_hardware(root: Path, box: Box) -> None:
    """The box's stand-in "hardware": the GPU state file, the lspci and mokutil stand-ins (in
    /usr/local/sbin, and in /usr/bin past a local diversion of pciutils' lspci and mokutil's
    own), and the boot unit of the display card's module."""
    standin_state.save_state(reference_hardware(box.number), in_box(root, standin.STATE_PATH))
    # Maintainer scripts run with apt's DPkg::Path (/usr/sbin:/usr/bin:/sbin:/bin), without
    # /usr/local/sbin: Debian's nvidia-legacy-check preinst runs `lspci -mn` (STANDINS.md). A
    # local dpkg diversion keeps pciutils' own lspci, once installed, at lspci.distrib, so the
    # stand-in answers in /usr/bin too.
    _divert_to_standin(root, "lspci", standin.LSPCI)
    # mokutil likewise: Debian's mokutil package, once the product installs it, keeps its
    # binary at mokutil.distrib and the stand-in answers from the firmware state
    # (standin/mokutil; without EFI, as on a box without the fault, it answers as the real
    # one does in a container).
    _divert_to_standin(root, "mokutil", standin.MOKUTIL)
    boot_modules = in_box(root, BOOT_MODULES)
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


def in_box(root: Path, path: Path | str) -> Path:
    """``path`` in the box, seen from the host (under the box's root filesystem)."""
    return root / str(path).lstrip("/")
