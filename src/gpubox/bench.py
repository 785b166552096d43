"""gpubox bench: measure an OpenAI-compatible endpoint the way `vllm bench serve` does.

Streams /v1/chat/completions (stream_options.include_usage) from a bounded pool of threads,
one per concurrent request, and reports per concurrency level, with vLLM's names and
definitions: TTFT, TPOT (excluding the first token), ITL, E2EL (mean, median, p99 in ms),
request, output and total token throughput. Token counts come from the server's usage chunk;
llama.cpp's own `timings.predicted_per_second` is shown beside the decode speed we measure.

After each run a small summary (date, URL, model, per level the output tok/s, median TTFT and
TPOT, failures) is kept on this machine under $GPUBOX_STATE_DIR or ~/.local/state/gpubox, in
bench/url-<URL>.json (e.g. url-http_box_8080.json) and, with --inventory, also in
bench/host-<name>.json: `gpubox doctor` shows it.

Prompts are made of words drawn from a fixed list with a seeded generator, one word standing
for about one token (the server's usage reports the real prompt length), so two boxes or two
backends given the same settings do the same work.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

KEY_ENV = "GPUBOX_API_KEY"
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


class BenchError(Exception):
    """A problem that stops the bench before it measures anything (exit 2)."""


# ---------------------------------------------------------------- statistics (pure functions)


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
    itl: list[float] = field(default_factory=list)  # gaps between chunks with tokens
    token_times: list[float] = field(default_factory=list)  # absolute, one per token chunk
    output_tokens: int = 0
    prompt_tokens: int = 0
    server_decode_tps: float | None = None  # llama.cpp timings.predicted_per_second
    error: str | None = None
    status: int | None = None


def tpot(result: RequestResult) -> float | None:
    """vLLM's TPOT: (E2EL - TTFT) / (output_tokens - 1); None with fewer than 2 tokens."""
    if result.ttft is None or result.latency is None or result.output_tokens < 2:
        return None
    return (result.latency - result.ttft) / (result.output_tokens - 1)


def peak_output_throughput(results: Iterable[RequestResult], start: float) -> float:
    """Largest count of token chunks in any whole second since start (vLLM's peak tok/s)."""
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


# ---------------------------------------------------------------- prompts


def make_prompt(tokens: int, seed: int, index: int) -> str:
    """About `tokens` tokens of seeded words (one word ~ one token); the same for the same
    (tokens, seed, index) on every machine and Python version."""
    rng = random.Random(f"gpubox-bench/{seed}/{index}")
    return " ".join(rng.choice(WORDS) for _ in range(max(1, tokens)))


# ---------------------------------------------------------------- HTTP


@dataclass
class Endpoint:
    url: str  # base URL, without /v1
    model: str
    api_key: str | None = None
    timeout: float = 600.0

    def connection(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.url)
        host = parts.hostname or "localhost"
        if parts.scheme == "https":
            return http.client.HTTPSConnection(host, parts.port, timeout=self.timeout)
        return http.client.HTTPConnection(host, parts.port, timeout=self.timeout)

    def path(self, suffix: str) -> str:
        base = urlsplit(self.url).path.rstrip("/")
        if base.endswith("/v1") and suffix.startswith("/v1/"):
            base = base[:-3]
        return base + suffix

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def normalize_url(url: str) -> str:
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchError(f"not an http(s) URL: {url}")
    return url.rstrip("/")


def _get_json(
    endpoint: Endpoint, path: str, timeout: float = 10.0
) -> tuple[int, dict[str, str], Any]:
    conn = endpoint.connection()
    conn.timeout = timeout
    try:
        conn.request("GET", endpoint.path(path), headers=endpoint.headers())
        resp = conn.getresponse()
        body = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = body.decode(errors="replace")[:500]
    return resp.status, headers, data


KEY_HINT = f"pass the key with --api-key-file FILE or the {KEY_ENV} environment variable"


