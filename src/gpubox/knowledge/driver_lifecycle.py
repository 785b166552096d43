"""A driver branch's lifecycle: its designation and end of life, as the catalog records them
(``driver.branches.BRANCH.lifecycle``, with its source), the rules a lifecycle entry must
keep, and the note a host gets when its branch is past its end of life or within six months
of it, naming the branch to move to for the host's GPUs (their last branch is
``gpubox.base.compat``'s ``last_driver_branch``). Pure: the date is passed in."""

from __future__ import annotations

import datetime
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpubox.base import compat

DESIGNATIONS = ("long-term support", "production", "new feature")
FIELDS = ("designation", "eol", "status", "source")
# A branch gets its note this many months before its end-of-life month ends.
WARN_MONTHS = 6
_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


@dataclass(frozen=True)
class Lifecycle:
    branch: str
    designation: str | None  # one of DESIGNATIONS; None: the source does not say
    eol: str | None  # "YYYY-MM", the last month of support; None: see status
    status: str | None  # what is known where no month is (e.g. unlisted): past its end of life
    source: str

    def months_left(self, today: datetime.date) -> int | None:
        """Whole months from today's month to the end-of-life month (0: this month is the
        last; negative: past it), or None when no month is known."""
        if self.eol is None:
            return None
        year, month = (int(part) for part in self.eol.split("-"))
        return (year * 12 + month) - (today.year * 12 + today.month)

    def past(self, today: datetime.date) -> bool:
        left = self.months_left(today)
        return left < 0 if left is not None else True

    @property
    def when(self) -> str:
        """The end of life in words, for a note or the table."""
        return self.eol if self.eol is not None else f"past ({self.status})"


def entry_problems(branch: str, entry: Any) -> list[str]:
    """What is wrong with one branch's lifecycle entry, each naming its catalog path."""
    path = f"driver.branches.{branch}.lifecycle"
    if not isinstance(entry, Mapping):
        return [f"{path} must be a mapping of {', '.join(FIELDS)}, got {entry!r}"]
    found = [f"{path}.{name} is missing" for name in FIELDS if name not in entry]
    found += [f"{path}.{name} is not a lifecycle field" for name in entry if name not in FIELDS]
    designation = entry.get("designation")
    if designation is not None and designation not in DESIGNATIONS:
        choices = ", ".join(repr(d) for d in DESIGNATIONS)
        found.append(f"{path}.designation must be one of {choices} or null, got {designation!r}")
    eol, status = entry.get("eol"), entry.get("status")
    if eol is not None and not (isinstance(eol, str) and _MONTH.match(eol)):
        found.append(f"{path}.eol must be a month, YYYY-MM (e.g. '2028-06'), or null, got {eol!r}")
    if status is not None and not (isinstance(status, str) and status.strip()):
        found.append(f"{path}.status must be text or null, got {status!r}")
    if "eol" in entry and eol is None and not (isinstance(status, str) and status.strip()):
        found.append(f"{path}: eol is null, so status must say what is known instead")
    source = entry.get("source")
    if "source" in entry and not (isinstance(source, str) and source.strip()):
        found.append(f"{path}.source must name where the data comes from, got {source!r}")
    return found


def problems(branches: Mapping[str, Any]) -> list[str]:
    """Every problem of the catalog's branches' lifecycle entries (each branch needs one)."""
    found: list[str] = []
    for branch, info in branches.items():
        if not isinstance(info, Mapping) or "lifecycle" not in info:
            found.append(f"driver.branches.{branch}.lifecycle is missing")
            continue
        found += entry_problems(branch, info["lifecycle"])
    return found


def lifecycle(branch: str, branches: Mapping[str, Any]) -> Lifecycle:
    """One branch's lifecycle; ValueError when its entry is malformed (``problems``)."""
    info = branches.get(branch)
    if not isinstance(info, Mapping) or "lifecycle" not in info:
        raise ValueError(f"driver.branches.{branch}.lifecycle is missing")
    entry = info["lifecycle"]
    found = entry_problems(branch, entry)
    if found:
        raise ValueError("; ".join(found))
    return Lifecycle(branch, entry["designation"], entry["eol"], entry["status"], entry["source"])


