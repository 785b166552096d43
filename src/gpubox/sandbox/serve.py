"""What the sandbox's loopback HTTP servers share: the stand-in NVIDIA repository (repo.py),
the Hugging Face Hub and PyPI mirror (hub.py) and the ModelScope mirror (modelscope_mirror.py,
over HTTPS). All answer single byte ranges as GitHub's and Hugging Face's servers do, log each
request to stderr with the time, and serve until SIGTERM or until the box's supervisor is
gone, so they never outlive the box."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpubox.sandbox.common import process_start_time

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")

# `gpubox sandbox up --download-rate BYTES_PER_S`: the environment the sandbox's own servers
# (the Hub and PyPI mirror, the stand-in repositories and the URL server) inherit; each caps
# every response body at this rate (Debian's mirror is bridged, not served, and stays as is).
RATE_ENV = "GPUBOX_SANDBOX_DOWNLOAD_RATE"
MIN_RATE = 1024


def download_rate() -> int | None:
    """The rate the sandbox was brought up with (bytes per second), None when unthrottled."""
    value = os.environ.get(RATE_ENV, "")
    return max(MIN_RATE, int(value)) if value.isdigit() and int(value) > 0 else None


def paced_write(write: Callable[[bytes], Any], data: bytes, rate: int | None) -> None:
    """``data`` through ``write``, at most ``rate`` bytes per second (all at once when None)."""
    if rate is None:
        write(data)
        return
    chunk = max(1024, min(64 * 1024, rate // 8))
    began = time.monotonic()
    for sent in range(0, len(data), chunk):
        write(data[sent : sent + chunk])
        ahead = (sent + chunk) / rate - (time.monotonic() - began)
        if ahead > 0:
            time.sleep(ahead)


def paced_copy(source: Any, write: Callable[[bytes], Any], rate: int | None) -> int:
    """A file object's bytes through ``write``, at most ``rate`` bytes per second."""
    chunk = 64 * 1024 if rate is None else max(1024, min(64 * 1024, rate // 8))
    sent = 0
    began = time.monotonic()
    while data := source.read(chunk):
        write(data)
        sent += len(data)
        if rate is not None:
            ahead = sent / rate - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)
    return sent


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """(start, end) of a single byte range (``bytes=N-``, ``N-M``, ``-N``); None to answer the
    whole file (no Range, or one this server does not take, such as several ranges);
    "unsatisfiable" for a 416."""
    match = _RANGE.fullmatch(header.strip()) if header else None
    if not match or not (match[1] or match[2]):
        return None
    if match[1]:
        start = int(match[1])
        end = min(int(match[2]), size - 1) if match[2] else size - 1
    else:
        start, end = max(0, size - int(match[2])), size - 1
    if start >= size or start > end:
        return "unsatisfiable"
    return start, end


class StderrLog(BaseHTTPRequestHandler):
    """Each request logged to stderr, one line with the time (the servers' log files)."""

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {self.address_string()} {format % args}\n")
        sys.stderr.flush()


def serve_until_stopped(
    handler: Callable[..., BaseHTTPRequestHandler],
    bind: str,
    port: int,
    describe: Callable[[int], str],
    watch: tuple[int, int] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    ready: Callable[[int], None] = lambda port: None,
    tls: ssl.SSLContext | None = None,
) -> int:
    """Serve on ``bind``:``port`` until SIGTERM or SIGINT (in the main thread),
    ``should_stop()``, or until the watched process (PID, kernel start time: the box's
    supervisor) is gone; polls every second, so the loop always ends. Once bound, prints the
    time and ``describe(bound port)`` to stderr and hands the bound port to ``ready`` (``port``
    0: one the kernel picks). With ``tls``, HTTPS: each connection's handshake runs in its
    own thread, under the handler's timeout, so a client that never shakes hands holds no
    one up."""
    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
    ThreadingHTTPServer.allow_reuse_address = True
    with ThreadingHTTPServer((bind, port), handler) as httpd:
        httpd.daemon_threads = True
        httpd.timeout = 1.0
        if tls is not None:
            httpd.socket = tls.wrap_socket(
                httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        bound = httpd.server_address[1]
        print(f"{time.strftime('%H:%M:%S')} {describe(bound)}", file=sys.stderr, flush=True)
        ready(bound)
        while not stop and not should_stop():
            if watch and process_start_time(watch[0]) != watch[1]:
                print("the box's supervisor is gone: stopping", file=sys.stderr, flush=True)
                break
            with contextlib.suppress(InterruptedError):
                httpd.handle_request()
    return 0


def file_arguments(
    parser: argparse.ArgumentParser, specs: list[str], metavar: str
) -> dict[str, Path]:
    """The ``--file KEY=FILE`` arguments (``metavar``: how the help names them) as a dict; a
    malformed one is the parser's error."""
    files = {}
    for spec in specs:
        key, sep, path = spec.partition("=")
        if not sep or not key or not path:
            parser.error(f"--file wants {metavar}, not {spec!r}")
        files[key] = Path(path)
    return files


class ControlFile:
    """A stand-in server's test controls: a JSON object in a file, read at each download
    (absent or unreadable: no controls); ``_write`` puts back what a control used up."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    def read(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, Any]) -> None:
        assert self.path is not None
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)


class RequestLog:
    """One JSON line per request, appended to a file (None: not kept)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    def write(self, entry: dict[str, Any]) -> None:
        if self.path is None:
            return
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")


def read_log(path: Path) -> list[dict[str, Any]]:
    """The entries of a request log (for the tests)."""
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []
