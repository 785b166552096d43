"""The sandbox's stand-in for a driver installed by NVIDIA's ``.run`` installer: ``plant``
writes into a box's root filesystem what such an install leaves (the facts and their sources
are in gpubox.infra.runfile's docstring), so a deploy meets it as it would on a real box.

What is planted (``root`` is the box's root directory on the host; V is ``version``):

- ``/usr/bin/nvidia-installer``: a small sh script standing in for the installer. Only its
  uninstall mode is there: run as ``/usr/bin/nvidia-uninstall`` (or with ``--uninstall``) it
  does what NVIDIA's do_uninstall does with the backup log (nvidia-installer 580.95.05,
  backup.c): removes every installed file and link the log lists, removes the DKMS
  registration (the real one runs ``dkms remove -m nvidia -v V --all``), removes the
  directories the install created (``/var/lib/nvidia/dirs``), then ``/var/lib/nvidia``; writes
  ``/var/log/nvidia-uninstall.log``; exits 0 (the real uninstall mode always does). It leaves
  ``/var/log/nvidia-installer.log``, as the real one does. ``$GPUBOX_STANDIN_ROOT`` prefixes
  every path it touches (the unit tests run it on a planted tree).
- ``/usr/bin/nvidia-uninstall``: a link to ``nvidia-installer`` (the real uninstaller is the
  installer under that name: nvidia-installer.c).
- ``/var/lib/nvidia/log`` (0600, directory 0700, backup.c): ``1.0-<digits> (V)``, the
  description, then ``1: PATH`` + CRC for each file and ``0: PATH`` + target for each link.
  The CRCs are 0 here (the real ones are the files' CRC32; the stand-in never checks them).
- ``/var/log/nvidia-installer.log``: the header log.c writes (format of the real headers in
  tests/fixtures/runfile/), with the command line of a silent DKMS install.
- the libraries at their real paths in ``/usr/lib/x86_64-linux-gnu`` (``libcuda.so.V``,
  ``libcudadebugger.so.V``, ``libnvidia-ml.so.V``, ``libnvidia-nvvm.so.V``,
  ``libnvidia-ptxjitcompiler.so.V`` and their ``.so.1``/``.so.4`` links): **empty files**, not
  libraries (the sandbox has no GPU; ldconfig skips empty files);
- ``/usr/bin/nvidia-smi``: a script printing what the real one prints when no NVIDIA module is
  loaded ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver...",
  exit 9), which is the state of a runfile install inside a container;
- the module sources ``/usr/src/nvidia-V/dkms.conf`` (the real tree holds the whole kernel
  source; the stand-in only the dkms.conf naming module ``nvidia`` at V) and the DKMS
  registration ``/var/lib/dkms/nvidia/V/source`` -> ``/usr/src/nvidia-V`` (what ``dkms
  ldtarball``/``dkms add`` leave);
- with ``kernel`` given, the module files of a DKMS-less install:
  ``/lib/modules/<kernel>/kernel/drivers/video/nvidia{,-modeset,-drm,-uvm}.ko`` (empty).

A path that already exists is never overwritten (the real installer backs such files up to
``/var/lib/nvidia/100``...; the stand-in leaves them alone and does not list them), so the
uninstaller removes exactly what ``plant`` wrote.
"""

from __future__ import annotations

import os
from pathlib import Path

DESCRIPTION = "NVIDIA Accelerated Graphics Driver for Linux-x86_64"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
LIBRARIES = {  # library -> its soname link (None: no link)
    "libcuda.so": "libcuda.so.1",
    "libcudadebugger.so": "libcudadebugger.so.1",
    "libnvidia-ml.so": "libnvidia-ml.so.1",
    "libnvidia-nvvm.so": "libnvidia-nvvm.so.4",
    "libnvidia-ptxjitcompiler.so": "libnvidia-ptxjitcompiler.so.1",
}
MODULES = ("nvidia", "nvidia-modeset", "nvidia-drm", "nvidia-uvm")

