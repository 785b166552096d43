"""The last figures, kept on this machine for `gpubox doctor`: under $GPUBOX_STATE_DIR or
~/.local/state/gpubox, in bench/url-<URL>.json and, with --inventory, bench/host-<name>.json."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpubox.bench.client import normalize_url


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


# The settings a record keeps: what `gpubox deploy --canary` must repeat to measure the same
# kind of output tokens/s (gpubox.rules.canary).
RECORD_SETTINGS = ("prompt_tokens", "max_tokens", "ignore_eos", "seed")


def summary_record(
    report: dict[str, Any], date: str | None = None, settings: Any = None
) -> dict[str, Any]:
    """The few figures doctor shows, from one endpoint's report; with ``settings`` (the
    bench's gpubox.bench.runner.Settings), the prompt and output lengths, seed and ignore_eos
    that made them."""
    info = report["endpoint"]
    kept = {}
    if settings is not None:
        kept["settings"] = {k: getattr(settings, k) for k in RECORD_SETTINGS}
    return {
        "date": date or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "url": info["url"],
        "model": info["model"],
        "backend": info.get("backend"),
        "backend_version": info.get("backend_version"),
        **kept,
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
