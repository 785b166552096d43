"""Pure parsers of the command outputs gpubox reads from a host: nvidia-smi (table, -L,
--query-gpu, nvlink -s, topo -m, its error messages), nvcc --version, lspci -Dnn,
apt-cache policy, apt-mark showhold, dpkg-query, /etc/os-release, mokutil --sb-state,
gpu-burn (a burn and `gpu_burn -l`) and DCGM's dcgmi (discovery -l, dmon, diag -j, and the
errors it prints when it cannot do its work).

Text in, dataclasses out: nothing here runs a command or imports pyinfra or testinfra, so the
deploy's facts, the host checks and the CLI all read a host the same way. Every parser is
tested on real captured outputs (tests/fixtures, sources in tests/fixtures/SOURCES.md) and
raises ParseError, quoting the line it could not read, rather than guessing."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "AptPolicy",
    "AptPolicyVersion",
    "DcgmDiag",
    "DcgmDiagTest",
    "DcgmGpu",
    "DmonRow",
    "DmonSample",
    "DpkgPackage",
    "GpuBurnDevice",
    "GpuBurnResult",
    "NvLink",
    "NvccVersion",
    "ParseError",
    "PciDevice",
    "SmiGpu",
    "SmiTable",
    "SmiTableGpu",
    "Topology",
    "nvml_library_version",
    "parse_apt_policy",
    "parse_dcgmi_diag_json",
    "parse_dcgmi_discovery",
    "parse_dcgmi_dmon",
    "parse_dcgmi_error",
    "parse_dpkg_query",
    "parse_gpu_burn",
    "parse_gpu_burn_list",
    "parse_lspci",
    "parse_nvcc_version",
    "parse_nvlink_status",
    "parse_os_release",
    "parse_query_gpu",
    "parse_secure_boot",
    "parse_showhold",
    "parse_smi_error",
    "parse_smi_list",
    "parse_smi_table",
    "parse_topo_matrix",
]


class ParseError(ValueError):
    """The text is not the output the parser reads; the message says what was expected."""


def _quote(line: str, limit: int = 120) -> str:
    line = line.rstrip("\n")
    return repr(line if len(line) <= limit else line[:limit] + "...")


def _lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").split("\n")


# --------------------------------------------------------------------------- nvidia-smi errors

_MISMATCH = re.compile(r"Driver/library version mismatch")
# The apostrophe is a typographic one in some copies of the message.
_NO_DRIVER = re.compile(r"couldn.t communicate with the NVIDIA driver")
_NVML_VERSION = re.compile(r"^NVML library version:\s*(\S+)\s*$", re.M)


def parse_smi_error(text: str) -> str | None:
    """Which known nvidia-smi failure the text reports: "version_mismatch" (the kernel
    module loaded is not the userspace's version: "Failed to initialize NVML:
    Driver/library version mismatch"), "no_driver" ("NVIDIA-SMI has failed because it
    couldn't communicate with the NVIDIA driver..."), or None for anything else."""
    if _MISMATCH.search(text):
        return "version_mismatch"
    if _NO_DRIVER.search(text):
        return "no_driver"
    return None


def nvml_library_version(text: str) -> str | None:
    """The "NVML library version: 570.211" a version mismatch names (the userspace side,
    major.minor only), or None."""
    match = _NVML_VERSION.search(text)
    return match.group(1) if match else None


def _refuse_smi_error(text: str, what: str) -> None:
    kind = parse_smi_error(text)
    if kind is not None:
        first = next((ln for ln in _lines(text) if ln.strip()), "")
        raise ParseError(f"expected {what}, but nvidia-smi failed ({kind}): {_quote(first)}")


# --------------------------------------------------------------------------- nvidia-smi -L


@dataclass(frozen=True)
class SmiGpu:
    index: int
    name: str
    uuid: str


_LIST_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]*)\)\s*$")
_NO_DEVICES = "No devices were found"


def parse_smi_list(text: str) -> list[SmiGpu]:
    """`nvidia-smi -L`: one "GPU 0: Tesla V100-SXM2-32GB (UUID: GPU-...)" line per GPU.
    MIG device lines (indented) are skipped; "No devices were found" gives []."""
    _refuse_smi_error(text, "`nvidia-smi -L` output")
    gpus: list[SmiGpu] = []
    for line in _lines(text):
        if not line.strip() or line.strip() == _NO_DEVICES or line[:1].isspace():
            continue
        match = _LIST_LINE.match(line)
        if not match:
            raise ParseError(
                f"not a `nvidia-smi -L` line (want 'GPU N: NAME (UUID: GPU-...)'): {_quote(line)}"
            )
        gpus.append(SmiGpu(int(match.group(1)), match.group(2), match.group(3)))
    return gpus


# --------------------------------------------------------------------------- --query-gpu


_NA_VALUES = frozenset({"[N/A]", "N/A"})
_HEADER_UNIT = re.compile(r"^(.*?)\s*\[[^\]]*\]$")


def _field_name(header_cell: str) -> str:
    """The field name of a CSV header cell: "memory.total [MiB]" -> "memory.total"."""
    match = _HEADER_UNIT.match(header_cell.strip())
    return (match.group(1) if match else header_cell).strip()


