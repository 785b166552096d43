"""DCGM's dcgmi: `discovery -l`, `dmon`, `diag -j` and the errors it prints when it cannot
do its work."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gpubox.parsers._common import ParseError, _lines, _quote

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
