"""nvidia-smi's outputs: its error messages, `-L`, `--query-gpu`, the plain table,
`nvlink -s` and `topo -m`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpubox.parsers._common import ParseError, _lines, _quote

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


def parse_loaded_driver(text: str) -> str | None:
    """The loaded NVIDIA kernel module's version from /sys/module/nvidia/version, or from
    nvidia-smi's ``--query-gpu=driver_version`` where sysfs has no such file: "mismatch" when
    nvidia-smi reports a driver/library version mismatch, None when no NVIDIA module is loaded
    (empty output, nvidia-smi's other errors, a first line that is not a version)."""
    text = text.strip()
    if not text:
        return None
    error = parse_smi_error(text)
    if error == "version_mismatch":
        return "mismatch"
    if error is not None:
        return None
    first = text.splitlines()[0].strip()
    return first if first[:1].isdigit() else None


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