def parse_query_gpu(text: str, fields: list[str]) -> list[dict[str, str | None]]:
    """`nvidia-smi --query-gpu=F1,F2,... --format=csv[,noheader][,nounits]`: one dict per GPU
    mapping each requested field to its value as printed ("32768 MiB", or "32768" with
    nounits); "[N/A]" and "N/A" become None. A header line, when present, must name the
    requested fields in order (units such as " [MiB]" are ignored)."""
    _refuse_smi_error(text, "`nvidia-smi --query-gpu` CSV")
    if not fields:
        raise ParseError("parse_query_gpu needs the list of fields that were queried")
    wanted = [f.strip() for f in fields]
    rows = [line for line in _lines(text) if line.strip()]
    if rows and rows[0].strip() == _NO_DEVICES:
        return []
    if rows:
        first = [c.strip() for c in rows[0].split(",")]
        if [_field_name(c) for c in first] == wanted:
            rows = rows[1:]
        elif first and _field_name(first[0]) == wanted[0] and not first[0][:1].isdigit():
            raise ParseError(
                f"the CSV header names {[_field_name(c) for c in first]}, "
                f"not the fields asked for {wanted}"
            )
    result: list[dict[str, str | None]] = []
    for row in rows:
        cells = [c.strip() for c in row.split(",")]
        if len(cells) != len(wanted):
            raise ParseError(
                f"expected {len(wanted)} comma-separated values ({','.join(wanted)}), "
                f"got {len(cells)}: {_quote(row)}"
            )
        result.append(
            {f: (None if v in _NA_VALUES else v) for f, v in zip(wanted, cells, strict=True)}
        )
    return result


# --------------------------------------------------------------------------- plain nvidia-smi


@dataclass(frozen=True)
class SmiTableGpu:
    index: int
    name: str
    persistence: str  # "On" / "Off" (what the Persistence-M column shows)
    bus_id: str  # "00000000:1A:00.0"
    display_active: str  # Disp.A: "Off" / "On"
    ecc: str  # "Volatile Uncorr. ECC": "0", "Off", "N/A"
    fan: str | None = None  # "N/A", "0%"
    temperature_c: int | None = None
    perf: str | None = None  # "P0"
    power_draw_w: int | None = None
    power_cap_w: int | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    gpu_util_pct: int | None = None
    compute_mode: str | None = None  # "Default", "E. Process"


@dataclass(frozen=True)
class SmiTable:
    driver_version: str
    cuda_version: str | None
    smi_version: str  # the NVIDIA-SMI (userspace) version in the banner
    gpus: list[SmiTableGpu] = field(default_factory=list)


_BANNER = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+(?:Driver|KMD) Version:\s*(?P<driver>\S+)"
    r"(?:\s+CUDA(?: UMD)? Version:\s*(?P<cuda>[\d.]+|N/A))?"
)
_GPU_ROW = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<pm>On|Off|N/A|WDDM|TCC)\s*"
    r"\|\s*(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s+(?P<disp>\S+)\s*"
    r"\|\s*(?P<ecc>\S+)\s*\|\s*$"
)
_STATS_ROW = re.compile(
    r"^\|\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>\S+)\s+(?P<pwr>\S+)\s*/\s*(?P<cap>\S+)\s*"
    r"\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|\s*(?P<util>\S+)\s+(?P<mode>.+?)\s*\|\s*$"
)


def _int_prefix(value: str) -> int | None:
    match = re.match(r"^(\d+)", value)
    return int(match.group(1)) if match else None


def parse_smi_table(text: str) -> SmiTable:
    """Plain `nvidia-smi`: the banner's driver and CUDA versions and one entry per GPU row
    pair (name/persistence/bus id, then fan/temp/perf/power/memory/util/compute mode). The
    table layouts of drivers 5xx (570 draws `|---|` under the banner, 580 `+---+`) and the
    older 79-column one are all read; a table cut off after a GPU's first row still parses."""
    _refuse_smi_error(text, "the `nvidia-smi` table")
    lines = _lines(text)
    banner = next((m for m in map(_BANNER.search, lines) if m), None)
    if banner is None:
        if any(ln.strip() == _NO_DEVICES for ln in lines):
            raise ParseError("nvidia-smi says 'No devices were found': no table to read")
        raise ParseError(
            "no 'NVIDIA-SMI <version>  Driver Version: <version>' banner: not `nvidia-smi` output"
        )
    cuda = banner.group("cuda")
    gpus: list[SmiTableGpu] = []
    pending: dict[str, str] | None = None
    for line in lines:
        row = _GPU_ROW.match(line)
        if row:
            if pending is not None:
                gpus.append(_table_gpu(pending, None))
            pending = row.groupdict()
            continue
        stats = _STATS_ROW.match(line)
        if stats and pending is not None:
            gpus.append(_table_gpu(pending, stats.groupdict()))
            pending = None
    if pending is not None:
        gpus.append(_table_gpu(pending, None))
    return SmiTable(
        driver_version=banner.group("driver"),
        cuda_version=None if cuda in (None, "N/A") else cuda,
        smi_version=banner.group("smi"),
        gpus=gpus,
    )


def _table_gpu(row: dict[str, str], stats: dict[str, str] | None) -> SmiTableGpu:
    base = SmiTableGpu(
        index=int(row["index"]),
        name=row["name"],
        persistence=row["pm"],
        bus_id=row["bus"],
        display_active=row["disp"],
        ecc=row["ecc"],
    )
    if stats is None:
        return base
    return SmiTableGpu(
        index=base.index,
        name=base.name,
        persistence=base.persistence,
        bus_id=base.bus_id,
        display_active=base.display_active,
        ecc=base.ecc,
        fan=stats["fan"],
        temperature_c=_int_prefix(stats["temp"]),
        perf=stats["perf"],
        power_draw_w=_int_prefix(stats["pwr"]),
        power_cap_w=_int_prefix(stats["cap"]),
        memory_used_mib=int(stats["used"]),
        memory_total_mib=int(stats["total"]),
        gpu_util_pct=_int_prefix(stats["util"]),
        compute_mode=stats["mode"],
    )


