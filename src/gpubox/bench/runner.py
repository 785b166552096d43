"""The sweep: seeded prompts, the warm-up, then each concurrency level run from a bounded pool
of threads (one per request in flight), with a progress line; ``bench_endpoint`` returns the
whole report of one endpoint."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import Any

from gpubox.bench.client import KEY_HINT, BenchError, Endpoint, probe, stream_request
from gpubox.bench.metrics import RequestResult, level_metrics, tpot

# Short common English words: most tokenizers (Qwen, Llama) make one token of each, with the
# leading space. Never reorder or edit: the prompts of a seed would change.
_WORD_TEXT = (
    "the of and to in is it you that he was for on are as with his they at be this have from or "
    "one had by word but not what all were we when your can said there use an each which she do "
    "how their if will up other about out many then them these so some her would make like him "
    "into time has look two more write go see number no way could people my than first water "
    "been call who oil its now find long down day did get come made may part over new sound take "
    "only little work know place year live me back give most very after thing our just name good "
    "sentence man think say great where help through much before line right too mean old any "
    "same tell boy follow came want show also around form three small set put end does another "
    "well large must big even such because turn here why ask went men read need land different "
    "home us move try kind hand picture again change off play spell air away animal house point "
    "page letter mother answer found study still learn should world high every near add food "
    "between own below country plant last school father keep tree never start city earth eye "
    "light thought head under story saw left few while along might close something seem next "
    "hard open example begin life always those both paper together got group often run"
)
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


def make_prompt(tokens: int, seed: int, index: int) -> str:
    """About `tokens` tokens of seeded words (one word ~ one token); the same for the same
    (tokens, seed, index) on every machine and Python version."""
    rng = random.Random(f"gpubox-bench/{seed}/{index}")
    return " ".join(rng.choice(WORDS) for _ in range(max(1, tokens)))


@dataclass
class Settings:
    concurrency: list[int]
    requests: int | None  # per level; None: max(8, 4 x concurrency)
    prompt_tokens: int
    max_tokens: int
    warmup: int
    seed: int
    ignore_eos: bool
    timeout: float

    def requests_for(self, concurrency: int) -> int:
        return self.requests if self.requests else max(8, 4 * concurrency)


class Progress:
    """requests done/total of a level, on one stderr line."""

    def __init__(self, label: str, total: int, stream: Any = None) -> None:
        self.label, self.total = label, total
        self.stream = stream if stream is not None else sys.stderr
        self.done = self.failed = 0
        self.lock = threading.Lock()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.last = 0.0

    def update(self, ok: bool) -> None:
        with self.lock:
            self.done += 1
            self.failed += not ok
            now = time.monotonic()
            if self.done == self.total or now - self.last >= (0.1 if self.tty else 5.0):
                self.last = now
                end = "\n" if self.done == self.total else ("\r" if self.tty else "\n")
                width = 30
                filled = width * self.done // max(1, self.total)
                bar = "#" * filled + "." * (width - filled)
                failed = f", {self.failed} failed" if self.failed else ""
                print(
                    f"{self.label} [{bar}] {self.done}/{self.total}{failed}",
                    end=end,
                    file=self.stream,
                    flush=True,
                )


def run_level(
    endpoint: Endpoint,
    settings: Settings,
    concurrency: int,
    total: int,
    first_index: int = 0,
    progress: Progress | None = None,
    observe: Callable[[dict[str, str], str | None], None] | None = None,
) -> tuple[list[RequestResult], float]:
    """`total` requests, at most `concurrency` at once; (results, wall time of the level)."""
    prompts = [
        make_prompt(settings.prompt_tokens, settings.seed, first_index + i) for i in range(total)
    ]
    results: list[RequestResult] = []
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bench") as pool:
        futures = [
            pool.submit(stream_request, endpoint, p, settings.max_tokens, settings.ignore_eos)
            for p in prompts
        ]
        for future in as_completed(futures):
            result, headers, fingerprint = future.result()
            results.append(result)
            if observe:
                observe(headers, fingerprint)
            if progress:
                progress.update(result.ok)
    duration = time.perf_counter() - start
    return results, duration


def bench_endpoint(endpoint: Endpoint, settings: Settings, label: str = "") -> dict[str, Any]:
    """Probe the endpoint, warm it up, run every level; the whole report as a dict."""
    info = probe(endpoint)
    seen: dict[str, Any] = {"headers": {}, "system_fingerprint": None}

    def observe(headers: dict[str, str], fingerprint: str | None) -> None:
        if headers and not seen["headers"]:
            seen["headers"] = {
                k: v for k, v in headers.items() if k in ("server", "x-request-id", "via")
            }
        if fingerprint:
            seen["system_fingerprint"] = fingerprint

    prefix = f"{label}: " if label else ""
    if settings.warmup:
        warm = min(settings.warmup, max(settings.concurrency))
        # Warm-up prompts use indices no level uses, so no prompt cache helps the levels.
        results, _ = run_level(
            endpoint,
            settings,
            warm,
            settings.warmup,
            first_index=10**6,
            observe=observe,
            progress=Progress(f"{prefix}warm-up", settings.warmup),
        )
        refused = [r for r in results if r.status in (401, 403)]
        if refused:
            raise BenchError(
                f"{endpoint.url} refused the chat request ({refused[0].status}): {KEY_HINT}"
            )
    levels = []
    index = 0
    for concurrency in settings.concurrency:
        total = settings.requests_for(concurrency)
        progress = Progress(f"{prefix}concurrency {concurrency}", total)
        results, duration = run_level(
            endpoint, settings, concurrency, total, index, progress, observe
        )
        index += total
        if results and all(r.status in (401, 403) for r in results):
            raise BenchError(f"{endpoint.url} refused every chat request: {KEY_HINT}")
        figures = level_metrics(results, duration, concurrency)
        figures["requests"] = [
            {k: v for k, v in asdict(r).items() if k not in ("itl", "token_times")}
            | {"tpot": tpot(r)}
            for r in results
        ]
        levels.append(figures)
    info["response_headers"] = seen["headers"]
    info["system_fingerprint"] = seen["system_fingerprint"]
    return {"endpoint": info, "levels": levels}
