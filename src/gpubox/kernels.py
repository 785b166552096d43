"""Kernels and the NVIDIA module DKMS builds for them.

DKMS builds the module only for a kernel whose headers are installed. `linux-headers-$(uname
-r)` covers the running kernel alone: the next kernel an upgrade installs would boot without
the NVIDIA module. So the driver stage also installs the headers meta package of the running
kernel's flavour (linux-headers-generic on Ubuntu's generic kernel, linux-headers-amd64 on
Debian's), which follows every new kernel, and the host checks ask `dkms status` that the
module is installed for every kernel the box can boot.

Pure helpers here; the fact that reads a host is gpubox.facts-style but lives here with its
parser, since the driver stage, the host checks and doctor all read it the same way.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyinfra.api import FactBase

# "6.8.0-88-generic" -> generic, "6.1.0-26-cloud-amd64" -> cloud-amd64, "6.8.0-1012-aws" -> aws
_DISTRO_RELEASE = re.compile(r"^\d+\.\d+(?:\.\d+)?-\d+(?:\.\d+)?-([a-z][a-z0-9-]*)$")


def flavour(release: str) -> str | None:
    """The flavour of a distribution kernel release, or None for a kernel of another origin."""
    match = _DISTRO_RELEASE.match(release.strip())
    return match.group(1) if match else None


def headers_packages(release: str) -> list[str]:
    """The headers of the running kernel, and the meta package that follows its flavour."""
    packages = [f"linux-headers-{release}"]
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


KERNEL_STATE_COMMAND = (
    'echo "R $(cat /proc/sys/kernel/osrelease)"; '
    'for f in /boot/vmlinuz-*; do [ -e "$f" ] && echo "K ${f#/boot/vmlinuz-}"; done; '
    'for d in /lib/modules/*/build; do [ -e "$d" ] && h="${d%/build}" && echo "H ${h##*/}"; done; '
    "if command -v dkms >/dev/null 2>&1; then echo DKMS; "
    "dkms status 2>/dev/null | sed 's/^/D /'; fi; true"
)


class KernelModules(FactBase[KernelState]):
    """The running kernel, the bootable ones, which have headers, and `dkms status`."""

    def command(self) -> str:
        return KERNEL_STATE_COMMAND

    def process(self, output: list[str]) -> KernelState:
        return parse_kernel_state(output)


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