NVIDIA_SMI = """#!/bin/sh
# gpubox sandbox stand-in: the runfile's nvidia-smi with no NVIDIA module loaded (the real
# one's message and exit status 9 in that state).
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. \
Make sure that the latest NVIDIA driver is installed and running."
exit 9
"""

INSTALLER = r"""#!/bin/sh
# gpubox sandbox stand-in for NVIDIA's nvidia-installer @VERSION@ (installed by its .run as
# /usr/bin/nvidia-installer, with the link /usr/bin/nvidia-uninstall). Only the uninstall mode
# is here, after NVIDIA/nvidia-installer backup.c do_uninstall: remove what the backup log
# /var/lib/nvidia/log lists, the DKMS registration, the directories of /var/lib/nvidia/dirs,
# then /var/lib/nvidia; log to /var/log/nvidia-uninstall.log; exit 0 (the real uninstall mode
# always exits 0). $GPUBOX_STANDIN_ROOT prefixes every path (tests).
R="${GPUBOX_STANDIN_ROOT:-}"
mode=install
silent=
case "${0##*/}" in nvidia-uninstall) mode=uninstall ;; esac
for a in "$@"; do
    case "$a" in
        --uninstall) mode=uninstall ;;
        -s | --silent) silent=1 ;;
        -v | --version) echo "nvidia-installer:  version @VERSION@"; exit 0 ;;
    esac
done
if [ "$mode" != uninstall ]; then
    echo "gpubox stand-in nvidia-installer: only --uninstall is implemented" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ] && [ -z "$R" ]; then
    echo "ERROR: nvidia-installer must be run as root" >&2
    exit 1
fi
mkdir -p "$R/var/log"
ulog="$R/var/log/nvidia-uninstall.log"
{
    echo "nvidia-installer log file '/var/log/nvidia-uninstall.log'"
    echo "creation time: $(date)"
    echo "installer version: @VERSION@"
    echo
} >"$ulog"
log="$R/var/lib/nvidia/log"
if [ ! -r "$log" ]; then
    echo "There is no NVIDIA driver currently installed." >>"$ulog"
    [ -n "$silent" ] || echo "There is no NVIDIA driver currently installed."
    exit 0
fi
{
    read -r version
    read -r description
    while read -r head; do
        num=${head%%:*}
        path=${head#*: }
        case "$num" in
            0) read -r target; rm -f "$R$path" && echo "removed link $path" >>"$ulog" ;;
            1) read -r crc; rm -f "$R$path" && echo "removed $path" >>"$ulog" ;;
        esac
    done
} <"$log"
v=${version##*(}
v=${v%)}
if [ -d "$R/var/lib/dkms/nvidia/$v" ]; then
    rm -rf "$R/var/lib/dkms/nvidia/$v" && echo "DKMS module nvidia/$v removed" >>"$ulog"
fi
if [ -r "$R/var/lib/nvidia/dirs" ]; then
    sort -r "$R/var/lib/nvidia/dirs" | while read -r d; do rmdir "$R$d" 2>/dev/null; done
fi
rm -rf "$R/var/lib/nvidia"
echo "Uninstallation of existing driver: $description ($v) is complete." >>"$ulog"
[ -n "$silent" ] || echo "Uninstallation of existing driver: $description ($v) is complete."
exit 0
"""


def _version_line(version: str) -> str:
    """backup.c create_backwards_compatible_version_string: "580.95.05" ->
    "1.0-5809505 (580.95.05)"."""
    return f"1.0-{''.join(c for c in version if c.isdigit())} ({version})"


def _installer_log(version: str) -> str:
    # log.c log_init's header (real ones: tests/fixtures/runfile/nvidia-installer-log_*).
    return (
        "nvidia-installer log file '/var/log/nvidia-installer.log'\n"
        "creation time: Mon Dec  1 09:12:44 2025\n"
        f"installer version: {version}\n"
        "\n"
        "PATH: /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        "\n"
        "nvidia-installer command line:\n"
        "    ./nvidia-installer\n"
        "    --dkms\n"
        "    -s\n"
        "\n"
        f"Using built-in stream user interface\n"
        f"-> Installing NVIDIA driver version {version}.\n"
    )


