"""Checks of gpu-burn, nvtop (deploy/tools.py) and the burn-in record (gpubox burnin)."""

from __future__ import annotations

import datetime
import json

from gpubox.base import layout
from gpubox.checks.core import Check, Reading, Skip
from gpubox.config import HostConfig


def burn_lists(c: HostConfig, r: Reading) -> str | None:
    gpus = r.get("gpu_burn_list")
    if len(gpus) != c.gpu_count:
        return f"gpu-burn -l lists {len(gpus)} GPU(s), expected {c.gpu_count}"
    return None


def short_burn(c: HostConfig, r: Reading) -> str | None:
    """A few seconds of gpu-burn; it exits 0 even with a FAULTY GPU."""
    result = r.get("gpu_burn_short")
    bad = {i: s for i, s in result.gpus.items() if s != "OK"}
    if result.tested != c.gpu_count or bad:
        return f"gpu-burn tested {result.tested} GPU(s); not OK: {bad}"
    return None


def nvtop(c: HostConfig, r: Reading) -> str | None:
    out = r.get("nvtop")
    return None if out.startswith("nvtop version") else f"nvtop --version says {out[:80]!r}"


def burnin_record(c: HostConfig, r: Reading, now: datetime.datetime | None = None) -> str | None:
    """The last burn-in passed on every GPU and, when burn-in is required, is recent. A record
    that failed is reported even when burn-in is not required."""
    out = r.out("burnin")
    if out.rc != 0:
        if c.burnin_required:
            return f"no burn-in record ({layout.BURNIN_RECORD})"
        raise Skip("burnin_required is false in the inventory and no burn-in ran")
    try:
        record = json.loads(out.stdout)
        passed, date = record["passed"], datetime.datetime.fromisoformat(record["date"])
        ok = [g for g, s in record["gpu_burn"]["gpus"].items() if s == "OK"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{layout.BURNIN_RECORD} is unreadable ({exc})"
    if not passed:
        problems = "; ".join(record.get("problems") or [])
        return "the last burn-in failed" + (f": {problems}" if problems else "")
    if len(ok) != c.gpu_count:
        return f"the burn-in passed {len(ok)} GPU(s), gpu_count is {c.gpu_count}"
    age = ((now or datetime.datetime.now(datetime.UTC)) - date).days
    if c.burnin_required and age > c.burnin_max_age_days:
        return f"the last burn-in is {age} days old (burnin_max_age_days {c.burnin_max_age_days})"
    return None


CHECKS = [
    Check("tools.gpu-burn", "gpu-burn lists every GPU", "gpu", ("gpu_burn_list",), burn_lists),
    Check(
        "tools.burn",
        "a short gpu-burn passes on every GPU",
        "burn",
        ("gpu_burn_short",),
        short_burn,
    ),
    Check("tools.nvtop", "nvtop runs", "quick", ("nvtop",), nvtop),
    Check(
        "burnin.record",
        "the last burn-in passed and is recent",
        "quick",
        ("burnin",),
        burnin_record,
        fix="gpubox burnin {inv}",
    ),
]
