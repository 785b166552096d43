"""Kernels and the NVIDIA module DKMS builds for them.

DKMS builds the module only for a kernel whose headers are installed. `linux-headers-$(uname
-r)` covers the running kernel alone: the next kernel an upgrade installs would boot without
the NVIDIA module. So the driver stage also installs the headers meta package of the kernel
series the box tracks, which follows every new kernel of that series: the headers meta of each
installed kernel image meta package (linux-image-generic-hwe-24.04 -> linux-headers-generic-
hwe-24.04, linux-image-amd64 -> linux-headers-amd64) whose series the box boots, or, with no
image meta installed, the running kernel's flavour's (linux-headers-generic). The host checks
ask `dkms status` that the module is installed for every kernel the box can boot.

A leaf (the standard library and gpubox.parsers, nothing of pyinfra): the commands that read a
host live here with their parsers, since the driver stage (through gpubox.facts' KernelModules
and KernelMetas), the host checks and doctor all read it the same way.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpubox import parsers

# "6.8.0-88-generic" -> generic, "6.1.0-26-cloud-amd64" -> cloud-amd64, "6.8.0-1012-aws" -> aws
# Debian 13 and its backports write "6.12.38+deb13-amd64", "6.12.12+bpo-amd64".
_DISTRO_RELEASE = re.compile(
    r"^\d+\.\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?|\+[a-z0-9.]+)-([a-z][a-z0-9-]*)$"
)


def flavour(release: str) -> str | None:
    """The flavour of a distribution kernel release, or None for a kernel of another origin."""
    match = _DISTRO_RELEASE.match(release.strip())
    return match.group(1) if match else None


def series(release_or_version: str) -> str | None:
    """major.minor of a kernel release ("6.14.0-36-generic") or of a kernel package's version
    ("6.14.0-36.36~24.04.1", Debian's "6.1.158-1", with or without an epoch)."""
    match = re.match(r"^(?:\d+:)?(\d+)\.(\d+)(?:[.\-+~]|$)", release_or_version.strip())
    return f"{match.group(1)}.{match.group(2)}" if match else None


@dataclass(frozen=True)
class KernelMeta:
    """An installed kernel image meta package: linux-image-generic-hwe-24.04 at 6.14.0-36.36~24.04.1
    tracks the generic flavour's 6.14 series."""

    package: str
    version: str

    @property
    def spec(self) -> str:
        """The name after linux-image-: "generic-hwe-24.04", "amd64", "oem-24.04"."""
        return self.package.removeprefix("linux-image-")

    @property
    def flavour(self) -> str:
        """The flavour of the kernels it installs (what their releases end with)."""
        spec = self.spec.removeprefix("extra-")
        spec = re.sub(r"-edge$", "", spec)
        spec = re.sub(r"-hwe-\d+\.\d+$", "", spec)  # generic-hwe-24.04 -> generic
        spec = re.sub(r"-\d+\.\d+[a-z]?$", "", spec)  # oem-24.04(a..d), generic-6.14 -> ...
        # Ubuntu's virtual metas install the generic kernel (linux-image-virtual Depends:
        # linux-image-X-generic)
        return "generic" if spec == "virtual" else spec

    @property
    def series(self) -> str | None:
        return series(self.version)

    @property
    def headers(self) -> str:
        """Its headers meta package (linux-headers-generic-hwe-24.04, linux-headers-amd64)."""
        return "linux-headers-" + self.spec.removeprefix("extra-")


# Names that carry a kernel release (linux-image-6.14.0-36-generic, Debian's
# linux-image-6.12.38+deb13-amd64) are kernels, not metas; -dbg and -unsigned builds are neither.
_KERNEL_IN_NAME = re.compile(r"\d+\.\d+\.\d+")


def is_image_meta(package: str) -> bool:
    return (
        package.startswith("linux-image-")
        and not _KERNEL_IN_NAME.search(package)
        and not package.endswith(("-dbg", "-unsigned", "-signed-template"))
    )


def parse_kernel_metas(text: str) -> list[KernelMeta]:
    """The installed kernel image metas from `dpkg-query -W -f='${Package}\\t${Version}\\t
    ${db:Status-Abbrev}\\n' 'linux-image-*'` (KERNEL_METAS_COMMAND)."""
    return [
        KernelMeta(p.name, p.version)
        for p in parsers.parse_dpkg_query(text).values()
        if p.installed and is_image_meta(p.name)
    ]


def headers_metas(metas: Iterable[KernelMeta], kernels: Iterable[str]) -> list[str]:
    """The headers meta of each image meta whose flavour and series one of ``kernels`` (the
    running one and those in /boot) is: never headers for a series that nothing boots."""
    booted = {(flavour(k), series(k)) for k in kernels}
    found = {
        meta.headers
        for meta in metas
        if (meta.flavour, meta.series) in booted
        or (meta.series is None and any(f == meta.flavour for f, _ in booted))
    }
    return sorted(found)


def headers_packages(
    release: str,
    kernels: Iterable[str] = (),
    metas: Iterable[KernelMeta] | None = None,
) -> list[str]:
    """The headers of the running kernel, and the headers metas of the kernel series the box
    tracks: those of its installed image metas that the box boots (the running ``release``
    and ``kernels``); with no image meta installed (``metas`` empty or None), the meta of the
    running kernel's flavour."""
    packages = [f"linux-headers-{release}"]
    metas = list(metas or [])
    if metas:
        packages += headers_metas(metas, [release, *kernels])
        return packages
    kind = flavour(release)
    if kind:
        packages.append(f"linux-headers-{kind}")
    return packages


@dataclass(frozen=True)
class DkmsEntry:
    module: str
    version: str
    kernel: str
    arch: str
    status: str  # installed, built, added, ...


@dataclass
class KernelState:
    running: str = ""
    bootable: list[str] = field(default_factory=list)  # /boot/vmlinuz-*
    with_headers: set[str] = field(default_factory=set)  # /lib/modules/*/build present
    dkms: list[DkmsEntry] | None = None  # None: dkms is not installed

    @property
    def kernels(self) -> list[str]:
        """Every kernel the box can boot, the running one included."""
        return sorted({*self.bootable, *([self.running] if self.running else [])})


# `dkms status` lines: "nvidia/570.211.01, 6.8.0-88-generic, x86_64: installed" (dkms 3.x),
# older "nvidia, 570.211.01, 6.8.0-88-generic, x86_64: installed"; a trailing
# "(WARNING! ...)" may follow the status.
_DKMS_LINE = re.compile(
    r"^(?P<module>[^/,\s]+)(?:/|,\s*)(?P<version>[^,\s]+),\s*(?P<kernel>[^,\s]+),\s*"
    r"(?P<arch>[^:\s]+):\s*(?P<status>[a-z]+)"
)


def parse_dkms_status(text: str) -> list[DkmsEntry]:
    entries = []
    for line in text.splitlines():
        match = _DKMS_LINE.match(line.strip())
        if match:
            entries.append(DkmsEntry(**match.groupdict()))
    return entries


def parse_kernel_state(lines: Iterable[str]) -> KernelState:
    state = KernelState()
    dkms_lines: list[str] = []
    saw_dkms = False
    for line in lines:
        kind, _, rest = line.rstrip("\n").partition(" ")
        if kind == "R":
            state.running = rest.strip()
        elif kind == "K" and rest.strip():
            state.bootable.append(rest.strip())
        elif kind == "H" and rest.strip():
            state.with_headers.add(rest.strip())
        elif kind == "DKMS":
            saw_dkms = True
        elif kind == "D":
            dkms_lines.append(rest)
    state.dkms = parse_dkms_status("\n".join(dkms_lines)) if saw_dkms else None
    return state


def is_nvidia_module(name: str) -> bool:
    """NVIDIA's DKMS module names: nvidia (NVIDIA's and Ubuntu's packages), nvidia-current
    (Debian's), nvidia-open / nvidia-current-open (the open flavour)."""
    return re.fullmatch(r"nvidia(-current)?(-open)?", name) is not None


def kernels_lacking_module(state: KernelState, driver_version: str) -> list[str]:
    """The kernels the box can boot that have no NVIDIA module of ``driver_version`` installed
    by DKMS."""
    have = {
        e.kernel
        for e in state.dkms or []
        if is_nvidia_module(e.module) and e.version == driver_version and e.status == "installed"
    }
    return [k for k in state.kernels if k not in have]


# DKMS's "installed" read from its tree, as `dkms status` (3.x) decides it, without its
# second of bash: a module/version is installed for kernel K and arch A when the link
# /var/lib/dkms/MODULE/kernel-K-A resolves to /var/lib/dkms/MODULE/VERSION/K/A and that
# directory holds the built module (its module/*.ko*). Printed in dkms status's own format.
def dkms_installed_command(tree: str = "/var/lib/dkms") -> str:
    t = shlex.quote(tree)
    return (
        f'for l in {t}/*/kernel-*; do [ -L "$l" ] || continue; '
        'd=$(readlink -f "$l") || continue; m=${l%/kernel-*}; m=${m##*/}; '
        f'case "$d" in {t}/"$m"/*/*/*) ;; *) continue ;; esac; '
        'set -- "$d"/module/*.ko*; [ -e "$1" ] || continue; '
        f'r=${{d#{t}/"$m"/}}; v=${{r%%/*}}; r=${{r#*/}}; '
        'echo "D $m/$v, ${r%/*}, ${r##*/}: installed"; done'
    )


KERNEL_STATE_COMMAND = (
    'echo "R $(cat /proc/sys/kernel/osrelease)"; '
    'for f in /boot/vmlinuz-*; do [ -e "$f" ] && echo "K ${f#/boot/vmlinuz-}"; done; '
    'for d in /lib/modules/*/build; do [ -e "$d" ] && h="${d%/build}" && echo "H ${h##*/}"; done; '
    f"if command -v dkms >/dev/null 2>&1; then echo DKMS; {dkms_installed_command()}; fi; true"
)


def repair_command(kernels: Iterable[str]) -> str:
    """Build and install the module for each kernel lacking it: `dkms autoinstall` where the
    headers are there, else install that kernel's headers (DKMS's headers hook then builds)."""
    parts = []
    for kernel in kernels:
        build, k = shlex.quote(f"/lib/modules/{kernel}/build"), shlex.quote(kernel)
        headers = shlex.quote(f"linux-headers-{kernel}")
        parts.append(
            f"if [ -e {build} ]; then dkms autoinstall -k {k}; "
            "else DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
            f"{headers}; fi"
        )
    return " && ".join(parts) or "true"


# Every installed linux-image-* package with its version and state; is_image_meta keeps the
# metas. `|| true`: dpkg-query exits 1 when no package matches.
KERNEL_METAS_COMMAND = (
    "dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n' 'linux-image-*' "
    "2>/dev/null || true"
)