# --------------------------------------------------------------------------- nvlink -s


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool
    speed_gbs: float | None  # per-link speed in GB/s; None when inactive


_NVLINK_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]*)\)\s*$")
_NVLINK_LINE = re.compile(r"^\s*Link (\d+): (.+?)\s*$")
_NVLINK_SPEED = re.compile(r"^([\d.]+) GB/s$")


def parse_nvlink_status(text: str) -> dict[int, list[NvLink]]:
    """`nvidia-smi nvlink -s` (also `--status`, `-i N`): links per GPU index. "Link 3:
    <inactive>" is an inactive link; "Link 0: 25.781 GB/s" an active one. A GPU that
    prints no link lines, or NVML's "all links are inActive" note, has an empty list."""
    _refuse_smi_error(text, "`nvidia-smi nvlink -s` output")
    status: dict[int, list[NvLink]] = {}
    current: int | None = None
    for line in _lines(text):
        if not line.strip():
            continue
        gpu = _NVLINK_GPU.match(line)
        if gpu:
            current = int(gpu.group(1))
            status[current] = []
            continue
        link = _NVLINK_LINE.match(line)
        if link:
            if current is None:
                raise ParseError(f"NVLink line before any 'GPU N: ...' line: {_quote(line)}")
            number, value = int(link.group(1)), link.group(2)
            if value == "<inactive>":
                status[current].append(NvLink(number, False, None))
                continue
            speed = _NVLINK_SPEED.match(value)
            if not speed:
                raise ParseError(f"unknown NVLink state {value!r} in {_quote(line)}")
            status[current].append(NvLink(number, True, float(speed.group(1))))
            continue
        if line.strip().startswith("NVML:") and "inActive" in line:
            continue
        raise ParseError(
            f"not `nvidia-smi nvlink -s` output (want 'GPU N: ...' or 'Link N: ...'): "
            f"{_quote(line)}"
        )
    return status


# --------------------------------------------------------------------------- topo -m


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NV = re.compile(r"^NV(\d+)$")
# "X", "NV2", "PIX", "PXB", "PHB", "NODE", "SYS" (and "SOC" of old drivers)
_RELATION = re.compile(r"^(X|[A-Z]{2,4}\d*)$")


@dataclass(frozen=True)
class Topology:
    """`nvidia-smi topo -m`: the GPUs in order, and the relation of every ordered pair of
    devices (GPUs and NICs) as printed: "NV2", "PIX", "PXB", "PHB", "NODE", "SYS"."""

    gpus: list[str]
    links: dict[tuple[str, str], str]
    nics: list[str] = field(default_factory=list)
    cpu_affinity: dict[str, str | None] = field(default_factory=dict)
    numa_affinity: dict[str, str | None] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)  # "NIC0" -> "mlx5_2"

    def nvlinks(self, a: str | int, b: str | int) -> int:
        """How many bonded NVLinks join devices a and b ("GPU0" or 0): the # of "NV#", 0 if
        their relation is not NVLink (or either is unknown)."""
        key = (_device(a), _device(b))
        match = _NV.match(self.links.get(key, ""))
        return int(match.group(1)) if match else 0


def _device(name: str | int) -> str:
    return f"GPU{name}" if isinstance(name, int) else name


def _split_topo(line: str) -> list[str]:
    if "\t" in line:
        return [cell.strip() for cell in line.split("\t")]
    # Tabs turned into spaces (copied from a terminal): columns are 2+ spaces apart in the
    # header ("CPU Affinity" has one) and single tokens in the rows.
    return [cell for cell in re.split(r"\s{2,}", line.strip())]


def parse_topo_matrix(text: str) -> Topology:
    """`nvidia-smi topo -m`, tab-separated as printed (the header's terminal underline escape
    codes are dropped) or with tabs expanded to spaces. Rows of NICs are kept apart from
    GPUs; the trailing CPU/NUMA affinity columns, the Legend and the NIC Legend are not part
    of the matrix."""
    _refuse_smi_error(text, "`nvidia-smi topo -m` output")
    lines = [_ANSI.sub("", ln) for ln in _lines(text)]
    header_at = next((i for i, ln in enumerate(lines) if re.search(r"\bGPU0\b", ln)), None)
    if header_at is None:
        raise ParseError("no header row naming GPU0: not `nvidia-smi topo -m` output")
    header = [c for c in _split_topo(lines[header_at]) if c]
    devices: list[str] = []
    for cell in header:
        if cell in _AFFINITY_COLUMNS:
            break
        devices.append(cell)
    if not devices or devices[0] != "GPU0":
        raise ParseError(f"the header row does not start with GPU0: {_quote(lines[header_at])}")
    links: dict[tuple[str, str], str] = {}
    gpus: list[str] = []
    nics: list[str] = []
    cpu: dict[str, str | None] = {}
    numa: dict[str, str | None] = {}
    nic_names: dict[str, str] = {}
    seen: set[str] = set()
    in_matrix = True
    for line in lines[header_at + 1 :]:
        stripped = line.strip()
        if in_matrix and (not stripped or stripped == "Legend:"):
            in_matrix = False
            continue
        if in_matrix:
            tabbed = "\t" in line
            cells = [c.strip() for c in line.split("\t")] if tabbed else stripped.split()
            name, rel = cells[0], cells[1 : 1 + len(devices)]
            if (
                name not in devices
                or len(rel) != len(devices)
                or not all(_RELATION.match(value) for value in rel)
            ):
                raise ParseError(
                    f"matrix row of {len(cells) - 1} cells for {len(devices)} devices "
                    f"({', '.join(devices)}): {_quote(line)}"
                )
            seen.add(name)
            (gpus if name.startswith("GPU") else nics).append(name)
            for other, value in zip(devices, rel, strict=True):
                if other != name:
                    links[(name, other)] = value
            rest = cells[1 + len(devices) :]
            cpu[name] = rest[0] if len(rest) > 0 and rest[0] else None
            numa[name] = rest[1] if len(rest) > 1 and rest[1] else None
            continue
        nic = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", line)
        if nic:
            nic_names[nic.group(1)] = nic.group(2)
    if not gpus:
        raise ParseError("the topology matrix has no GPU rows")
    return Topology(
        gpus=gpus, links=links, nics=nics, cpu_affinity=cpu, numa_affinity=numa, nic_names=nic_names
    )


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


