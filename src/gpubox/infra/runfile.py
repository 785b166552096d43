"""A driver installed by NVIDIA's ``.run`` installer, found before the driver stage changes
anything: refused with the fix (inventory key ``runfile_driver: refuse``, the default), or
removed with ``nvidia-uninstall --silent`` as the driver stage's first operation
(``runfile_driver: uninstall``).

Why: dpkg overwrites without a word files that no package owns, so the runfile's own
``libcuda``/``libnvidia-ml`` and its DKMS entry stay next to the packaged driver; a runfile
newer than the pinned driver keeps ldconfig's ``.so.1`` links (ldconfig links a soname to the
newest file) and NVML reports a driver/library version mismatch. NVIDIA's CUDA installation
guide for Linux, section "Handle Conflicting Installation Methods": "Use the following command to
uninstall a Driver runfile installation: sudo /usr/bin/nvidia-uninstall".

What a runfile install leaves, and where each fact comes from (NVIDIA/nvidia-installer on
GitHub, tag 580.95.05, unless said otherwise):

- ``/usr/bin/nvidia-installer``: the installer installs itself there "for later use, such as
  for uninstalling" (its man page, nvidia-installer.1.m4; the driver README's chapter
  "Installing the NVIDIA Driver", e.g. download.nvidia.com/XFree86/Linux-x86_64/319.17/README/
  installdriver.html). ``/usr/bin/nvidia-uninstall`` is a link to it: run under that name it
  uninstalls (nvidia-installer.c: ``basename(program_name) == "nvidia-uninstall"``). The link
  itself comes from the ``.run`` package's manifest (type UTILITY_BIN_SYMLINK, manifest.c);
  that it points at ``nvidia-installer`` is what the uninstaller's name test implies (assumed:
  no manifest of a real package was read).
- ``/var/lib/nvidia/log``, the backup log (backup.c: BACKUP_DIRECTORY, BACKUP_LOG): first line
  ``1.0-<digits> (<version>)`` (create_backwards_compatible_version_string: "580.95.05" ->
  ``1.0-5809505 (580.95.05)``), second line the description, then one entry per installed file
  (``1: /path`` + CRC), link (``0: /path`` + target) or backed-up file (``100: /path`` moved to
  ``/var/lib/nvidia/100``). The uninstaller removes every installed file and link, restores the
  backups and removes ``/var/lib/nvidia`` (do_uninstall). It is the installer's own record of
  an installed driver (get_installed_driver_version_and_descr reads it).
- ``/var/log/nvidia-installer.log``: header ``nvidia-installer log file '...'``, ``creation
  time: ...``, ``installer version: <version>`` (log.c log_init; real headers in public
  reports, tests/fixtures/runfile/SOURCES). An uninstall writes
  ``/var/log/nvidia-uninstall.log`` and leaves both logs in place, so a log alone is NOT a
  driver on the box: it only names the version.
- libraries in ``/usr/lib/x86_64-linux-gnu`` on Debian and Ubuntu (files.c native_libdirs: the
  multiarch triplet dir first, prefix /usr), named with the full version
  (``libcuda.so.580.95.05``, ``libnvidia-ml.so.580.95.05``; the README's "Installed
  Components" appendix). The packaged drivers: NVIDIA's and Ubuntu's ``libnvidia-compute-580``
  own those same names (packages.ubuntu.com file lists); Debian's ``libcuda1``/``libnvidia-ml1``
  ship them under ``.../nvidia/current/`` and reach ``/usr/lib/x86_64-linux-gnu`` through
  alternatives links (packages.debian.org file lists). So a regular (not a link) versioned file
  there that no package owns is a runfile's; links are not looked at (ldconfig and
  update-alternatives make them).
- utilities in ``/usr/bin`` (``nvidia-smi``, ``nvidia-persistenced``, ``nvidia-cuda-mps-*``,
  ...: Ubuntu's nvidia-utils/nvidia-compute-utils file lists place them there; the full list
  below follows the README's "Installed Components", partly from memory: guessed).
- the kernel module: built by the installer and installed to
  ``/lib/modules/<kernel>/kernel/drivers/video`` (kernel.c); its sources always go to
  ``/usr/src/nvidia-<version>`` (install-from-cwd.c kernel_module_src_dir ``nvidia-<version>``
  under /usr/src); when the user accepts DKMS, ``dkms ldtarball`` registers module ``nvidia``
  at that version (misc.c dkms_register_module, run_dkms ``-m nvidia``), which the uninstaller
  removes with ``dkms remove`` (do_uninstall). A package's DKMS source is
  ``/usr/src/nvidia-<version>`` too on Ubuntu (nvidia-dkms-*) and ``nvidia-current-<version>``
  on Debian: owned by dpkg, unlike the runfile's.
- ``nvidia-uninstall --silent`` (``-s``): "Run silently; no questions are asked and no output is
  printed, except for error messages to stderr" (option_table.h); the installer itself runs an
  earlier uninstaller as ``nvidia-uninstall -s --log-file-name=...`` (backup.c
  run_existing_uninstaller). Uninstall mode exits 0 even when the uninstall failed
  (uninstall_existing_driver returns TRUE), so the operation checks that the backup log is gone.
- Debian's ``nvidia-installer-cleanup`` (source nvidia-support, Pre-Depended on by Debian's
  driver packages) asks through debconf to run ``nvidia-installer --uninstall`` and to remove
  "conflicting library files" that "do not belong to any package managed by dpkg" (its debconf
  templates, uninstall-nvidia-installer / remove-conflicting-libraries, default true). gpubox
  does not rely on it: preflight decides before any package is installed, on Ubuntu too.

``RunfileDriver`` reads all of this in one read-only command (exit 0): three ``[ -e ]`` tests,
two small reads, globs, and a single ``dpkg-query -S`` over the candidate files, run only when
a candidate exists (on a converged Ubuntu box: the packaged driver's own files, about 25).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyinfra.api import FactBase

from gpubox.config import HostConfig, Problem

UNINSTALLER = "/usr/bin/nvidia-uninstall"
INSTALLER = "/usr/bin/nvidia-installer"
BACKUP_LOG = "/var/lib/nvidia/log"
INSTALLER_LOG = "/var/log/nvidia-installer.log"
UNINSTALL_LOG = "/var/log/nvidia-uninstall.log"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
# Library name patterns (shell globs) with a driver version (three-digit branch) in the name.
LIBRARY_GLOBS = (
    "libcuda.so.[0-9][0-9][0-9].*",
    "libcudadebugger.so.[0-9][0-9][0-9].*",
    "libnvcuvid.so.[0-9][0-9][0-9].*",
    "libnvidia-*.so.[0-9][0-9][0-9].*",
    "lib*_nvidia.so.[0-9][0-9][0-9].*",
)
# The driver's utilities in /usr/bin (the README's "Installed Components"; partly guessed).
UTILITIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-modprobe",
    "nvidia-settings",
    "nvidia-xconfig",
    "nvidia-bug-report.sh",
    "nvidia-powerd",
    "nvidia-ngx-updater",
)
MODULE_GLOB = "/lib/modules/*/kernel/drivers/video/nvidia*.ko*"
DKMS_SOURCE_GLOB = "/usr/src/nvidia-[0-9]*"

# /var/lib/nvidia/log's first line: "1.0-5809505 (580.95.05)".
_BACKUP_VERSION = re.compile(r"^\d+\.\d+-\d+ \((?P<version>\d+\.\d+(?:\.\d+)?)\)\s*$")
_VERSION_IN_NAME = re.compile(r"\.so\.(?P<version>\d{3}\.\d+(?:\.\d+)?)$")


def _alias(path: str) -> str:
    """The same file under the other name usrmerge gives it (/lib <-> /usr/lib)."""
    if path.startswith("/usr/lib/"):
        return path[len("/usr") :]
    if path.startswith("/lib/"):
        return "/usr" + path
    return path


def command_for(root: str = "") -> str:
    """The fact's command; ``root`` prefixes every path it reads (the unit tests run it
    against a planted tree; the fact uses the box's own root)."""
    candidates = " ".join(
        [f"{root}{LIBDIR}/{g}" for g in LIBRARY_GLOBS]
        + [f"{root}/usr/bin/{u}" for u in UTILITIES]
        + [root + MODULE_GLOB]
    )
    return (
        f"[ -e {root}{UNINSTALLER} ] && echo 'U {root}{UNINSTALLER}'; "
        f"[ -e {root}{INSTALLER} ] && echo 'I {root}{INSTALLER}'; "
        f'[ -r {root}{BACKUP_LOG} ] && echo "B $(head -n 1 {root}{BACKUP_LOG})"; '
        f"[ -r {root}{INSTALLER_LOG} ] && "
        f"sed -n 's/^installer version: */V /p;8q' {root}{INSTALLER_LOG}; "
        "set --; "
        f"for f in {candidates}; do "
        '[ -f "$f" ] && [ ! -L "$f" ] && echo "F $f" && set -- "$@" "$f"; done; '
        f"for d in {root}{DKMS_SOURCE_GLOB}; do "
        '[ -d "$d" ] && echo "S $d" && set -- "$@" "$d"; done; '
        f"for d in {root}/var/lib/dkms/nvidia/[0-9]*; do "
        '[ -d "$d" ] && echo "K ${d##*/}"; done; '
        'if [ "$#" -gt 0 ]; then for p in "$@"; do case "$p" in '
        '/usr/lib/*) set -- "$@" "${p#/usr}";; /lib/*) set -- "$@" "/usr$p";; esac; done; '
        "dpkg-query -S \"$@\" 2>/dev/null | sed 's/^/O /'; fi; true"
    )


