"""The HTTP side of the bench: an OpenAI-compatible endpoint (URL, model, key), its probe
(/v1/models, then /props or /version for the backend) and one streamed chat completion read
as server-sent events, timed chunk by chunk (standard library only)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpubox.bench.metrics import RequestResult

KEY_ENV = "GPUBOX_API_KEY"


class BenchError(Exception):
    """A problem that stops the bench before it measures anything (exit 2)."""


class EndpointUnreachable(BenchError):
    """The endpoint could not be reached at all (exit 3); the message is why."""


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
        raise EndpointUnreachable(str(exc) or type(exc).__name__) from exc
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
        # llama.cpp and vLLM: the full max_tokens. `vllm bench serve` sends it for its random
        # prompts too (vllm/benchmarks/serve.py, 0.19.1: dataset random or random-mm on an
        # OpenAI-compatible backend sets args.ignore_eos, whatever --ignore-eos says)
        body["ignore_eos"] = True
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
        token_chunks = 0  # chunks that carried text: the output count when usage is missing
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
            choices = chunk.get("choices") or []
            if choices:
                # vLLM's bench (vllm/benchmarks/lib/endpoint_request_func.py): a timestamp for
                # every chunk with choices, text or not (the role chunk, a token the parser
                # holds back, the finish chunk): TTFT at the first, ITL between them
                if result.ttft is None:
                    result.ttft = now - start
                else:
                    result.itl.append(now - result.token_times[-1])
                result.token_times.append(now)
            for choice in choices:
                delta = choice.get("delta") or {}
                if choice.get("index", 0) == 0:
                    result.content += delta.get("content") or ""
                    result.reasoning += (
                        delta.get("reasoning_content") or delta.get("reasoning") or ""
                    )
                    result.finish_reason = choice.get("finish_reason") or result.finish_reason
                if _has_token(delta):
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
        elif not token_chunks:
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