# --------------------------------------------------------------------------- apt-cache policy


@dataclass(frozen=True)
class AptPolicyVersion:
    version: str
    priority: int  # the version's pin priority (1001, 500, 100, -1, ...)
    sources: list[str]  # "http://mirror.example.org/debian bookworm/main amd64 Packages", ...
    source_priorities: list[int] = field(default_factory=list)  # one per source
    installed: bool = False  # marked "***"


@dataclass(frozen=True)
class AptPolicy:
    installed: str | None
    candidate: str | None
    versions: list[AptPolicyVersion] = field(default_factory=list)


_POLICY_PACKAGE = re.compile(r"^(\S+):\s*$")
_POLICY_FIELD = re.compile(r"^  (Installed|Candidate): (.+?)\s*$")
_POLICY_VERSION = re.compile(r"^ (\*\*\*| {3}) (\S+) (-?\d+)\s*$")
_POLICY_SOURCE = re.compile(r"^ {8}(-?\d+) (.+?)\s*$")


@dataclass
class _PolicyBuilder:
    installed: str | None = None
    candidate: str | None = None
    versions: list[AptPolicyVersion] = field(default_factory=list)


def parse_apt_policy(text: str) -> dict[str, AptPolicy]:
    """`apt-cache policy PKG1 PKG2 ...` (in the C locale): per package, the installed and
    candidate versions ("(none)" becomes None) and the version table with each version's
    priority, its sources and whether it is the installed one ("***"). A package apt does
    not know prints nothing and is absent from the result."""
    packages: dict[str, _PolicyBuilder] = {}
    current: _PolicyBuilder | None = None
    version: AptPolicyVersion | None = None
    for line in _lines(text):
        if not line.strip() or line.startswith(("N: ", "W: ")):
            continue
        package = _POLICY_PACKAGE.match(line)
        if package:
            current = packages[package.group(1)] = _PolicyBuilder()
            version = None
            continue
        if current is None:
            raise ParseError(
                f"expected a 'PACKAGE:' line first (is this `apt-cache policy PKG...` in the C "
                f"locale?): {_quote(line)}"
            )
        fld = _POLICY_FIELD.match(line)
        if fld:
            value = None if fld.group(2) == "(none)" else fld.group(2)
            if fld.group(1) == "Installed":
                current.installed = value
            else:
                current.candidate = value
            continue
        if line.strip() == "Version table:":
            continue
        ver = _POLICY_VERSION.match(line)
        if ver:
            version = AptPolicyVersion(
                ver.group(2), int(ver.group(3)), [], [], installed=ver.group(1) == "***"
            )
            current.versions.append(version)
            continue
        src = _POLICY_SOURCE.match(line)
        if src and version is not None:
            version.sources.append(src.group(2))
            version.source_priorities.append(int(src.group(1)))
            continue
        raise ParseError(
            f"unexpected line in `apt-cache policy` output (C locale expected): {_quote(line)}"
        )
    return {name: AptPolicy(b.installed, b.candidate, b.versions) for name, b in packages.items()}


# --------------------------------------------------------------------------- apt-mark, dpkg


_PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.\-]+(?::[a-z0-9\-]+)?$")


def parse_showhold(text: str) -> set[str]:
    """`apt-mark showhold`: the held package names (one per line, possibly ":arch")."""
    held: set[str] = set()
    for line in _lines(text):
        name = line.strip()
        if not name:
            continue
        if not _PACKAGE_NAME.match(name):
            raise ParseError(f"not a package name in `apt-mark showhold` output: {_quote(line)}")
        held.add(name)
    return held


@dataclass(frozen=True)
class DpkgPackage:
    name: str
    version: str
    status: str  # db:Status-Abbrev, three characters: "ii ", "hi ", "rc ", "iU "...

    @property
    def installed(self) -> bool:
        """Unpacked and configured ("ii", "hi")."""
        return self.status[1:2] == "i"

    @property
    def held(self) -> bool:
        return self.status[:1] == "h"


_STATUS_ABBREV = re.compile(r"^[uihrp][ncHUFWti][ R]?$")