def _dkms_conf(version: str) -> str:
    return (
        "# gpubox sandbox stand-in: the runfile's kernel/dkms.conf names module nvidia at the\n"
        "# driver's version (nvidia-installer misc.c run_dkms: -m nvidia -v VERSION)\n"
        'PACKAGE_NAME="nvidia"\n'
        f'PACKAGE_VERSION="{version}"\n'
        'BUILT_MODULE_NAME[0]="nvidia"\n'
        'DEST_MODULE_LOCATION[0]="/kernel/drivers/video"\n'
    )


class _Planter:
    def __init__(self, root: Path):
        self.root = root
        self.written: list[str] = []  # box paths, in order
        self.entries: list[str] = []  # backup log lines
        self.dirs: list[str] = []  # directories created, box paths

    def _host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def mkdirs(self, path: str, mode: int = 0o755) -> None:
        missing = []
        p = self._host(path)
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir(mode=mode)
            self.dirs.append("/" + str(d.relative_to(self.root)))

    def file(self, path: str, text: str = "", mode: int = 0o644, log: bool = True) -> None:
        host = self._host(path)
        if host.exists() or host.is_symlink():
            return
        self.mkdirs(os.path.dirname(path))
        host.write_text(text)
        host.chmod(mode)
        self.written.append(path)
        if log:
            self.entries += [f"1: {path}", "0"]

    def link(self, path: str, target: str, log: bool = True) -> None:
        host = self._host(path)
        if host.exists() or host.is_symlink():
            return
        self.mkdirs(os.path.dirname(path))
        host.symlink_to(target)
        self.written.append(path)
        if log:
            self.entries += [f"0: {path}", target]


def plant(root: Path, version: str = "580.95.05", kernel: str | None = None) -> list[str]:
    """Write a runfile install of driver ``version`` into the box root ``root``; return the
    box paths written (files and links; the backup log and the installer log included)."""
    root = Path(root)
    p = _Planter(root)
    # The install's own files, each logged in the backup log as the real installer logs them.
    p.file("/usr/bin/nvidia-installer", INSTALLER.replace("@VERSION@", version), 0o755)
    p.link("/usr/bin/nvidia-uninstall", "nvidia-installer")
    for lib, soname in LIBRARIES.items():
        p.file(f"{LIBDIR}/{lib}.{version}", "", 0o755)
        if soname:
            p.link(f"{LIBDIR}/{soname}", f"{lib}.{version}")
    p.link(f"{LIBDIR}/libcuda.so", "libcuda.so.1")
    p.file("/usr/bin/nvidia-smi", NVIDIA_SMI, 0o755)
    p.file(f"/usr/src/nvidia-{version}/dkms.conf", _dkms_conf(version))
    if kernel:
        for module in MODULES:
            p.file(f"/lib/modules/{kernel}/kernel/drivers/video/{module}.ko", "", 0o644)
    else:
        # dkms ldtarball / dkms add: the registration the uninstaller's dkms remove undoes.
        # (DKMS's tree, not in the installer's backup log)
        p.link(f"/var/lib/dkms/nvidia/{version}/source", f"/usr/src/nvidia-{version}", log=False)
    # The logs last: the backup log lists everything above; /var/lib/nvidia is created here.
    p.file("/var/log/nvidia-installer.log", _installer_log(version), log=False)
    backup_dir = p._host("/var/lib/nvidia")
    created_backup_dir = not backup_dir.exists()
    p.mkdirs("/var/lib/nvidia", 0o700)
    if created_backup_dir:
        p.dirs.remove("/var/lib/nvidia")  # removed by the uninstaller as the backup dir
    backup_dir.chmod(0o700)
    dirs = [d for d in p.dirs if not d.startswith("/var/lib/nvidia")]
    p.file("/var/lib/nvidia/dirs", "".join(f"{d}\n" for d in dirs), 0o600, log=False)
    log = "\n".join([_version_line(version), DESCRIPTION, *p.entries]) + "\n"
    p.file("/var/lib/nvidia/log", log, 0o600, log=False)
    return p.written
