"""`gpubox sandbox up --download-rate`: the servers the sandbox runs itself (the Hub and PyPI
mirror, the stand-in repositories and URL server) cap their response bodies at the rate they
inherit in their environment, and the Hub records it among the box's facts."""

from __future__ import annotations

import io
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import serving

from gpubox.sandbox import hub, serve


def test_the_rate_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(serve.RATE_ENV, raising=False)
    assert serve.download_rate() is None
    monkeypatch.setenv(serve.RATE_ENV, "200000")
    assert serve.download_rate() == 200000
    monkeypatch.setenv(serve.RATE_ENV, "5")
    assert serve.download_rate() == serve.MIN_RATE
    monkeypatch.setenv(serve.RATE_ENV, "fast")
    assert serve.download_rate() is None


def test_paced_copy_and_write_hold_the_rate():
    data = b"x" * 150_000
    out = io.BytesIO()
    began = time.monotonic()
    assert serve.paced_copy(io.BytesIO(data), out.write, 300_000) == len(data)
    assert time.monotonic() - began >= 0.45 and out.getvalue() == data
    out = io.BytesIO()
    began = time.monotonic()
    serve.paced_write(out.write, data, 300_000)
    assert time.monotonic() - began >= 0.45 and out.getvalue() == data
    began = time.monotonic()
    serve.paced_write(io.BytesIO().write, data, None)
    assert time.monotonic() - began < 0.2


def test_the_hub_serves_at_the_sandbox_rate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"G" * 200_000)
    repo = hub.make_repo("gpubox/tiny-GGUF", {"tiny.gguf": model})
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv(serve.RATE_ENV, "400000")
    with serving(hub.handler_class({repo.repo_id: repo}, None, None, log)) as port:
        began = time.monotonic()
        url = f"http://127.0.0.1:{port}/gpubox/tiny-GGUF/resolve/{repo.commit}/tiny.gguf"
        with urllib.request.urlopen(url, timeout=30) as answer:
            assert len(answer.read()) == 200_000
        took = time.monotonic() - began
    assert took >= 0.3, took  # unthrottled: a few ms (the last chunk's pause follows it)
    (entry,) = [e for e in hub.read_log(log) if e["method"] == "GET"]
    assert entry["bytes"] == 200_000 and entry["rate"] == 400_000