RUNFILE_COMMAND = command_for()


@dataclass
class RunfileState:
    uninstaller: str | None = None  # /usr/bin/nvidia-uninstall when present
    installer: str | None = None  # /usr/bin/nvidia-installer when present
    backup_version: str | None = None  # from /var/lib/nvidia/log (the installer's record)
    log_version: str | None = None  # from /var/log/nvidia-installer.log (the last install run)
    unowned_files: list[str] = field(default_factory=list)  # libraries, utilities, modules
    unowned_dkms: list[str] = field(default_factory=list)  # /usr/src/nvidia-<version> trees
    dkms_versions: list[str] = field(default_factory=list)  # /var/lib/dkms/nvidia/<version>

    @property
    def present(self) -> bool:
        """A runfile driver (or what one left) is on the box; the logs alone do not count."""
        return bool(
            self.uninstaller
            or self.installer
            or self.backup_version
            or self.unowned_files
            or self.unowned_dkms
        )

    @property
    def version(self) -> str | None:
        if self.backup_version:
            return self.backup_version
        for path in [*self.unowned_files, *self.unowned_dkms]:
            match = _VERSION_IN_NAME.search(path) or re.search(
                r"/usr/src/nvidia-(\d+\.\d+(?:\.\d+)?)$", path
            )
            if match:
                return match.group(1)
        return self.log_version if self.present else None

    def evidence(self) -> str:
        """What was found, in a few words."""
        parts = [p for p in (self.uninstaller, self.installer) if p]
        if self.backup_version:
            parts.append(f"{BACKUP_LOG} (the installer's record)")
        libs = [f for f in self.unowned_files if "/lib/modules/" not in f]
        modules = [f for f in self.unowned_files if "/lib/modules/" in f]
        if libs:
            more = f" and {len(libs) - 1} more" if len(libs) > 1 else ""
            parts.append(f"NVIDIA files no package owns ({libs[0]}{more})")
        if modules:
            # nvidia.ko first: the module the others depend on
            modules.sort(key=lambda m: (not m.endswith(("/nvidia.ko", "/nvidia.ko.xz")), m))
            more = f" and {len(modules) - 1} more" if len(modules) > 1 else ""
            parts.append(f"kernel modules no package owns ({modules[0]}{more})")
        for tree in self.unowned_dkms:
            registered = tree.rsplit("nvidia-", 1)[-1] in self.dkms_versions
            parts.append(
                f"the module source {tree}" + (" registered with DKMS" if registered else "")
            )
        return ", ".join(parts)


