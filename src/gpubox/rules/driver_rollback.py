"""Did a driver move hold? The box's driver state before the move and after its reboot,
compared (issue 30 C, key ``driver_rollback``).

The state is what the host checks read (gpubox.knowledge.reads): the loaded module's version,
the GPUs nvidia-smi lists, and the NVLink links that are up. A move fails when the module at
the new version is not loaded, nvidia-smi fails, it lists fewer GPUs than before, or a link
that was up before is down. The same comparison judges the box after a rollback, against the
old version.

Pure: the reads' outputs in (``state_from``), words out (``failures``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpubox import parsers
from gpubox.knowledge import reads


@dataclass(frozen=True)
class DriverState:
    """A box's driver as the checks see it."""

    loaded: str | None  # the loaded module's version; "mismatch"; None: no module loaded
    gpus: int  # GPUs nvidia-smi lists (0 when it fails)
    smi_error: str | None = None  # why nvidia-smi failed; None when it listed the GPUs
    links_up: frozenset[tuple[int, int]] = field(default_factory=frozenset)  # (GPU, link)


# One command, every part exiting 0, that reads the three (sections: parsers.parse_sections).
STATE_COMMAND = "; ".join(
    [
        reads.section("loaded"),
        f"{{ {reads.LOADED_DRIVER.command_for()}; }}",
        reads.section("smi"),
        f"{reads.GPU_QUERY.command_for()} 2>&1",
        reads.section("smi-exit") + ' "$?"',
        reads.section("nvlink"),
        f"{reads.NVLINK_STATUS.command_for()} 2>&1 || true",
    ]
)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "no output")


def state_from(text: str) -> DriverState:
    """The state from STATE_COMMAND's output."""
    parts = parsers.parse_sections(text)
    loaded = reads.LOADED_DRIVER.parse(parts.get("loaded", ""))
    smi = parts.get("smi", "")
    exit_line = next(
        (name for name in parts if name.startswith("smi-exit")), "smi-exit missing"
    ).split()
    code = exit_line[-1] if len(exit_line) == 2 else "?"
    gpus, error = 0, None
    if code != "0":
        error = f"exit {code}: {_first_line(smi)}"
    else:
        try:
            gpus = len(reads.GPU_QUERY.parse(smi))
        except parsers.ParseError as exc:
            error = str(exc)
    try:
        status = reads.NVLINK_STATUS.parse(parts.get("nvlink", ""))
    except parsers.ParseError:  # nvidia-smi failed (said above), or no NVLink to report
        status = {}
    links = frozenset((gpu, link.link) for gpu, ls in status.items() for link in ls if link.active)
    return DriverState(loaded, gpus, error, links)


def state_before(loaded: str | None, smi: str, nvlink: str) -> DriverState:
    """The state before the move from the stage's facts (their commands' exit status is not
    kept: a query that does not parse counts no GPU, and no link)."""
    try:
        gpus = len(reads.GPU_QUERY.parse(smi))
    except parsers.ParseError:
        gpus = 0
    try:
        status = reads.NVLINK_STATUS.parse(nvlink)
    except parsers.ParseError:
        status = {}
    links = frozenset((gpu, link.link) for gpu, ls in status.items() for link in ls if link.active)
    return DriverState(loaded, gpus, None, links)


def failures(before: DriverState, after: DriverState, version: str) -> list[str]:
    """What fails on driver ``version`` after the reboot, compared with ``before``: each a
    sentence naming the version; empty when the driver holds."""
    problems = []
    if after.loaded is None:
        problems.append(f"driver {version}: the nvidia kernel module is not loaded")
    elif after.loaded == "mismatch":
        problems.append(
            f"driver {version}: the loaded nvidia module is not the installed driver "
            "(nvidia-smi: driver/library version mismatch)"
        )
    elif after.loaded != version:
        problems.append(f"driver {version}: the loaded nvidia module is {after.loaded}")
    if after.smi_error is not None:
        problems.append(f"driver {version}: nvidia-smi fails ({after.smi_error})")
    elif after.gpus < before.gpus:
        problems.append(
            f"driver {version}: nvidia-smi lists {after.gpus} GPU(s), {before.gpus} before"
        )
    lost = sorted(before.links_up - after.links_up)
    if lost:
        shown = ", ".join(f"GPU {gpu} link {link}" for gpu, link in lost)
        problems.append(f"driver {version}: NVLink link(s) down that were up before: {shown}")
    return problems