def probe(endpoint: Endpoint) -> dict[str, Any]:
    """What the endpoint says about itself; raises BenchError when it cannot be benched:
    unreachable, 401, or a model it does not serve."""
    try:
        status, headers, data = _get_json(endpoint, "/v1/models")
    except (OSError, http.client.HTTPException) as exc:
        raise BenchError(f"cannot reach {endpoint.url}: {exc}") from exc
    if status in (401, 403):
        given = "the key given was refused" if endpoint.api_key else "no key was given"
        raise BenchError(f"{endpoint.url} answered {status} ({given}): {KEY_HINT}")
    if status != 200 or not isinstance(data, dict):
        raise BenchError(f"{endpoint.url}/v1/models answered {status}: {data!r}")
    models = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
    if endpoint.model not in models:
        served = ", ".join(str(m) for m in models) or "none"
        raise BenchError(
            f"{endpoint.url} does not serve model {endpoint.model!r}; it serves: {served}"
        )
    info: dict[str, Any] = {
        "url": endpoint.url,
        "model": endpoint.model,
        "models": data.get("data"),
        "server_header": headers.get("server"),
    }
    owned_by = {str(m.get("owned_by")) for m in data.get("data", []) if isinstance(m, dict)}
    # llama.cpp tells its build on /props, vLLM its version on /version; neither is fatal.
    for path, key in (("/props", "props"), ("/version", "version")):
        try:
            status, _, extra = _get_json(endpoint, path, timeout=5.0)
        except (OSError, http.client.HTTPException):
            continue
        if status == 200 and isinstance(extra, dict):
            if key == "props":
                extra = {k: extra.get(k) for k in ("build_info", "model_path", "total_slots")}
            info[key] = extra
    if "props" in info or "llamacpp" in owned_by:
        info["backend"] = "llama.cpp"
        info["backend_version"] = (info.get("props") or {}).get("build_info")
    elif "version" in info or "vllm" in owned_by:
        info["backend"] = "vllm"
        info["backend_version"] = (info.get("version") or {}).get("version")
    else:
        info["backend"] = headers.get("server") or "unknown"
        info["backend_version"] = None
    return info


def _events(resp: http.client.HTTPResponse) -> Iterator[tuple[float, str]]:
    """(arrival time, data) of each SSE data event; comments and other fields are skipped."""
    while True:
        line = resp.readline()
        if not line:
            return
        now = time.perf_counter()
        if line.startswith(b"data:"):
            yield now, line[5:].strip().decode("utf-8", errors="replace")


def _has_token(delta: dict[str, Any]) -> bool:
    return any(delta.get(k) for k in ("content", "reasoning_content", "reasoning"))


def stream_request(
    endpoint: Endpoint, prompt: str, max_tokens: int, ignore_eos: bool
) -> tuple[RequestResult, dict[str, str], str | None]:
    """One streamed chat completion: (RequestResult, response headers, system_fingerprint)."""
    body: dict[str, Any] = {
        "model": endpoint.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    if ignore_eos:
        body["ignore_eos"] = True  # llama.cpp and vLLM: the full max_tokens, like vLLM's bench
    payload = json.dumps(body).encode()
    result = RequestResult(ok=False)
    headers: dict[str, str] = {}
    fingerprint = None
    conn = endpoint.connection()
    result.start = start = time.perf_counter()
    try:
        conn.request("POST", endpoint.path("/v1/chat/completions"), payload, endpoint.headers())
        resp = conn.getresponse()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        result.status = resp.status
        if resp.status != 200:
            text = resp.read(2000).decode(errors="replace").strip()
            result.error = f"HTTP {resp.status}: {text[:300]}"
            return result, headers, fingerprint
        last = None
        token_chunks = 0
        usage_tokens = None
        done = False
        for now, data in _events(resp):
            if data == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                result.error = f"not JSON in the stream: {data[:200]}"
                return result, headers, fingerprint
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk:
                result.error = f"error event: {json.dumps(chunk['error'])[:300]}"
                return result, headers, fingerprint
            last = now
            fingerprint = chunk.get("system_fingerprint") or fingerprint
            for choice in chunk.get("choices") or []:
                if _has_token(choice.get("delta") or {}):
                    if result.ttft is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - result.token_times[-1])
                    result.token_times.append(now)
                    token_chunks += 1
                    break
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                usage_tokens = usage.get("completion_tokens")
                result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            timings = chunk.get("timings")
            if isinstance(timings, dict) and timings.get("predicted_per_second"):
                result.server_decode_tps = float(timings["predicted_per_second"])
        if not done:
            result.error = "stream ended without [DONE]"
        elif result.ttft is None:
            result.error = "no token streamed"
        else:
            result.ok = True
            result.latency = (last or time.perf_counter()) - start
            result.output_tokens = int(usage_tokens) if usage_tokens else token_chunks
    except (OSError, http.client.HTTPException) as exc:
        result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    finally:
        conn.close()
    return result, headers, fingerprint