def parse_runfile_state(lines: Iterable[str]) -> RunfileState:
    """RUNFILE_COMMAND's output -> RunfileState."""
    state = RunfileState()
    files: list[str] = []
    trees: list[str] = []
    owned: set[str] = set()
    for raw in lines:
        kind, _, rest = raw.rstrip("\n").partition(" ")
        rest = rest.strip()
        if kind == "U" and rest:
            state.uninstaller = rest
        elif kind == "I" and rest:
            state.installer = rest
        elif kind == "B":
            match = _BACKUP_VERSION.match(rest)
            if match:
                state.backup_version = match.group("version")
        elif kind == "V" and rest and state.log_version is None:
            state.log_version = rest.split()[0]
        elif kind == "F" and rest:
            files.append(rest)
        elif kind == "S" and rest:
            trees.append(rest)
        elif kind == "K" and rest:
            state.dkms_versions.append(rest)
        elif kind == "O" and not rest.startswith("diversion "):
            # dpkg-query -S: "pkg[:arch][, pkg2...]: /path"
            _, sep, path = rest.partition(": ")
            if sep:
                owned.add(path.strip())

    def unowned(path: str) -> bool:
        return path not in owned and _alias(path) not in owned

    state.unowned_files = [f for f in files if unowned(f)]
    state.unowned_dkms = [t for t in trees if unowned(t)]
    return state


