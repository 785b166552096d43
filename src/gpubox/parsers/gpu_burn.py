"""gpu-burn: a burn's output and `gpu_burn -l`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from gpubox.parsers._common import ParseError, _lines, _quote

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