def table(branches: Mapping[str, Any]) -> list[Lifecycle]:
    """Every branch's lifecycle, oldest branch first."""
    return [lifecycle(b, branches) for b in sorted(branches, key=int)]


@dataclass(frozen=True)
class Note:
    branch: str
    past: bool  # past its end of life; False: within WARN_MONTHS of it
    move_to: str | None  # the branch to move to; None: no newer one for these GPUs
    text: str


def move_target(
    branch: str,
    today: datetime.date,
    architectures: Collection[str],
    branches: Mapping[str, Any],
) -> str | None:
    """The newest branch of the catalog, newer than ``branch``, that every one of the GPUs'
    architectures still supports (compat's last_driver_branch) and that is not past its end of
    life; None when there is none."""
    for name in sorted(branches, key=int, reverse=True):
        if int(name) <= int(branch):
            break
        if all(compat.branch_supports(arch, int(name)) for arch in architectures) and not (
            lifecycle(name, branches).past(today)
        ):
            return name
    return None


def note(
    branch: str,
    today: datetime.date,
    architectures: Collection[str],
    branches: Mapping[str, Any],
) -> Note | None:
    """The note for a host on ``branch`` with GPUs of ``architectures`` (compat's names) on
    ``today``: past its end of life, or within WARN_MONTHS of it, and where to move; None when
    the branch has more time or the catalog does not know it."""
    if branch not in branches:
        return None
    unknown = [a for a in architectures if a not in compat.ARCHITECTURES]
    if unknown:
        raise ValueError(f"unknown GPU architecture(s): {', '.join(unknown)}")
    life = lifecycle(branch, branches)
    left = life.months_left(today)
    if left is not None and left >= WARN_MONTHS:
        return None
    past = life.past(today)
    if life.eol is None:
        head = f"driver branch R{branch} is past its end of life ({life.status}; "
    elif past:
        head = f"driver branch R{branch} is past its end of life ({life.eol}; "
    else:
        head = f"driver branch R{branch} reaches its end of life in {life.eol} ("
    head += f"source: {life.source})"
    target = move_target(branch, today, architectures, branches)
    if target is not None:
        tail = f'move to R{target}: set "driver_branch": "{target}" and deploy'
    else:
        tail = _no_target(branch, architectures, branches)
    return Note(branch, past, target, f"{head}: {tail}")


def _no_target(branch: str, architectures: Collection[str], branches: Mapping[str, Any]) -> str:
    """Why no branch is named to move to."""
    lasts = sorted(
        a
        for a in set(architectures)
        if (last := compat.ARCHITECTURES[a].last_driver_branch) is not None and last <= int(branch)
    )
    if lasts:
        return (
            f"no newer branch for these GPUs: R{branch} is the last branch for "
            f"{', '.join(lasts)}, the hardware's last"
        )
    newer = [
        name
        for name in sorted(branches, key=int)
        if int(name) > int(branch)
        and all(compat.branch_supports(arch, int(name)) for arch in architectures)
    ]
    if newer:
        listed = ", ".join(f"R{name}" for name in newer)
        return f"the newer branches the catalog has for these GPUs ({listed}) are past theirs too"
    return f"the catalog has no newer branch than R{branch} to move to"


def markdown_table(branches: Mapping[str, Any]) -> str:
    """The branches' lifecycle as docs/deploy.md's "Which branch" shows it (a test keeps the
    page equal to this), and the GPU generations whose last branch each one is."""
    lines = [
        "| branch | designation | end of life | last branch for | source |",
        "|---|---|---|---|---|",
    ]
    for life in table(branches):
        lasts = sorted(
            name
            for name, arch in compat.ARCHITECTURES.items()
            if arch.last_driver_branch == int(life.branch)
        )
        lines.append(
            f"| R{life.branch} | {life.designation or 'not listed'} | {life.when} | "
            f"{', '.join(lasts) or '-'} | {life.source} |"
        )
    return "\n".join(lines) + "\n"
