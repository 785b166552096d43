"""gpubox.remote.tunnel: the local port forward (bound to 127.0.0.1, an ephemeral port, stopping
when
closed) and the API key read over SSH (never on a command line); and `gpubox bench
--inventory` end to end through both, against an SSH server on loopback (paramiko's own
server side, running the commands it is sent for real) and the bench's synthetic API."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import paramiko
import pytest
from test_bench import KEY, MODEL, SyntheticServer, _gevent_patched

from gpubox import bench
from gpubox.remote import reach, tunnel


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(path))
    return path


class _Hello(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def api() -> Iterator[ThreadingHTTPServer]:
    """An HTTP server on loopback: the box's API as the tunnel's far end sees it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _socket_opener(address: tuple[str, int]) -> tunnel.Opener:
    """A plain TCP connection stands in for paramiko's direct-tcpip channel (same calls)."""
    return lambda peer: socket.create_connection(address, timeout=5)


def test_loopback_addresses() -> None:
    for address in ("127.0.0.1", "127.0.1.1", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert tunnel.is_loopback(address), address
    for address in ("0.0.0.0", "::", "192.0.2.10", "box.example", "", None):
        assert not tunnel.is_loopback(address), address
    assert tunnel.api_address("0.0.0.0") == "127.0.0.1"
    assert tunnel.api_address("10.0.0.5") == "10.0.0.5"


def test_the_tunnel_forwards_on_loopback_and_stops_when_closed(api: ThreadingHTTPServer) -> None:
    with tunnel.Tunnel(_socket_opener(api.server_address[:2])) as forward:
        assert forward.host == "127.0.0.1" and forward.port not in (0, api.server_address[1])
        for path in ("/v1/models", "/health"):  # a connection each, one after the other
            with urllib.request.urlopen(forward.url + path, timeout=5) as resp:
                assert resp.read() == f"hello {path}".encode()
        assert forward.errors == []
    assert forward.alive() == 0  # every thread ended
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", forward.port), 1):
        pass  # nothing listens any more


class _NoDescriptor:
    """A channel-like end that refuses ``fileno()``: paramiko answers it with a pipe that its
    transport thread may write to after the channel closed it (EBADF, the session ends)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.asked = 0

    def fileno(self) -> int:
        self.asked += 1
        raise AssertionError("the tunnel asked a channel for a file descriptor")

    def recv(self, size: int) -> bytes:
        return self._sock.recv(size)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def close(self) -> None:
        self._sock.close()


def test_the_tunnel_reads_the_boxs_side_without_its_file_descriptor(
    api: ThreadingHTTPServer,
) -> None:
    ends: list[_NoDescriptor] = []

    def opener(peer: tuple[str, int]) -> _NoDescriptor:
        ends.append(_NoDescriptor(socket.create_connection(api.server_address[:2], timeout=5)))
        return ends[-1]

    with tunnel.Tunnel(opener) as forward:
        for n in range(5):
            with urllib.request.urlopen(f"{forward.url}/{n}", timeout=5) as resp:
                assert resp.read() == f"hello /{n}".encode()
    assert len(ends) == 5 and [end.asked for end in ends] == [0] * 5
    assert forward.alive() == 0


def test_the_tunnel_never_binds_beyond_loopback() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        tunnel.Tunnel(lambda peer: None, bind="0.0.0.0")


def test_a_forward_the_box_refuses_closes_the_connection_and_says_why() -> None:
    class Refusing:  # a transport whose sshd cannot connect to the API
        def open_channel(self, *args: Any, **kwargs: Any) -> Any:
            raise paramiko.ChannelException(2, "Connect failed")

    class Client:
        def get_transport(self) -> Refusing:
            return Refusing()

    refuse = tunnel.ssh_opener(Client(), "127.0.0.1", 8080)

    with (
        tunnel.Tunnel(refuse) as forward,
        pytest.raises((urllib.error.URLError, ConnectionError, OSError)),
    ):
        urllib.request.urlopen(forward.url + "/v1/models", timeout=5)
    assert forward.errors == [
        "the box's sshd could not open 127.0.0.1:8080 (Connect failed): is the API running "
        "there, and does sshd allow TCP forwarding?"
    ]
    assert forward.alive() == 0


class _FakeStream:
    def __init__(self, data: bytes, rc: int = 0) -> None:
        self.data, self.channel = data, self
        self.rc = rc

    def read(self) -> bytes:
        return self.data

    def recv_exit_status(self) -> int:
        return self.rc


class _FakeClient:
    """Records the command; answers as cat would."""

    def __init__(self, out: bytes, err: bytes = b"", rc: int = 0) -> None:
        self.out, self.err, self.rc = out, err, rc
        self.commands: list[str] = []

    def exec_command(self, command: str, timeout: float) -> tuple[None, Any, Any]:
        self.commands.append(command)
        return None, _FakeStream(self.out, self.rc), _FakeStream(self.err, self.rc)


def test_the_key_is_read_with_cat_and_sudo_only_when_the_inventory_uses_it() -> None:
    client = _FakeClient(b"\n  s3cret-key  \n")
    assert tunnel.read_key(client, "/etc/gpubox/api-key", sudo=False) == "s3cret-key"
    assert tunnel.read_key(client, "/etc/gpubox/api key", sudo=True) == "s3cret-key"
    assert client.commands == [
        "cat -- /etc/gpubox/api-key",
        "sudo -n cat -- '/etc/gpubox/api key'",
    ]


def test_a_key_that_cannot_be_read_says_why_without_the_output() -> None:
    client = _FakeClient(b"", b"cat: /etc/gpubox/api-key: Permission denied\n", rc=1)
    with pytest.raises(tunnel.ApiKeyError) as raised:
        tunnel.read_key(client, "/etc/gpubox/api-key", sudo=False)
    assert str(raised.value) == (
        "cannot read /etc/gpubox/api-key on the box: cat: /etc/gpubox/api-key: Permission "
        "denied (root-only: connect as root, or set _sudo: True)"
    )
    client = _FakeClient(b"half-a-key", b"sudo: a password is required\n", rc=1)
    with pytest.raises(tunnel.ApiKeyError) as raised:
        tunnel.read_key(client, "/etc/gpubox/api-key", sudo=True)
    assert "half-a-key" not in str(raised.value)
    assert str(raised.value).endswith("sudo: a password is required")


# --------------------------------------------------------------------------- end to end


class _Box(paramiko.ServerInterface):
    """An SSH server's side (paramiko's), for one authorized key: runs the commands it is
    sent with sh -c, and opens direct-tcpip channels to loopback, as sshd would."""

    def __init__(self, authorized: paramiko.PKey) -> None:
        self.authorized = authorized
        self.commands: list[str] = []
        self.forwards: dict[int, socket.socket] = {}
        self.destinations: list[tuple[str, int]] = []

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = key.get_base64() == self.authorized.get_base64()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_direct_tcpip_request(
        self, chanid: int, origin: tuple[str, int], destination: tuple[str, int]
    ) -> int:
        try:  # sshd connects first, and refuses the channel when it cannot
            self.forwards[chanid] = socket.create_connection(destination, timeout=5)
        except OSError:
            return paramiko.OPEN_FAILED_CONNECT_FAILED
        self.destinations.append(destination)
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.commands.append(command.decode())

        def run() -> None:
            # paramiko sends the request's success reply after this method returns: a command
            # answered and closed before it (a quick cat on a busy machine) reads "Channel
            # closed." on the client. sshd replies first; so does this server, given a moment.
            time.sleep(0.2)
            proc = subprocess.run(["sh", "-c", command], capture_output=True, check=False)
            channel.sendall(proc.stdout)
            channel.sendall_stderr(proc.stderr)
            channel.send_exit_status(proc.returncode)
            channel.close()

        threading.Thread(target=run, daemon=True).start()
        return True


def _pump(channel: paramiko.Channel, sock: socket.socket) -> None:
    import select

    with sock:
        while True:
            ready, _, _ = select.select([channel, sock], [], [], 5)
            if not ready:
                break
            source = ready[0]
            data = source.recv(65536)
            if not data:
                break
            (sock if source is channel else channel).sendall(data)
    channel.close()


@pytest.fixture
def ssh_box(tmp_path: Path) -> Iterator[tuple[int, Path, _Box]]:
    """(port, client key file, the server) of an SSH server on 127.0.0.1. Its threads need a
    process pyinfra_cli has not patched with gevent: this file sorts before the first test
    that imports it (as test_bench.py does)."""
    if _gevent_patched():
        pytest.skip("this process was monkey-patched by pyinfra_cli (gevent)")
    host_key = paramiko.RSAKey.generate(2048)
    user_key = paramiko.RSAKey.generate(2048)
    key_file = tmp_path / "id_rsa"
    user_key.write_private_key_file(str(key_file))
    box = _Box(user_key)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    stop = threading.Event()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            transport.start_server(server=box)
            transports.append(transport)
            threading.Thread(target=accept, args=(transport,), daemon=True).start()

    def accept(transport: paramiko.Transport) -> None:
        while transport.is_active() and not stop.is_set():
            channel = transport.accept(0.2)
            if channel is not None and channel.get_id() in box.forwards:
                sock = box.forwards.pop(channel.get_id())
                threading.Thread(target=_pump, args=(channel, sock), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], key_file, box
    stop.set()
    listener.close()
    for transport in transports:
        transport.close()
    thread.join(5)


def _inventory(tmp_path: Path, ssh_port: int, key_file: Path, **extra: Any) -> Path:
    data = {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": ssh_port,
        "ssh_user": "tester",
        "ssh_key": str(key_file),
        "ssh_strict_host_key_checking": "no",
        "model_alias": MODEL,
        **extra,
    }
    inv = tmp_path / "inv.py"
    inv.write_text(f"hosts = [('box', {data!r})]\n")
    return inv


def test_bench_inventory_reaches_a_loopback_api_through_the_tunnel_with_the_boxs_key(
    ssh_box: tuple[int, Path, _Box],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port, key_file, box = ssh_box
    monkeypatch.delenv(bench.KEY_ENV, raising=False)
    key_path = tmp_path / "api-key"  # the box's root-only key file
    key_path.write_text(KEY + "\n")
    key_path.chmod(0o600)
    with SyntheticServer(ttft=0.005, interval=0.001) as api:
        api_port = api.server_address[1]
        inv = _inventory(tmp_path, port, key_file, api_port=api_port, api_key_file=str(key_path))
        argv = ["--inventory", str(inv), "--concurrency", "1", "--requests", "2"]
        rc = bench.main([*argv, "--max-tokens", "4", "--warmup", "0"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert box.commands == [f"cat -- {key_path}"]  # the key's path on a command line, not it
    assert set(box.destinations) == {("127.0.0.1", api_port)}  # the box's loopback API
    assert "box: the API at 127.0.0.1:" in err and "through an SSH tunnel from " in err
    assert KEY not in out + err
    record = bench.load_record("box")
    assert record is not None and record["url"] == f"http://127.0.0.1:{api_port}"
    assert record["levels"][0]["completed"] == 2


def test_bench_inventory_names_an_api_down_on_the_box_unreachable(
    ssh_box: tuple[int, Path, _Box],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port, key_file, box = ssh_box
    monkeypatch.setenv(bench.KEY_ENV, KEY)
    with socket.socket() as s:  # a loopback port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    inv = _inventory(tmp_path, port, key_file, api_port=closed)
    assert bench.main(["--inventory", str(inv), "--requests", "1", "--warmup", "0"]) == 3
    err = capsys.readouterr().err
    [line] = [ln for ln in err.splitlines() if "unreachable" in ln]
    assert line == (
        "box: unreachable: the API on the box, through the SSH tunnel: the box's sshd could "
        f"not open 127.0.0.1:{closed} (Connect failed): is the API running there, and does "
        "sshd allow TCP forwarding?"
    )
    assert box.commands == []  # the key came from GPUBOX_API_KEY: nothing read on the box


def test_bench_inventory_of_a_host_without_sshd_is_one_line_and_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    inv = _inventory(tmp_path, closed, tmp_path / "no-key")
    assert bench.main(["--inventory", str(inv), "--llama-bench"]) == 3
    out, err = capsys.readouterr()
    assert err == f"box: unreachable: connection refused by 127.0.0.1:{closed} (is sshd running?)\n"
    assert out == ""


def test_reach_connect_opens_the_inventorys_session(ssh_box: tuple[int, Path, _Box]) -> None:
    port, key_file, box = ssh_box
    data = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_user": "t"}
    client = reach.connect("box", {**data, "ssh_key": str(key_file)}, timeout=5)
    try:
        assert client.get_transport().is_authenticated()
    finally:
        client.close()
    other = paramiko.RSAKey.generate(2048)
    wrong = key_file.with_name("other")
    other.write_private_key_file(str(wrong))
    with pytest.raises(reach.Unreachable, match="^authentication failed for t@127.0.0.1"):
        reach.connect("box", {**data, "ssh_key": str(wrong)}, timeout=5)


RELAY = """import os, socket, sys, threading
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while data := os.read(0, 65536):
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := sock.recv(65536):
    os.write(1, data)
