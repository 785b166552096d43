"""gpubox.remote.reach: the exit codes every command shares, and the one-line reason a host cannot
be reached."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpubox.remote import reach

ROOT = Path(__file__).resolve().parents[2]


def test_several_hosts_exit_with_the_first_code_that_applies() -> None:
    assert reach.combine([]) == reach.OK
    assert reach.combine([reach.OK, reach.WAITING]) == reach.WAITING
    assert reach.combine([reach.WAITING, reach.DEVIATES, reach.OK]) == reach.DEVIATES
    assert reach.combine([reach.DEVIATES, reach.UNREACHABLE]) == reach.UNREACHABLE
    assert reach.combine([reach.UNREACHABLE, reach.BAD_INPUT]) == reach.BAD_INPUT


def test_a_name_that_does_not_resolve_is_a_dns_line() -> None:
    why = reach.probe("box", {"ssh_hostname": "gpubox-no-such-host.invalid"}, timeout=5)
    assert why is not None and why.startswith("DNS: gpubox-no-such-host.invalid")
    assert reach.unreachable_line("box", why).startswith("box: unreachable: DNS: ")


def test_a_closed_port_is_refused() -> None:
    with socket.socket() as s:  # a loopback port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    why = reach.probe("box", {"ssh_hostname": "127.0.0.1", "ssh_port": port}, timeout=5)
    assert why == f"connection refused by 127.0.0.1:{port} (is sshd running?)"


def test_a_port_that_speaks_no_ssh_is_an_ssh_line() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]

        import threading

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

        t = threading.Thread(target=answer, daemon=True)
        t.start()
        why = reach.probe("box", {"ssh_hostname": "127.0.0.1", "ssh_port": port}, timeout=5)
        t.join(5)
    assert why is not None and why.startswith(f"SSH: 127.0.0.1:{port}: ")


def test_pyinfra_connectors_are_not_probed() -> None:
    assert reach.probe("@local", {}) is None


def test_many_hosts_are_probed_side_by_side_and_said_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hosts = [
        ("a", {"ssh_hostname": "gpubox-no-such-host.invalid"}),
        ("b", {"ssh_hostname": "127.0.0.1", "ssh_port": port}),
        ("@local", {}),
    ]
    found = reach.probe_all(hosts, timeout=5)
    assert list(found) == ["a", "b"]
    reach.say_unreachable(found)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("a: unreachable: DNS: ")
    assert out[1] == f"b: unreachable: connection refused by 127.0.0.1:{port} (is sshd running?)"
    assert reach.probe_all([]) == {}


EXAMPLE = str(ROOT / "inventories" / "example.py")  # 192.0.2.10: a documentation address


@pytest.mark.parametrize(
    "command",
    [
        ["gpubox.doctor", EXAMPLE],
        ["gpubox.doctor", EXAMPLE, "--json"],
        ["gpubox.commands.nvlink", EXAMPLE],
        ["gpubox.bench", "--inventory", EXAMPLE],
        ["gpubox.bench", "--inventory", EXAMPLE, "--llama-bench"],
        ["gpubox.bench", "--inventory", EXAMPLE, "--split-modes", "layer,row"],
        ["gpubox.cli", "burnin", EXAMPLE],
    ],
    ids=lambda c: " ".join(c[:1] + c[2:]),
)
def test_an_unreachable_host_is_one_line_and_exit_3(command: list[str]) -> None:
    """The commands a user runs first, against the example inventory (its host cannot be
    reached from anywhere): one line naming the host, no traceback, exit 3, within 60 s."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", *command],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        cwd=ROOT,
    )
    took = time.monotonic() - start
    output = proc.stdout + proc.stderr
    assert proc.returncode == reach.UNREACHABLE, output
    assert took < 60, took
    assert "Traceback" not in output
    lines = [ln for ln in output.splitlines() if "unreachable" in ln and ": " in ln]
    assert [ln for ln in lines if ln.startswith("v100box: unreachable: ")], output
    assert not [ln for ln in output.splitlines() if "->" in ln or "error:" in ln], output