# ---------------------------------------------------------------- running levels


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


# ---------------------------------------------------------------- output

ROWS: tuple[tuple[str, str, str], ...] = (
    ("Successful requests:", "completed", "d"),
    ("Failed requests:", "failed", "d"),
    ("Benchmark duration (s):", "duration", ".2f"),
    ("Total input tokens:", "total_input_tokens", "d"),
    ("Total generated tokens:", "total_output_tokens", "d"),
    ("Request throughput (req/s):", "request_throughput", ".2f"),
    ("Output token throughput (tok/s):", "output_throughput", ".2f"),
    ("Peak output token throughput (tok/s):", "max_output_tokens_per_s", ".2f"),
    ("Total token throughput (tok/s):", "total_token_throughput", ".2f"),
    *(
        (
            f"{stat.capitalize() if stat != 'p99' else 'P99'} {name.upper()} (ms):",
            f"{stat}_{name}_ms",
            ".2f",
        )
        for name in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "p99")
    ),
    ("Decode per request (tok/s, 1/TPOT):", "mean_decode_tps", ".2f"),
    ("Server-reported decode (tok/s):", "mean_server_decode_tps", ".2f"),
)


def format_table(report: dict[str, Any]) -> str:
    info = report["endpoint"]
    levels = report["levels"]
    version = f" {info['backend_version']}" if info.get("backend_version") else ""
    lines = [f"{info['url']}  model {info['model']}  backend {info.get('backend')}{version}"]
    header = "Maximum request concurrency:"
    lines.append(f"{header:<40}" + "".join(f"{lv['max_concurrency']:>12}" for lv in levels))
    for label, key, fmt in ROWS:
        cells = []
        for lv in levels:
            value = lv.get(key)
            cells.append(f"{'-' if value is None else format(value, fmt):>12}")
        lines.append(f"{label:<40}" + "".join(cells))
    for lv in levels:
        for error, count in lv.get("errors", {}).items():
            lines.append(f"  concurrency {lv['max_concurrency']}: {count} failed: {error}")
    return "\n".join(lines)


def write_plot(reports: dict[str, dict[str, Any]], path: str) -> str | None:
    """Output throughput and median TPOT against concurrency, two panels, one line per
    endpoint; an error message or None. matplotlib (the optional extra "plot") is imported
    here only, with the Agg backend: no display needed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot needs matplotlib (pip install matplotlib); no plot was drawn"

    def figure(value: Any) -> float:
        return float("nan") if value is None else float(value)  # a gap, never a fake 0

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    try:
        for name, report in reports.items():
            levels = report["levels"]
            label = name or report["endpoint"].get("url", "")
            xs = [lv["max_concurrency"] for lv in levels]
            ax1.plot(xs, [figure(lv.get("output_throughput")) for lv in levels], "o-", label=label)
            ax2.plot(xs, [figure(lv.get("median_tpot_ms")) for lv in levels], "o-", label=label)
        ax1.set(
            title="Output token throughput",
            xlabel="concurrency",
            ylabel="output token throughput (tok/s)",
        )
        ax2.set(title="Median TPOT", xlabel="concurrency", ylabel="median TPOT (ms)")
        ticks = sorted({lv["max_concurrency"] for r in reports.values() for lv in r["levels"]})
        for ax in (ax1, ax2):
            ax.set_xticks(ticks)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(path, format="png")
    except OSError as exc:
        return f"cannot write --plot {path}: {exc}"
    finally:
        plt.close(fig)
    return None


# ---------------------------------------------------------------- the last figures, kept


def records_dir() -> Path:
    """Where the last bench figures are kept: $GPUBOX_STATE_DIR or ~/.local/state/gpubox,
    then bench/ (on the operator's machine, not the box)."""
    env = os.environ.get("GPUBOX_STATE_DIR")
    base = Path(env) if env else Path.home() / ".local" / "state" / "gpubox"
    return base / "bench"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_") or "_"


def record_url(url: str) -> str:
    """The URL a record is kept under: scheme and host lower-cased, no trailing / or /v1."""
    url = normalize_url(url)
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc.lower()}{path.rstrip('/')}"