def problems(config: HostConfig, state: RunfileState) -> list[Problem]:
    """Refuse a runfile driver (runfile_driver: refuse), or say it will be uninstalled."""
    if not state.present:
        return []
    version = f" {state.version}" if state.version else ""
    found = state.evidence()
    if config.runfile_driver == "uninstall" and state.uninstaller:
        return [
            Problem(
                config.host,
                "runfile_driver",
                f"a driver{version} from NVIDIA's .run installer is on the box ({found}): the "
                f"driver stage first runs '{UNINSTALLER} --silent' (runfile_driver: uninstall)",
                severity="warning",
            )
        ]
    if config.runfile_driver == "uninstall":
        return [
            Problem(
                config.host,
                "runfile_driver",
                f"files of a driver{version} from NVIDIA's .run installer remain ({found}) but "
                f"{UNINSTALLER} is gone, so it cannot be uninstalled: remove those files by hand "
                "(or reinstall the same .run and run 'sudo nvidia-uninstall'), then deploy again",
            )
        ]
    return [
        Problem(
            config.host,
            "runfile_driver",
            f"a driver{version} installed by NVIDIA's .run installer is on the box ({found}); "
            "apt would install over it and leave its libraries and module behind. Remove it "
            'first: \'sudo nvidia-uninstall\' then reboot, or set "runfile_driver": "uninstall" to '
            "let the deploy run 'nvidia-uninstall --silent'",
        )
    ]


class RunfileDriver(FactBase[RunfileState]):
    """What NVIDIA's .run installer left on the box (see the module docstring)."""

    def command(self) -> str:
        return RUNFILE_COMMAND

    @staticmethod
    def default() -> RunfileState:
        return RunfileState()

    def process(self, output: list[str]) -> RunfileState:
        return parse_runfile_state(output)


# The driver stage's first operation under runfile_driver: uninstall. nvidia-uninstall exits 0
# even when the uninstall failed, so success is its backup log gone (do_uninstall removes
# /var/lib/nvidia last).
UNINSTALL_COMMAND = (
    f"{UNINSTALLER} --silent; rc=$?; "
    f'if [ "$rc" -ne 0 ] || [ -e {BACKUP_LOG} ]; then '
    f'echo "nvidia-uninstall --silent failed (exit $rc); see {UNINSTALL_LOG}" >&2; exit 1; fi'
)


def uninstall(config: HostConfig) -> None:
    """Add the uninstall operation when runfile_driver is 'uninstall' and the box has a runfile
    driver with its uninstaller (preflight has refused every other case)."""
    if config.runfile_driver != "uninstall":
        return
    from pyinfra import host
    from pyinfra.operations import server

    state = host.get_fact(RunfileDriver)
    if not (state.present and state.uninstaller):
        return
    version = f" {state.version}" if state.version else ""
    server.shell(
        name=f"Uninstall the driver{version} of NVIDIA's .run installer (nvidia-uninstall "
        "--silent; runfile_driver: uninstall)",
        commands=[UNINSTALL_COMMAND],
    )