def parse_dpkg_query(text: str) -> dict[str, DpkgPackage]:
    """`dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'`: packages by
    name. The status keeps dpkg's three columns ("ii ", "hi ", "rc "; padded if stripped).
    dpkg-query's own "no packages found matching" messages are skipped."""
    packages: dict[str, DpkgPackage] = {}
    for line in _lines(text):
        if not line.strip() or line.startswith("dpkg-query: "):
            continue
        cells = line.split("\t")
        if len(cells) != 3:
            raise ParseError(
                "want 'PACKAGE<TAB>VERSION<TAB>STATUS' (dpkg-query -W -f='${Package}\\t"
                f"${{Version}}\\t${{db:Status-Abbrev}}\\n'): {_quote(line)}"
            )
        name, version, status = cells[0].strip(), cells[1].strip(), cells[2].rstrip("\n")
        if not _STATUS_ABBREV.match(status.rstrip() or "?"):
            raise ParseError(f"not a dpkg status abbreviation {status!r}: {_quote(line)}")
        packages[name] = DpkgPackage(name, version, status.ljust(3)[:3])
    return packages


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


# --------------------------------------------------------------------------- gpu-burn


class GpuBurnDevice(NamedTuple):
    """One line of `gpu_burn -l`: "ID 0: Tesla V100-SXM2-32GB, 34089MB"."""

    id: int  # the CUDA device ordinal gpu-burn's -i takes
    name: str
    memory_mb: int  # decimal megabytes as gpu-burn prints them (cuDeviceTotalMem / 1000 / 1000)


@dataclass(frozen=True)
class GpuBurnResult:
    """What a `gpu_burn [-d] [-tc] [-m X] [-i N] TIME` run reported.

    gpu-burn exits 0 even when a GPU is FAULTY, so a caller judges the run by ``ok()``:
    every expected GPU tested, all OK, none died, the run not aborted, and at least one
    progress report seen (a run whose workers never reported still ends "GPU 0: OK")."""

    tested: int | None  # "Tested N GPUs:"; None when the run never got there
    gpus: dict[int, str]  # "GPU 0: OK" / "GPU 1: FAULTY" (indexes as gpu-burn numbers them)
    errors: list[int]  # per GPU: the error count of largest magnitude any report showed
    gflops: list[float]  # per GPU: the Gflop/s of the last progress report
    died: bool  # a worker died ("(DIED!)" or "proc'd: -1")
    aborted: bool  # "No clients are alive!  Aborting"
    seconds: int | None = None  # "Burning for N seconds."
    compare_file: str | None = None  # "Using compare file: compare.fatbin"
    doubles: bool | None = None  # "using DOUBLES" / "using FLOATS"
    tensor_cores: bool = False  # ", using Tensor Cores"
    progress_reports: int = 0  # progress lines seen, "\r"-overwritten ones included
    init_errors: list[str] = field(default_factory=list)  # "Couldn't init ..." and the like

    def problems(self, expected_gpus: int) -> list[str]:
        """Why this run does not prove ``expected_gpus`` healthy GPUs ([] when it does)."""
        found: list[str] = []
        if self.aborted:
            found.append("gpu-burn aborted: no worker was alive")
        if self.died:
            found.append("a gpu-burn worker died")
        if self.init_errors:
            found.append("a GPU could not be initialised: " + self.init_errors[0])
        if self.tested is None:
            found.append("gpu-burn did not finish (no 'Tested N GPUs:' line)")
        elif self.tested != expected_gpus:
            found.append(f"gpu-burn tested {self.tested} GPUs, expected {expected_gpus}")
        faulty = sorted(i for i, verdict in self.gpus.items() if verdict != "OK")
        if faulty:
            found.append("FAULTY: " + ", ".join(f"GPU {i}" for i in faulty))
        if self.tested is not None and len(self.gpus) != self.tested:
            found.append(f"{len(self.gpus)} verdicts for {self.tested} tested GPUs")
        if self.progress_reports == 0:
            found.append("no GPU ever reported progress")
        return found

    def ok(self, expected_gpus: int) -> bool:
        return not self.problems(expected_gpus)


_BURN_PROGRESS = re.compile(
    r"(?P<pct>\d+(?:\.\d+)?)%  proc'd: (?P<procd>.*?)\s+"
    r"errors: (?P<errors>.*?)\s+temps: (?P<temps>.*)"
)
_BURN_PROCD = re.compile(r"(-?\d+) \((-?[\w.]+) Gflop/s\)")
_BURN_ERRORS = re.compile(r"(-?\d+)\s*(\((?:WARNING|DIED)!\))?")
_BURN_TESTED = re.compile(r"^Tested (\d+) GPUs:\s*$")
_BURN_VERDICT = re.compile(r"^\s*GPU (\d+): (OK|FAULTY)\s*$")
_BURN_ABORT = re.compile(r"No clients are alive!\s+Aborting")
_BURN_SECONDS = re.compile(r"Burning for (\d+) (?:seconds\.|secs)")
_BURN_COMPARE = re.compile(r"Using compare file: (\S.*?)\s*$")
_BURN_INIT = re.compile(
    r"^.*?((?:Couldn't init (?:a GPU test|CUDA)|Failure during compute): .*?)\s*$"
)
_BURN_TYPE = re.compile(r"\), using (DOUBLES|FLOATS)(, using Tensor Cores)?")
_BURN_MARKERS = (
    "Burning for",
    "proc'd:",
    "Tested ",
    "Killing processes",
    "No CUDA devices",
    "No clients are alive",
    "Couldn't init",
)


