"""The metrics relay, as it runs on a box whose monitor is another box (issue 31 A,
docs/monitoring.md#ports): gpubox.stages.monitoring uploads this file whole (to
layout.METRICS_RELAY_SCRIPT) and the unit gpubox-metrics-relay runs it, as root, with its
settings file (layout.METRICS_RELAY_CONFIG; no secret in it). It imports nothing but Python's
standard library.

It answers ``GET /metrics`` only: it reads the API key from the backend's key file at each
request, asks the backend's own /metrics on its loopback address with the key in a header, and
passes the answer on. Anything else is 404 (or 405 for another method). So the API stays on
loopback, and the key never leaves the box: the monitor reads the metrics, nothing more.

Bounded: one request at a time, ``timeout_s`` for the backend's answer and for the client's
request, at most ``max_bytes`` of the backend's answer (a larger one is a 502)."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

PATH = "/metrics"


def read_key(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def failed(why: str) -> tuple[int, bytes, str]:
    return 502, f"gpubox-metrics-relay: {why}\n".encode(), "text/plain"


def fetch(settings: dict[str, Any]) -> tuple[int, bytes, str]:
    """The backend's /metrics: (status, body, content type). A failure is 502 with one line
    saying why (the key is never in it)."""
    try:
        key = read_key(settings["key_file"])
    except OSError as exc:
        return failed(f"the API key file: {exc.strerror}")
    request = urllib.request.Request(
        settings["upstream"], headers={"Authorization": f"Bearer {key}"}
    )
    limit = int(settings["max_bytes"])
    try:
        with urllib.request.urlopen(request, timeout=settings["timeout_s"]) as answer:
            body = answer.read(limit + 1)
            kind = answer.headers.get("Content-Type", "text/plain; version=0.0.4")
            status = answer.status
    except urllib.error.HTTPError as exc:
        return (
            502,
            f"gpubox-metrics-relay: the backend answered {exc.code}\n".encode(),
            "text/plain",
        )
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return failed(f"the backend: {reason}")
    if len(body) > limit:
        return failed(f"the backend's answer is over {limit} bytes")
    return status, body, kind


def handler(settings: dict[str, Any]) -> type[BaseHTTPRequestHandler]:
    class Relay(BaseHTTPRequestHandler):
        timeout = settings["timeout_s"]  # a client that sends nothing is dropped
        server_version = "gpubox-metrics-relay"

        def _answer(self, status: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] != PATH:
                self._answer(404, b"only /metrics\n")
                return
            self._answer(*fetch(settings))

        def _refuse(self) -> None:
            self._answer(405, b"only GET /metrics\n")

        do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _refuse  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # one line per scrape would fill the journal

    return Relay


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: gpubox-metrics-relay SETTINGS.json", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        settings = json.load(f)
    server = HTTPServer(
        (settings["listen_address"], int(settings["listen_port"])), handler(settings)
    )
    print(
        f"gpubox-metrics-relay: {settings['upstream']} on port {settings['listen_port']}",
        flush=True,
    )
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
