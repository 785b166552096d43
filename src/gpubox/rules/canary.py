"""`gpubox deploy INVENTORY --canary N` (docs/deploy.md, "A canary through a fleet"): which
hosts go first, the short bench that compares a canary with its own baseline (its last
recorded `gpubox bench`, gpubox.bench.records), and the verdict on it. Pure: the command
(gpubox.commands.canary) reads the records and runs the benches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# The inventory group whose hosts go first, when the inventory has one.
GROUP = "canary"

# A record written before the bench kept its settings (issue 30 D) was made with gpubox
# bench's defaults unless its user gave others (gpubox.bench.cli's options): assumed, and said.
DEFAULT_SETTINGS = {"prompt_tokens": 256, "max_tokens": 256, "ignore_eos": True, "seed": 0}
# The short bench: this many requests per concurrent slot of the baseline's level (at least
# MIN_REQUESTS), one warm-up request before them, not counted.
REQUESTS_PER_SLOT = 2
MIN_REQUESTS = 3


def pick(hosts: Sequence[str], group: Sequence[str] | None, count: int) -> list[str]:
    """The canaries among ``hosts`` (inventory order): the first ``count`` members of the
    inventory's group ``canary`` (``group``, in inventory order, as pyinfra lists a group)
    when it has one, else the first ``count`` hosts. Raises ValueError, the message naming
    the problem, when count is below 1 or the group has fewer members."""
    if count < 1:
        raise ValueError(f"--canary {count}: the number of canaries must be 1 or more")
    if group:
        if count > len(group):
            raise ValueError(
                f"--canary {count}: the inventory's group {GROUP!r} has {len(group)} host(s) "
                f"({', '.join(group)}); give at most {len(group)}, or add hosts to the group"
            )
        return list(group[:count])
    return list(hosts[:count])


@dataclass(frozen=True)
class Baseline:
    """What a canary's short bench is compared with: one level of the host's record."""

    concurrency: int
    output_throughput: float  # tok/s
    model: str
    date: str
    settings: dict[str, Any]  # prompt_tokens, max_tokens, ignore_eos, seed
    assumed: bool  # the record did not say its settings: DEFAULT_SETTINGS assumed


def baseline(record: dict[str, Any] | None) -> Baseline | None:
    """The record's level to compare with: its lowest concurrency that completed requests and
    measured output tokens/s; None when there is none (no record, or nothing measured)."""
    if not record:
        return None
    levels = [
        lv
        for lv in record.get("levels") or []
        if isinstance(lv, dict)
        and isinstance(lv.get("concurrency"), int)
        and lv["concurrency"] >= 1
        and isinstance(lv.get("output_throughput"), int | float)
        and lv["output_throughput"] > 0
        and lv.get("completed", 0) > 0
    ]
    if not levels:
        return None
    level = min(levels, key=lambda lv: lv["concurrency"])
    kept = record.get("settings")
    assumed = not isinstance(kept, dict)
    settings = dict(DEFAULT_SETTINGS)
    if isinstance(kept, dict):
        settings.update({k: kept[k] for k in DEFAULT_SETTINGS if k in kept})
    return Baseline(
        concurrency=int(level["concurrency"]),
        output_throughput=float(level["output_throughput"]),
        model=str(record.get("model", "")),
        date=str(record.get("date", "")),
        settings=settings,
        assumed=assumed,
    )


def short_bench(base: Baseline) -> dict[str, Any]:
    """The short bench's settings (gpubox.bench.runner.Settings' fields but the timeout): the
    baseline's prompt and output lengths, seed and ignore_eos at its concurrency, so it
    measures the same kind of output tokens/s, with few requests."""
    return {
        "concurrency": [base.concurrency],
        "requests": max(MIN_REQUESTS, REQUESTS_PER_SLOT * base.concurrency),
        "prompt_tokens": int(base.settings["prompt_tokens"]),
        "max_tokens": int(base.settings["max_tokens"]),
        "warmup": 1,
        "seed": int(base.settings["seed"]),
        "ignore_eos": bool(base.settings["ignore_eos"]),
    }


@dataclass(frozen=True)
class Verdict:
    measured: float  # tok/s
    baseline: float  # tok/s
    change_pct: float  # (measured - baseline) / baseline, in percent
    tolerance_pct: float
    passed: bool


def judge(measured: float, baseline_tok_s: float, tolerance_pct: float) -> Verdict:
    """A canary's output tokens/s against its baseline: it passes unless it is more than
    ``tolerance_pct`` percent below it (faster always passes)."""
    if baseline_tok_s <= 0:
        raise ValueError(f"a baseline of {baseline_tok_s} tok/s cannot be compared with")
    change = (measured - baseline_tok_s) / baseline_tok_s * 100.0
    return Verdict(measured, baseline_tok_s, change, tolerance_pct, change >= -tolerance_pct)


def bench_line(host: str, verdict: Verdict) -> str:
    """``canary: bench on HOST: X tok/s vs baseline Y tok/s (-Z%, tolerance T%)``."""
    return (
        f"canary: bench on {host}: {verdict.measured:.1f} tok/s vs baseline "
        f"{verdict.baseline:.1f} tok/s ({verdict.change_pct:+.1f}%, tolerance "
        f"{verdict.tolerance_pct:g}%)"
    )


def bench_failure(verdict: Verdict) -> str:
    """What the run's summary says of a canary below its tolerance."""
    return (
        f"bench: {verdict.measured:.1f} tok/s is {-verdict.change_pct:.1f}% below its baseline "
        f"{verdict.baseline:.1f} tok/s (canary_bench_tolerance {verdict.tolerance_pct:g}%)"
    )
