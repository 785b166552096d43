"""gpubox.reach: the exit codes every command shares, and the one-line reason a host cannot
be reached."""

from __future__ import annotations

import socket

from gpubox import reach


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
