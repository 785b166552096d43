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


# --- The running kernel's headers, asked of the box's apt first (issue 29 D12) -------------
#
# linux-headers-$(uname -r) names one kernel build. The archive's index lists only the builds
# of its current kernel source (Ubuntu's -updates/-security, Debian's point releases), so on a
# box not rebooted since a kernel update the running kernel's headers may be gone from it, and
# `apt-get install linux-headers-$(uname -r)` dies on "Unable to locate package". The driver
# stage asks the box's apt first (`apt-cache policy`, its own lists, no download) and skips the
# package when apt has lists but no candidate for it; the headers meta (linux-headers-generic-
# hwe-24.04, linux-headers-amd64) brings the newest kernel's headers, DKMS builds the module
# for that kernel, and the owner is told to reboot into it.

LISTS_MARK = "## lists"


def running_headers(release: str) -> str:
    return f"linux-headers-{release}"


def headers_query_command(package: str) -> str:
    """``## lists`` when apt has any package list (/var/lib/apt/lists/*_Packages*), then
    `apt-cache policy PACKAGE` in the C locale (nothing when apt knows no such package)."""
    return (
        "if ls /var/lib/apt/lists/ 2>/dev/null | grep -q _Packages; then "
        f"echo '{LISTS_MARK}'; fi; LC_ALL=C apt-cache policy {shlex.quote(package)} 2>/dev/null; "
        "true"
    )


def parse_headers_query(text: str) -> dict[str, str] | None:
    """The answer to ``headers_query_command``: each package apt has a candidate for, with that
    version; None when apt has no package list at all (nothing known: a box whose lists were
    never fetched gets them with the deploy's apt update) or its answer cannot be read."""
    lines = text.splitlines()
    if LISTS_MARK not in (line.strip() for line in lines):
        return None
    try:
        policy = parsers.parse_apt_policy("\n".join(x for x in lines if not x.startswith("## ")))
    except parsers.ParseError:
        return None
    return {name: p.candidate for name, p in policy.items() if p.candidate}


def headers_question(
    release: str, state: KernelState, driver_version: str, want_headers: bool
) -> str | None:
    """The package to ask the box's apt about: the running kernel's headers, when the deploy
    would install them (``want_headers``: driver_kernel_headers), or when the module's repair
    would (the running kernel lacks the module and has no headers tree); else None."""
    lacking = kernels_lacking_module(state, driver_version)
    if want_headers or (release in lacking and release not in state.with_headers):
        return running_headers(release)
    return None


@dataclass(frozen=True)
class HeadersPlan:
    packages: list[str]  # the headers packages to install (driver_kernel_headers)
    repair: list[str]  # the kernels whose module the deploy builds
    warning: str | None  # the running kernel's headers are gone: what the owner should do


def _release_key(release: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", release) if p]


def headers_plan(
    release: str,
    state: KernelState,
    metas: Iterable[KernelMeta] | None,
    driver_version: str,
    want_headers: bool,
    offers: dict[str, str] | None,
) -> HeadersPlan:
    """What the driver stage installs and builds for the kernels. ``offers``: the answer to
    ``headers_query_command`` (None: not asked, or apt knows nothing yet; then as before: the
    running kernel's headers are installed and its module built). When apt has lists and no
    candidate for the running kernel's headers, they are skipped, in the headers step and in
    the module's repair (which would install them for a kernel without a headers tree), and
    the warning says so."""
    metas = list(metas or [])
    packages = headers_packages(release, state.kernels, metas) if want_headers else []
    repair = kernels_lacking_module(state, driver_version)
    package = running_headers(release)
    if offers is None or package in offers:
        return HeadersPlan(packages, repair, None)
    packages = covers = [p for p in packages if p != package]  # the metas, when wanted
    head = f"kernel headers: {package} is in none of the box's apt repositories"
    if release in state.with_headers:
        # a headers tree of its own (a kernel built elsewhere, the sandbox's): DKMS uses it
        return HeadersPlan(
            packages,
            repair,
            f"{head}; skipped: DKMS builds the NVIDIA module for {release} against "
            f"/lib/modules/{release}/build, which is there",
        )
    repair = [k for k in repair if k != release]
    newer = sorted(
        (k for k in state.kernels if _release_key(k) > _release_key(release)), key=_release_key
    )
    into = f"the newest kernel ({newer[-1]}, installed)" if newer else "the newest kernel"
    if covers:
        then = f", whose headers {' and '.join(covers)} bring{'s' if len(covers) == 1 else ''}"
    elif newer and newer[-1] in state.with_headers:
        then = ", whose headers are installed"
    else:
        then = ", once its headers are installed"
    return HeadersPlan(
        packages,
        repair,
        f"{head} (gone from the archive: the box runs {release} and was not rebooted since a "
        f"kernel update?); skipped: DKMS cannot build the NVIDIA module for {release}. Reboot "
        f"into {into}{then}: DKMS builds the module for it",
    )
