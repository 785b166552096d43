"""The sandbox's stand-in dcgm-exporter (sandbox/packages/dcgm-exporter), run here as its image
runs it: the product's exporter_label.py beside it, the recorded metrics, a host engine that
listens on loopback (or none). Its labels are the pinned rule's, and the product's check reads
them as it reads the real exporter's."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubox.checks import dcgm as dcgm_checks
from gpubox.checks.core import Output, Reading, Recorded
from gpubox.config import load_host_config
from gpubox.knowledge import exporter_label
from gpubox.sandbox import repo_debs

HERE = repo_debs.PACKAGES_DIR / "dcgm-exporter"
LIB = Path(exporter_label.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def engine() -> Iterator[int]:
    """A listener on loopback in the stand-in nv-hostengine's place (it speaks no protocol)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        yield int(s.getsockname()[1])


@contextlib.contextmanager
def exporter(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    environ = {
        "PATH": "/usr/bin:/bin",
        "GPUBOX_EXPORTER_LIB": str(LIB),
        "GPUBOX_EXPORTER_METRICS": str(HERE / "metrics.prom"),
        **(env or {}),
    }
    argv = [sys.executable, str(HERE / "dcgm-exporter"), *args]
    proc = subprocess.Popen(argv, env=environ, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def stderr(proc: subprocess.Popen[str]) -> str:
    return proc.stderr.read() if proc.stderr else ""


def metrics(port: int, proc: subprocess.Popen[str]) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    for _ in range(100):
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.read().decode()
        except OSError:
            assert proc.poll() is None, stderr(proc)
            time.sleep(0.05)
    raise AssertionError(f"{url} never answered")


@pytest.mark.parametrize(
    ("engine_host", "label"), [("localhost", "localhost"), ("127.0.0.1", "127.0.0.1")]
)
def test_the_label_is_the_host_part_of_the_engines_address(engine_host: str, label: str):
    listen = free_port()
    with engine() as port, exporter(
        "--address", f"127.0.0.1:{listen}", "--remote-hostengine-info", f"{engine_host}:{port}",
        env={"NODE_NAME": "ignored-in-remote-mode"},
    ) as proc:  # fmt: skip
        text = metrics(listen, proc)
    labels = exporter_label.hostname_labels(text)
    assert len(labels) == 6 and set(labels) == {label}
    assert 'modelName="Tesla V100-SXM2-32GB"' in text
    # the product's checks read it as they read the real exporter's
    config = load_host_config("box", {"dcgm_exporter": True})
    assert dcgm_checks.exporter(config, reading(text, "box")) == []
    problem = dcgm_checks.exporter_hostname(config, reading(text, "box"))
    assert problem is not None and f'Hostname="{label}"' in problem
    assert dcgm_checks.exporter_hostname(config, reading(text, label)) is None


def test_without_an_engine_it_exits_naming_the_address():
    with exporter("--address", f"127.0.0.1:{free_port()}", "-r", f"127.0.0.1:{free_port()}") as p:
        assert p.wait(timeout=20) == 1
        assert "error connecting to nv-hostengine at 127.0.0.1:" in stderr(p)


def test_an_unknown_flag_is_refused_as_the_real_cli_refuses_it():
    with exporter("--bogus", "1") as proc:
        assert proc.wait(timeout=20) == 1
        assert "flag provided but not defined: -bogus" in stderr(proc)


def reading(metrics_text: str, hostname: str) -> Reading:
    outputs = {
        "exporter_metrics": Output(0, metrics_text, "", "curl"),
        "hostname": Output(0, hostname + "\n", "", "hostname"),
    }
    config = load_host_config("box", {"dcgm_exporter": True})
    return Reading(config, Recorded(outputs, None))
