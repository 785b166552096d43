"""Reach a box's API as it is deployed: bound to loopback on the box (``api_host`` 127.0.0.1,
the default), so from this machine only through an SSH local port forward over the
inventory's own connection; and its key, read from the box over that same connection.

``Tunnel`` listens on 127.0.0.1 (an ephemeral port) on this machine only, and carries each
connection made to it to the box's loopback API through a channel it opens (paramiko's
``direct-tcpip`` for a real box; any socket-like opener in the tests). Its threads are daemon
threads that stop when it is closed (or the command ends); nothing on the box is changed and
the API is never opened to the network.

``read_key`` reads the root-only key file (/etc/gpubox/api-key) with ``cat`` over the SSH
connection, through ``sudo -n`` when the inventory uses sudo: the key comes back on the
channel's stdout, never on a command line, and is never printed."""

from __future__ import annotations

import contextlib
import ipaddress
import select
import shlex
import socket
import threading
from collections.abc import Callable
from typing import Any

Opener = Callable[[tuple[str, int]], Any]  # the peer (address, port) -> a socket-like channel
CHUNK = 65536
POLL_S = 0.25


def is_loopback(address: str | None) -> bool:
    """Whether an api_host is reachable only on the box itself (127.0.0.0/8, ::1, localhost)."""
    if not address:
        return False
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


class Tunnel:
    """A local port forward: 127.0.0.1:``port`` on this machine to what ``opener`` opens.
    Use as a context manager; closed, it stops accepting and ends every forwarded pair."""

    def __init__(self, opener: Opener, bind: str = "127.0.0.1") -> None:
        if not is_loopback(bind):
            raise ValueError(f"a tunnel binds to loopback only, not {bind}")
        self._opener = opener
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.bind((bind, 0))
        self._server.listen(16)
        self._server.settimeout(POLL_S)
        self.host, self.port = self._server.getsockname()[:2]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._open: list[Any] = []
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []  # why a forwarded connection could not be opened
        accept = threading.Thread(target=self._accept, name="gpubox-tunnel", daemon=True)
        self._threads.append(accept)
        accept.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                local, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            try:
                remote = self._opener(peer)
            except Exception as exc:
                text = str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
                self.errors.append(text)
                local.close()
                continue
            if remote is None:
                self.errors.append("the box refused the forwarded connection")
                local.close()
                continue
            with self._lock:
                self._open += [local, remote]
            pump = threading.Thread(
                target=self._pump, args=(local, remote), name="gpubox-tunnel-up", daemon=True
            )
            with self._lock:
                self._threads.append(pump)
            pump.start()

    def _pump(self, local: socket.socket, remote: Any) -> None:
        """Carry one forwarded pair, a thread each way, until either end closes. The box's
        side is read with blocking ``recv`` and never asked for a file descriptor: paramiko
        makes a pipe for a channel's ``fileno()``, and its transport thread can write to
        that pipe just after the channel closed it; the EBADF that follows ends the whole
        SSH session ("Socket exception: Bad file descriptor (9)"), and every later request
        through the tunnel is reset (paramiko issues #1700 and #2271, open in 4.0)."""
        down = threading.Thread(
            target=self._carry_down, args=(local, remote), name="gpubox-tunnel-down", daemon=True
        )
        with self._lock:
            self._threads.append(down)
        down.start()
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([local], [], [], POLL_S)
                if not ready:
                    continue
                data = local.recv(CHUNK)
                if not data:
                    return
                remote.sendall(data)
        except (OSError, EOFError, ValueError):  # ValueError: the other thread closed local
            return
        finally:
            _end(local, remote)

    def _carry_down(self, local: socket.socket, remote: Any) -> None:
        """The box's answers to this machine; a closed channel (or shut socket) reads b""."""
        try:
            while not self._stop.is_set():
                data = remote.recv(CHUNK)
                if not data:
                    return
                local.sendall(data)
        except (OSError, EOFError):
            return
        finally:
            _end(local, remote)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            _end(*self._open)
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=2 * POLL_S + 1)

    def alive(self) -> int:
        """How many of its threads still run (0 once closed)."""
        return sum(t.is_alive() for t in self._threads)

    def __enter__(self) -> Tunnel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _end(*ends: Any) -> None:
    """Shut and close each end (a socket or a paramiko channel; done twice is harmless): the
    shutdown wakes a thread blocked in ``recv`` on a socket, the close one on a channel."""
    for end in ends:
        with contextlib.suppress(Exception):
            end.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            end.close()


def ssh_opener(client: Any, address: str, port: int, timeout: float = 10.0) -> Opener:
    """An opener of channels to address:port as seen from the box, over the SSH client's
    transport (what ``ssh -L`` does)."""

    import paramiko

    def opener(peer: tuple[str, int]) -> Any:
        try:
            return client.get_transport().open_channel(
                "direct-tcpip", (address, port), peer, timeout=timeout
            )
        except paramiko.ChannelException as exc:  # sshd could not connect, or may not
            raise ConnectionError(
                f"the box's sshd could not open {address}:{port} ({exc.text}): is the API "
                "running there, and does sshd allow TCP forwarding?"
            ) from None

    return opener


def api_address(api_host: str | None) -> str:
    """The address the API answers on, on the box (0.0.0.0 and :: listen on loopback too)."""
    host = str(api_host or "127.0.0.1")
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "localhost") else host


class ApiKeyError(Exception):
    """The API key could not be read from the box (the message says why, never the key)."""


def key_command(path: str, sudo: bool) -> str:
    """The command that prints the key file on the box (the path, never the key)."""
    return ("sudo -n " if sudo else "") + "cat -- " + shlex.quote(path)


def read_key(client: Any, path: str, sudo: bool, timeout: float = 30.0) -> str:
    """The API key in the box's file ``path``, read over the SSH client (the first non-empty
    line); raises ApiKeyError with why it could not be read."""
    command = key_command(path, sudo)
    try:
        _, stdout, stderr = client.exec_command(command, timeout=timeout)
        out = stdout.read().decode("utf-8", "replace")
        err = stderr.read().decode("utf-8", "replace")
        rc = stdout.channel.recv_exit_status()
    except Exception as exc:
        raise ApiKeyError(f"cannot read {path} on the box: {type(exc).__name__}: {exc}") from None
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if rc != 0 or not lines:
        said = next((ln.strip() for ln in err.splitlines() if ln.strip()), "")
        why = said or ("empty" if rc == 0 else f"exit status {rc}")
        hint = "" if sudo else " (root-only: connect as root, or set _sudo: True)"
        raise ApiKeyError(f"cannot read {path} on the box: {why}{hint}")
    return lines[0]