def _gflops(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return float("nan")  # "-nan" and the like, printed by %.0f


def parse_gpu_burn(text: str) -> GpuBurnResult:
    """The output of a gpu-burn run (stdout, or stdout and stderr together): the final
    "Tested N GPUs:" verdicts, the progress reports (each "\\r"-overwritten report counts),
    died workers, an abort, the run's settings. Reads the current format (compare.fatbin,
    "Killing processes with SIGTERM (soft kill)") and the older ones ("Killing processes..
    done", "Burning for 10 secs"), progress lines as a terminal shows them or raw with their
    carriage returns, tabs kept or turned into spaces."""
    if not any(marker in text for marker in _BURN_MARKERS):
        first = next((ln for ln in _lines(text) if ln.strip()), "")
        raise ParseError(
            f"not gpu-burn output (no 'Burning for', progress or verdict): {_quote(first)}"
        )
    tested: int | None = None
    gpus: dict[int, str] = {}
    errors: list[int] = []
    gflops: list[float] = []
    died = aborted = tensor_cores = False
    seconds: int | None = None
    compare_file: str | None = None
    doubles: bool | None = None
    reports = 0
    init_errors: list[str] = []
    segments = [s for line in _lines(text) for s in line.split("\r")]
    last = max((i for i, s in enumerate(segments) if s.strip()), default=-1)
    for at, segment in enumerate(segments):
        progress = _BURN_PROGRESS.search(segment)
        if not progress and "proc'd:" in segment and at != last:
            raise ParseError(f"unreadable gpu-burn progress line: {_quote(segment)}")
        if progress:
            reports += 1
            procd = _BURN_PROCD.findall(progress.group("procd"))
            errs = _BURN_ERRORS.findall(progress.group("errors"))
            if not procd or len(errs) != len(procd):
                raise ParseError(f"unreadable gpu-burn progress line: {_quote(segment)}")
            gflops = [_gflops(g) for _, g in procd]
            counts = [int(e) for e, _ in errs]
            if len(errors) != len(counts):
                errors = [0] * len(counts)
            errors = [max(a, b, key=abs) for a, b in zip(errors, counts, strict=True)]
            if any(int(p) == -1 for p, _ in procd) or any(n == "(DIED!)" for _, n in errs):
                died = True
            continue
        if _BURN_ABORT.search(segment):
            aborted = True
        if match := _BURN_TESTED.match(segment):
            tested = int(match.group(1))
        elif match := _BURN_VERDICT.match(segment):
            gpus[int(match.group(1))] = match.group(2)
        if match := _BURN_SECONDS.search(segment):
            seconds = int(match.group(1))
        if match := _BURN_COMPARE.search(segment):
            compare_file = match.group(1)
        if match := _BURN_TYPE.search(segment):
            doubles = match.group(1) == "DOUBLES"
            tensor_cores = tensor_cores or bool(match.group(2))
        if match := _BURN_INIT.match(segment):
            init_errors.append(match.group(1))
    found = reports or gpus or aborted or init_errors or "No CUDA devices" in text
    if not found and seconds is None and tested is None:
        raise ParseError("no gpu-burn result in the text (a progress line cut short?)")
    return GpuBurnResult(
        tested=tested,
        gpus=gpus,
        errors=errors,
        gflops=gflops,
        died=died,
        aborted=aborted,
        seconds=seconds,
        compare_file=compare_file,
        doubles=doubles,
        tensor_cores=tensor_cores,
        progress_reports=reports,
        init_errors=init_errors,
    )


_BURN_LIST = re.compile(r"^ID (\d+): (.+), (\d+)MB\s*$")


def parse_gpu_burn_list(text: str) -> list[GpuBurnDevice]:
    """`gpu_burn -l`: one "ID 0: Tesla V100-SXM2-32GB, 34089MB" line per CUDA device (memory
    in decimal MB). gpu-burn's own "cuInit returned 0 (no error)" (stderr) is skipped; a
    failed CUDA init is refused with gpu-burn's message."""
    devices: list[GpuBurnDevice] = []
    for line in _lines(text):
        if not line.strip() or line.startswith("cuInit returned 0 "):
            continue
        match = _BURN_LIST.match(line)
        if not match:
            raise ParseError(f"not a `gpu_burn -l` line (want 'ID N: NAME, MEMMB'): {_quote(line)}")
        devices.append(GpuBurnDevice(int(match.group(1)), match.group(2), int(match.group(3))))
    return devices


# --------------------------------------------------------------------------- dcgmi


_DCGMI_ERRORS = (
    (
        "no_hostengine",
        re.compile(
            r"unable to establish a connection to the specified host|"
            r"Unable to connect to host engine"
        ),
    ),
    ("module_not_loaded", re.compile(r"module of DCGM that is not currently loaded")),
    (
        "requires_root",
        re.compile(
            r"host engine to be running as root|"
            r"Host engine is running as non-root"
        ),
    ),
    ("not_supported", re.compile(r"Result: -6: Feature not supported")),
)


def parse_dcgmi_error(text: str) -> str | None:
    """Which known dcgmi failure the text reports: "no_hostengine" (nv-hostengine not
    running: "Error: unable to establish a connection to the specified host: localhost"),
    "module_not_loaded" (e.g. profiling fields 1001-1012 without the profiling module:
    "Error setting watches. Result: -33: This request is serviced by a module of DCGM that is
    not currently loaded"), "requires_root", "not_supported"; None for anything else."""
    for kind, pattern in _DCGMI_ERRORS:
        if pattern.search(text):
            return kind
    return None


def _refuse_dcgmi_error(text: str, what: str) -> None:
    kind = parse_dcgmi_error(text)
    if kind is not None:
        line = next((ln for ln in _lines(text) if ln.startswith("Error")), "")
        raise ParseError(f"expected {what}, but dcgmi failed ({kind}): {_quote(line)}")


@dataclass(frozen=True)
class DcgmGpu:
    id: int  # DCGM's GPU id
    name: str
    bus_id: str  # "00000000:07:00.0"
    uuid: str


_DISCOVERY_COUNT = re.compile(r"^(\d+) GPUs? found(?: \((?:Active|All)\))?\.\s*$")
_DISCOVERY_ROW = re.compile(
    r"^\|\s*(?P<id>\d+)?\s*\|\s*(?P<key>Name|PCI Bus ID|Device UUID): (?P<value>.*?)\s*\|\s*$"
)
_DISCOVERY_KEYS = {"Name": "name", "PCI Bus ID": "bus_id", "Device UUID": "uuid"}


def parse_dcgmi_discovery(text: str) -> list[DcgmGpu]:
    """`dcgmi discovery -l`: the GPUs of the "N GPUs found." table, each drawn over three
    rows ("| 0      | Name: ...", "|        | PCI Bus ID: ...", "|        | Device UUID: ...").
    The NvSwitch, ConnectX and CPU tables that follow are not read. DCGM 4.5+'s "N GPUs
    found (Active)." is read too; the number of entries must match N."""
    _refuse_dcgmi_error(text, "`dcgmi discovery -l` output")
    lines = _lines(text)
    count_at = next((i for i, ln in enumerate(lines) if _DISCOVERY_COUNT.match(ln.strip())), None)
    if count_at is None:
        first = next((ln for ln in lines if ln.strip()), "")
        raise ParseError(
            f"no 'N GPUs found.' line: not `dcgmi discovery -l` output: {_quote(first)}"
        )
    expected = int(_DISCOVERY_COUNT.match(lines[count_at].strip()).group(1))  # type: ignore[union-attr]
    entries: dict[int, dict[str, str]] = {}
    current: int | None = None
    for line in lines[count_at + 1 :]:
        stripped = line.strip()
        if not stripped.startswith(("|", "+")):
            break  # "0 NvSwitches found." and what follows
        row = _DISCOVERY_ROW.match(stripped)
        if not row:
            continue  # borders and the header row
        if row.group("id") is not None:
            current = int(row.group("id"))
            entries[current] = {}
        if current is None:
            raise ParseError(f"a GPU attribute before any GPU id: {_quote(line)}")
        entries[current][_DISCOVERY_KEYS[row.group("key")]] = row.group("value")
    gpus: list[DcgmGpu] = []
    for gpu_id, attrs in entries.items():
        missing = {"name", "bus_id", "uuid"} - attrs.keys()
        if missing:
            raise ParseError(f"GPU {gpu_id} of `dcgmi discovery -l` lacks {sorted(missing)}")
        gpus.append(DcgmGpu(gpu_id, attrs["name"], attrs["bus_id"], attrs["uuid"]))
    if len(gpus) != expected:
        raise ParseError(f"dcgmi says {expected} GPUs found but the table lists {len(gpus)}")
    return gpus


@dataclass(frozen=True)
class DmonRow:
    entity: str  # "GPU 0", "GPU-I 21", "Switch 0"
    values: dict[str, float | None]  # short field name ("NVLTX") -> value; None for N/A


@dataclass(frozen=True)
class DmonSample:
    """`dcgmi dmon -e IDS [-c N]`: the columns (short field names) and every row printed,
    in order (N rows per entity with -c N)."""

    columns: list[str]
    rows: list[DmonRow]

    @property
    def latest(self) -> dict[str, dict[str, float | None]]:
        """Each entity's last row."""
        return {row.entity: row.values for row in self.rows}


def _dmon_value(token: str, line: str) -> float | None:
    if token == "N/A":
        return None
    try:
        return float(token)
    except ValueError:
        raise ParseError(
            f"non-numeric dmon value {token!r} (only numeric fields are read): {_quote(line)}"
        ) from None


def parse_dcgmi_dmon(text: str) -> DmonSample:
    """`dcgmi dmon -e 449,1011,1012 -c 1`: a "#Entity NBWLT NVLTX ..." header, a units row
    starting "ID", then one row per entity and sample ("GPU 0     0      N/A"). Column widths
    differ between DCGM versions, so rows are split on whitespace; "N/A" becomes None. The
    header dmon repeats every 14 samples must name the same fields. dcgmi's errors (host
    engine not running, "Error setting watches", printed after the header) are refused."""
    _refuse_dcgmi_error(text, "`dcgmi dmon` output")
    columns: list[str] | None = None
    rows: list[DmonRow] = []
    for line in _lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("ID") or "dmon was stopped" in stripped:
            continue
        if stripped.startswith("#Entity"):
            names = stripped.split()[1:]
            if columns is not None and names != columns:
                raise ParseError(f"dmon header changed from {columns} to {names}")
            columns = names
            continue
        if columns is None:
            raise ParseError(f"a dmon row before the '#Entity' header: {_quote(line)}")
        tokens = stripped.split()
        if len(tokens) != 2 + len(columns):
            raise ParseError(
                f"dmon row with {len(tokens) - 2} values for {len(columns)} fields "
                f"({' '.join(columns)}): {_quote(line)}"
            )
        values = {c: _dmon_value(v, line) for c, v in zip(columns, tokens[2:], strict=True)}
        rows.append(DmonRow(f"{tokens[0]} {tokens[1]}", values))
    if columns is None:
        first = next((ln for ln in _lines(text) if ln.strip()), "")
        raise ParseError(f"no '#Entity' header: not `dcgmi dmon` output: {_quote(first)}")
    return DmonSample(columns, rows)


@dataclass(frozen=True)
class DcgmDiagTest:
    name: str  # "software", "pcie", "memory", "diagnostic", "targeted_stress", ...
    category: str  # "Deployment", "Integration", "Hardware", "Stress"
    status: str  # the test's summary: "Pass", "Fail", "Skip", "Warn"
    results: dict[int, str]  # GPU entity id -> "Pass" / "Fail" / "Skip" / "Warn"
    messages: list[str] = field(default_factory=list)  # the warnings (DCGM's error texts)
    info: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DcgmDiag:
    passed: bool  # no test or GPU failed, no runtime error, at least one test ran
    level: int | None  # the run level (-r N), as given or inferred from the tests that ran
    tests: list[DcgmDiagTest]
    version: str | None = None  # DCGM's version ("4.4.1")
    driver_version: str | None = None  # "Driver Version Detected"
    runtime_error: str | None = None  # the diagnostic could not run; no tests then


# Tests each run level adds (DCGM 4 docs; -r 2 = 1 + pcie, memory; ...), to infer a level.
_DIAG_LEVEL_TESTS = (
    (4, {"memtest", "pulse_test", "eud"}),
    (3, {"diagnostic", "targeted_stress", "targeted_power", "memory_bandwidth"}),
    (2, {"pcie", "memory"}),
    (1, {"software"}),
)


def _diag_texts(items: Any, key: str | None) -> list[str]:
    if not isinstance(items, list):
        return []
    if key is None:
        return [str(i) for i in items]
    return [str(i.get(key, "")) for i in items if isinstance(i, dict)]


def parse_dcgmi_diag_json(text: str, level: int | None = None) -> DcgmDiag:
    """`dcgmi diag -r N -j` of DCGM 4.x: the "DCGM Diagnostic" document (test_categories >
    tests > results per entity, a test_summary per test, entity_groups, metadata). A run that
    could not start is a document with "runtime_error" and no tests. DCGM 3.x's "DCGM GPU
    Diagnostic" layout is refused. ``level`` is the -r the caller ran; when None it is
    inferred from the highest-level test present."""
    _refuse_dcgmi_error(text, "`dcgmi diag -j` JSON")
    start = text.find("{")
    if start < 0:
        first = next((ln for ln in _lines(text) if ln.strip()), "")
        raise ParseError(f"no JSON document: not `dcgmi diag -j` output: {_quote(first)}")
    try:
        doc = json.loads(text[start:])
    except ValueError as exc:
        raise ParseError(f"`dcgmi diag -j` output is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ParseError("`dcgmi diag -j` output is not a JSON object")
    if "DCGM GPU Diagnostic" in doc:
        raise ParseError("DCGM 3.x diagnostic layout ('DCGM GPU Diagnostic'); gpubox reads DCGM 4")
    body = doc.get("DCGM Diagnostic")
    if not isinstance(body, dict):
        raise ParseError("no 'DCGM Diagnostic' object: not DCGM 4 `dcgmi diag -j` output")
    raw_metadata = doc.get("metadata")
    metadata: dict[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    version = metadata.get("version") or body.get("version")
    runtime_error = body.get("runtime_error")
    tests: list[DcgmDiagTest] = []
    for category in body.get("test_categories") or []:
        for test in category.get("tests") or []:
            results: dict[int, str] = {}
            messages: list[str] = []
            info: list[str] = []
            for result in test.get("results") or []:
                if result.get("entity_group", "GPU") == "GPU" and "entity_id" in result:
                    results[int(result["entity_id"])] = str(result.get("status", ""))
                messages += _diag_texts(result.get("warnings"), "warning")
                info += _diag_texts(result.get("info"), None)
            summary = test.get("test_summary") or {}
            messages += _diag_texts(summary.get("warnings"), "warning")
            info += _diag_texts(summary.get("info"), None)
            status = summary.get("status")
            if status is None:  # no summary: the worst of the results
                statuses = set(results.values())
                status = next((s for s in ("Fail", "Warn", "Pass", "Skip") if s in statuses), "")
            tests.append(
                DcgmDiagTest(
                    name=str(test.get("name", "")),
                    category=str(category.get("category", "")),
                    status=str(status),
                    results=results,
                    messages=messages,
                    info=info,
                )
            )
    if level is None:
        names = {t.name for t in tests}
        level = next((lvl for lvl, added in _DIAG_LEVEL_TESTS if names & added), None)
    failed = any(t.status == "Fail" or "Fail" in t.results.values() for t in tests)
    return DcgmDiag(
        passed=bool(tests) and not failed and runtime_error is None,
        level=level,
        tests=tests,
        version=None if version is None else str(version),
        driver_version=metadata.get("Driver Version Detected"),
        runtime_error=None if runtime_error is None else str(runtime_error),
    )