def record_paths(url: str | None = None, host: str | None = None) -> list[Path]:
    """The record files for a host name and a URL, the host's first."""
    base = records_dir()
    paths = []
    if host:
        paths.append(base / f"host-{_safe(host)}.json")
    if url:
        paths.append(base / f"url-{_safe(record_url(url))}.json")
    return paths


def host_url(name: str, ssh_hostname: str | None, api_port: int) -> str:
    """The endpoint --inventory benches for a host (and doctor looks its record up by)."""
    return f"http://{ssh_hostname or name}:{api_port}"


def summary_record(report: dict[str, Any], date: str | None = None) -> dict[str, Any]:
    """The few figures doctor shows, from one endpoint's report."""
    info = report["endpoint"]
    return {
        "date": date or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "url": info["url"],
        "model": info["model"],
        "backend": info.get("backend"),
        "backend_version": info.get("backend_version"),
        "levels": [
            {
                "concurrency": lv["max_concurrency"],
                "output_throughput": lv["output_throughput"],
                "median_ttft_ms": lv["median_ttft_ms"],
                "median_tpot_ms": lv["median_tpot_ms"],
                "completed": lv["completed"],
                "failed": lv["failed"],
            }
            for lv in report["levels"]
        ],
        "failed": sum(lv["failed"] for lv in report["levels"]),
    }


def save_record(record: dict[str, Any], host: str | None = None) -> list[Path]:
    """Keep the record under its URL (and its host name); the files written."""
    written = []
    for path in record_paths(record["url"], host):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(path)
        written.append(path)
    return written


def load_record(host: str | None = None, url: str | None = None) -> dict[str, Any] | None:
    """The last record of a host (by name), else of its URL; None when there is none or it is
    not a bench record."""
    for path in record_paths(url, host):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("levels"), list):
            return record
    return None


# ---------------------------------------------------------------- command line


def _concurrency_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return values


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpubox bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "The API key: --api-key-file FILE, else the GPUBOX_API_KEY environment variable. "
            "On a gpubox box the key lives root-only at the host's api_key_file "
            "(/etc/gpubox/api-key); with --inventory the bench does not read it over ssh, so "
            "copy it to a local file (one key, used for every host). "
            "Exit status: 0 all requests completed, 1 some failed, 2 nothing could be measured "
            "(unreachable endpoint, refused key, unknown model, bad arguments)."
        ),
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("url", nargs="?", help="the endpoint's base URL, e.g. http://box:8080")
    target.add_argument(
        "--inventory",
        metavar="INV",
        help="bench every host of a gpubox inventory: http://{ssh_hostname}:{api_port}, "
        "model model_alias (the API must listen on an address this machine reaches: api_host)",
    )
    parser.add_argument("--model", help="the model id to request (required with a URL)")
    parser.add_argument("--api-key-file", metavar="F", help=f"file with the API key ({KEY_ENV})")
    parser.add_argument(
        "--concurrency",
        type=_concurrency_list,
        default=[1, 2, 4],
        metavar="1,2,4",
        help="concurrency levels, comma separated (default 1,2,4)",
    )
    parser.add_argument(
        "--requests",
        type=_positive,
        metavar="N",
        help="requests per level (default max(8, 4 x concurrency))",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=_positive,
        default=256,
        metavar="N",
        help="prompt length, approximated as N words from a fixed list (default 256)",
    )
    parser.add_argument(
        "--max-tokens",
        type=_positive,
        default=256,
        metavar="N",
        help="output tokens per request (default 256)",
    )
    parser.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let the model stop early (default: ignore_eos, every request writes max-tokens)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        metavar="N",
        help="requests before the first level, not counted (default 1)",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="prompt seed (default 0)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds without data before a request fails (default 600)",
    )
    parser.add_argument("--json", metavar="OUT", help="write every figure and the settings")
    parser.add_argument(
        "--plot",
        metavar="OUT.png",
        help="throughput and TPOT against concurrency (needs matplotlib)",
    )
    from gpubox import llamabench

    llamabench.add_arguments(parser)
    return parser


