"""The figures of one concurrency level, with `vllm bench serve`'s names and definitions: TTFT,
TPOT (excluding the first token), ITL, E2EL (mean, median, std, p99 in ms), request, output and
total token throughput, the peak output tok/s. Pure functions of what the client measured."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation (numpy's default, which vLLM uses)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float], scale: float = 1000.0) -> dict[str, float | None]:
    """mean, median, std and p99 of values in seconds, reported in ms (scale 1000)."""
    if not values:
        return {"mean": None, "median": None, "std": None, "p99": None}
    p99 = percentile(values, 99)
    return {
        "mean": statistics.fmean(values) * scale,
        "median": statistics.median(values) * scale,
        "std": statistics.pstdev(values) * scale,
        "p99": None if p99 is None else p99 * scale,
    }


@dataclass
class RequestResult:
    """One request as the client saw it; times in seconds (perf_counter)."""

    ok: bool
    start: float = 0.0
    ttft: float | None = None
    latency: float | None = None  # E2EL: send to the last data event
    # vLLM's bench's clock: one time per chunk with choices (text or not), ITL between them
    itl: list[float] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # absolute
    output_tokens: int = 0
    prompt_tokens: int = 0
    server_decode_tps: float | None = None  # llama.cpp timings.predicted_per_second
    error: str | None = None
    status: int | None = None
    content: str = ""  # the streamed answer's text (choice 0), for `gpubox bench --smoke`
    reasoning: str = ""  # reasoning_content (llama.cpp) or reasoning (vLLM)
    finish_reason: str | None = None


def tpot(result: RequestResult) -> float | None:
    """vLLM's TPOT: (E2EL - TTFT) / (output_tokens - 1); None with fewer than 2 tokens."""
    if result.ttft is None or result.latency is None or result.output_tokens < 2:
        return None
    return (result.latency - result.ttft) / (result.output_tokens - 1)


def peak_output_throughput(results: Iterable[RequestResult], start: float) -> float:
    """Largest count of timed chunks (those with choices) in any whole second since start:
    vLLM's max_output_tokens_per_s, which counts the same chunks (vllm/benchmarks/serve.py)."""
    buckets: dict[int, int] = {}
    for result in results:
        for t in result.token_times:
            second = int(t - start)
            buckets[second] = buckets.get(second, 0) + 1
    return float(max(buckets.values(), default=0))


def level_metrics(
    results: Sequence[RequestResult], duration: float, concurrency: int
) -> dict[str, Any]:
    """Every figure of one concurrency level, with `vllm bench serve`'s JSON keys.

    Failed requests count only in `failed`: never in latencies or throughput."""
    done = [r for r in results if r.ok]
    input_tokens = sum(r.prompt_tokens for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    tpots = [t for t in (tpot(r) for r in done) if t is not None]
    figures: dict[str, Any] = {
        "max_concurrency": concurrency,
        "duration": duration,
        "completed": len(done),
        "failed": len(results) - len(done),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration if duration > 0 else None,
        "output_throughput": output_tokens / duration if duration > 0 else None,
        "total_token_throughput": (
            (input_tokens + output_tokens) / duration if duration > 0 else None
        ),
    }
    for name, values in (
        ("ttft", [r.ttft for r in done if r.ttft is not None]),
        ("tpot", tpots),
        ("itl", [gap for r in done for gap in r.itl]),
        ("e2el", [r.latency for r in done if r.latency is not None]),
    ):
        for stat, value in summarize(values).items():
            figures[f"{stat}_{name}_ms"] = value
    # Per-request decode speed: ours (1 / TPOT) beside the server's own (llama.cpp timings).
    figures["mean_decode_tps"] = statistics.fmean(1 / t for t in tpots) if tpots else None
    server = [r.server_decode_tps for r in done if r.server_decode_tps]
    figures["mean_server_decode_tps"] = statistics.fmean(server) if server else None
    starts = [r.start for r in results if r.start]
    figures["max_output_tokens_per_s"] = (
        peak_output_throughput(done, min(starts)) if starts else 0.0
    )
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = r.error or "unknown error"
            errors[key] = errors.get(key, 0) + 1
    figures["errors"] = errors
    return figures
