"""The host's own outputs: `nvcc --version`, `lspci -nn` (and `-nnk`'s drivers),
/etc/os-release, `mokutil --sb-state` and users' groups (`id -nG`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpubox.parsers._common import ParseError, _lines, _quote

# --------------------------------------------------------------------------- nvcc


@dataclass(frozen=True)
class NvccVersion:
    release: str  # "12.8"
    version: str  # "12.8.93"


_NVCC = re.compile(r"Cuda compilation tools, release (\d+\.\d+), V(\d+\.\d+\.\d+)")


def parse_nvcc_version(text: str) -> NvccVersion:
    """`nvcc --version`: "Cuda compilation tools, release 12.8, V12.8.93"."""
    match = _NVCC.search(text)
    if not match:
        first = next((ln for ln in _lines(text) if ln.strip()), "")
        raise ParseError(
            "no 'Cuda compilation tools, release X.Y, VX.Y.Z' line: not `nvcc --version` "
            f"output: {_quote(first)}"
        )
    return NvccVersion(match.group(1), match.group(2))


# --------------------------------------------------------------------------- lspci


@dataclass(frozen=True)
class PciDevice:
    slot: str  # "0000:1a:00.0" with -D, "1a:00.0" without
    class_code: str  # "0302"
    class_name: str  # "3D controller"
    vendor_id: str  # "10de"
    device_id: str  # "1db5"
    description: str  # "NVIDIA Corporation GV100GL [Tesla V100 SXM2 32GB]"
    revision: str | None = None  # "a1"


_LSPCI = re.compile(
    r"^(?P<slot>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r"(?P<class_name>.+?) \[(?P<class>[0-9a-fA-F]{4})\]: "
    r"(?P<desc>.*?)\s*\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]"
    r"(?:\s*\(rev (?P<rev>[0-9a-fA-F]{2})\))?(?:\s*\(prog-if [^)]*\))?\s*$"
)


def parse_lspci(text: str) -> list[PciDevice]:
    """`lspci -nn` / `lspci -Dnn` (optionally `-d 10de:`): one device per unindented line,
    "0000:1a:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 32GB]
    [10de:1db5] (rev a1)". Indented detail lines (-k, -v) and grep's "--" are skipped."""
    devices: list[PciDevice] = []
    for line in _lines(text):
        if not line.strip() or line[:1].isspace() or line.strip() == "--":
            continue
        match = _LSPCI.match(line)
        if not match:
            raise ParseError(
                "not a `lspci -nn` line (want 'SLOT CLASS [cccc]: DESCRIPTION [vvvv:dddd]'; "
                f"was -nn given?): {_quote(line)}"
            )
        devices.append(
            PciDevice(
                slot=match.group("slot").lower(),
                class_code=match.group("class").lower(),
                class_name=match.group("class_name"),
                vendor_id=match.group("vendor").lower(),
                device_id=match.group("device").lower(),
                description=match.group("desc"),
                revision=match.group("rev"),
            )
        )
    return devices


@dataclass(frozen=True)
class PciKernelDevice:
    """A device of `lspci -nnk` with the driver bound to it and the modules that could be."""

    device: PciDevice
    driver: str | None  # "Kernel driver in use:", None when no driver is bound
    modules: tuple[str, ...] = ()  # "Kernel modules:" (absent where lspci cannot read them)


def parse_lspci_kernel(text: str) -> list[PciKernelDevice]:
    """`lspci -Dnnk` (optionally `-d 10de:`): each device line as parse_lspci reads it, and its
    indented "Kernel driver in use: X" and "Kernel modules: a, b" lines (pciutils' ls-kernel.c
    prints them with a tab; pages that quote them often show spaces). Other detail lines
    (Subsystem, -v's) and grep's "--" are skipped."""
    found: list[PciKernelDevice] = []
    device: PciDevice | None = None
    driver: str | None = None
    modules: tuple[str, ...] = ()
    for line in _lines(text):
        if line.strip() and not line[:1].isspace() and line.strip() != "--":
            if device is not None:
                found.append(PciKernelDevice(device, driver, modules))
            (device,) = parse_lspci(line)
            driver, modules = None, ()
            continue
        stripped = line.strip()
        if device is None:
            continue
        if stripped.startswith("Kernel driver in use:"):
            driver = stripped.split(":", 1)[1].strip() or None
        elif stripped.startswith("Kernel modules:"):
            names = stripped.split(":", 1)[1].split(",")
            modules = tuple(n.strip() for n in names if n.strip())
    if device is not None:
        found.append(PciKernelDevice(device, driver, modules))
    return found


# --------------------------------------------------------------------------- os-release


_OS_RELEASE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def parse_os_release(text: str) -> dict[str, str]:
    """/etc/os-release (os-release(5)): KEY=value lines, values unquoted ("..." or '...',
    with shell backslash escapes); comments and blank lines skipped."""
    values: dict[str, str] = {}
    for line in _lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _OS_RELEASE.match(stripped)
        if not match:
            raise ParseError(f"not a KEY=value line of os-release: {_quote(line)}")
        key, value = match.group(1), match.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            quote, value = value[0], value[1:-1]
            if quote == '"':
                value = re.sub(r"\\([\"\\$`])", r"\1", value)
        values[key] = value
    return values


def parse_yes(text: str) -> bool:
    """A shell test's answer, ``... && echo yes || echo no``: True when its last line is
    "yes"."""
    lines = text.strip().splitlines()
    return bool(lines) and lines[-1].strip() == "yes"


# --------------------------------------------------------------------------- Secure Boot


def parse_secure_boot(text: str) -> bool | None:
    """`mokutil --sb-state`: True for "SecureBoot enabled", False for "SecureBoot disabled",
    None where the machine has no EFI variables (BIOS boot, containers)."""
    if re.search(r"^SecureBoot enabled\s*$", text, re.M):
        return True
    if re.search(r"^SecureBoot disabled\s*$", text, re.M):
        return False
    if re.search(r"EFI variables are not supported|doesn't support Secure Boot", text):
        return None
    first = next((ln for ln in _lines(text) if ln.strip()), "")
    raise ParseError(
        "want 'SecureBoot enabled', 'SecureBoot disabled' or 'EFI variables are not supported "
        f"on this system' (mokutil --sb-state): {_quote(first)}"
    )


# --------------------------------------------------------------------------- users' groups


def parse_user_groups(text: str) -> dict[str, list[str] | None]:
    """gpubox.knowledge.users.groups_command's output, one ``NAME:GROUP...`` line per user (`id
    -nG`):
    each user's groups, None for a user the box lacks (a user always has a group of its
    own)."""
    found: dict[str, list[str] | None] = {}
    for line in _lines(text):
        if not line.strip():
            continue
        name, colon, groups = line.partition(":")
        if not colon or not name:
            raise ParseError(f"want NAME:GROUPS (id -nG for each user): {_quote(line)}")
        found[name] = groups.split() or None
    return found