"""


def test_reach_connect_goes_through_the_ssh_configs_proxycommand(
    ssh_box: tuple[int, Path, _Box], tmp_path: Path
) -> None:
    import sys

    port, key_file, box = ssh_box
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host jumped\n  HostName 127.0.0.1\n  Port {port}\n"
        f"  ProxyCommand {sys.executable} {relay} %h %p\n"
    )
    data = {"ssh_config_file": str(config), "ssh_user": "t", "ssh_key": str(key_file)}
    assert reach.probe("jumped", data) is None  # not probed: the command is the way in
    client = reach.connect("jumped", data, timeout=5)
    try:
        _, stdout, _ = client.exec_command("echo through", timeout=10)
        assert stdout.read() == b"through\n"
    finally:
        client.close()


def test_many_short_connections_through_a_real_ssh_session_keep_it_open(
    ssh_box: tuple[int, Path, _Box], api: ThreadingHTTPServer
) -> None:
    """The bench's pattern over paramiko for real: connection after connection, each closed
    by the client; the session must outlive them all (it once ended with EBADF midway)."""
    port, key_file, box = ssh_box
    data = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_user": "t"}
    client = reach.connect("box", {**data, "ssh_key": str(key_file)}, timeout=5)
    address, api_port = api.server_address[:2]
    try:
        with tunnel.Tunnel(tunnel.ssh_opener(client, address, api_port)) as forward:
            for n in range(60):
                with urllib.request.urlopen(f"{forward.url}/{n}", timeout=10) as resp:
                    assert resp.read() == f"hello /{n}".encode()
            assert forward.errors == []
            assert client.get_transport().is_active()
        assert forward.alive() == 0
    finally:
        client.close()