def _read_key(path: str | None) -> str | None:
    if path:
        try:
            with open(os.path.expanduser(path)) as f:
                lines = [ln.strip() for ln in f if ln.strip()]
        except OSError as exc:
            raise BenchError(f"cannot read --api-key-file {path}: {exc}") from exc
        if not lines:
            raise BenchError(f"--api-key-file {path} is empty")
        return lines[0]
    return os.environ.get(KEY_ENV) or None


INVENTORY_KEYS = ("ssh_hostname", "api_port", "model_alias")
_LOAD_INVENTORY = """
import json, sys
from gpubox import inventory
keys = sys.argv[2:]
try:
    hosts = inventory.load(sys.argv[1])
except inventory.InventoryError as exc:
    sys.exit(str(exc))
print(json.dumps([[n, {k: d[k] for k in keys if k in d}] for n, d in hosts]))
"""


def _load_inventory(path: str) -> list[tuple[str, dict[str, Any]]]:
    """(host, the keys the bench needs) of every host, read in a child process: importing
    pyinfra's CLI monkey-patches threads and sockets with gevent, which the bench's threads and
    clocks must not run under."""
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_INVENTORY, path, *INVENTORY_KEYS],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise BenchError(f"cannot read {path}: {lines[-1] if lines else 'unknown error'}")
    return [(name, data) for name, data in json.loads(proc.stdout)]


def _targets(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(label, url, model) of every endpoint to bench."""
    if args.url:
        if not args.model:
            raise BenchError("--model NAME is required with a URL (see /v1/models)")
        return [("", normalize_url(args.url), args.model)]
    from gpubox import config

    hosts = _load_inventory(args.inventory)
    if not hosts:
        raise BenchError(f"{args.inventory} defines no hosts")

    def value(data: dict[str, Any], key: str) -> Any:
        return data.get(key, config.KEYS_BY_NAME[key].default)

    targets = []
    for name, data in hosts:
        url = host_url(name, data.get("ssh_hostname"), value(data, "api_port"))
        targets.append((name, url, args.model or value(data, "model_alias")))
    return targets


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from gpubox import llamabench

    llamabench.check_arguments(parser, args)
    settings = Settings(
        concurrency=args.concurrency,
        requests=args.requests,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        warmup=max(0, args.warmup),
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        timeout=args.timeout,
    )
    try:
        key = _read_key(args.api_key_file)
        targets = _targets(args)
    except BenchError as exc:
        print(f"gpubox bench: {exc}", file=sys.stderr)
        return 2
    reports: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    for label, url, model in targets:
        endpoint = Endpoint(url, model, key, settings.timeout)
        try:
            report = bench_endpoint(endpoint, settings, label)
        except BenchError as exc:
            problems[label or url] = str(exc)
            print(f"gpubox bench: {exc}", file=sys.stderr)
            continue
        reports[label or url] = report
        print(("" if len(reports) == 1 else "\n") + format_table(report))
        try:
            save_record(summary_record(report), label or None)
        except OSError as exc:
            print(f"gpubox bench: cannot keep the figures for doctor: {exc}", file=sys.stderr)
    llama_rc, llama = llamabench.main_hook(args, reports)  # --llama-bench, --split-modes
    if args.json:
        document = {
            "settings": asdict(settings) | {"key_given": key is not None},
            "tool": "gpubox bench",
            "prompt_tokens_note": "prompts are words from a fixed list, one word ~ one token; "
            "total_input_tokens comes from the server's usage",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "results": reports,
            "problems": problems,
            "llama_bench": llama,
        }
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    if args.plot and reports:
        message = write_plot(reports, args.plot)
        if message:
            print(f"gpubox bench: {message}", file=sys.stderr)
    failed = any(lv["failed"] for r in reports.values() for lv in r["levels"])
    return max(llama_rc, 2 if problems else (1 if failed else 0))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
