"""Exit codes shared by every gpubox command, and whether a host can be reached at all.

Exit codes (across several hosts the code is the first that applies in the order of
``PRIORITY``):

    0  OK          everything fine
    1  DEVIATES    a host deviates from its config, or a deploy failed
    2  BAD_INPUT   bad input (an argument, the inventory); nothing was contacted
    3  UNREACHABLE a host could not be reached (DNS, refused, timeout, authentication)
    4  WAITING     a deliberate stop that waits for the owner (a Secure Boot key to enroll,
                   a reboot to consent to or to do: on a desktop in use, with
                   allow_reboot false, or on @local); the work before the stop is kept

``probe`` opens the inventory's own SSH connection to one host (paramiko, as testinfra and
pyinfra do) within a timeout and says in one line why it cannot, or None when it can. A
command that contacts hosts probes each first and judges nothing else about one it cannot
reach.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable
from typing import Any

OK, DEVIATES, BAD_INPUT, UNREACHABLE, WAITING = 0, 1, 2, 3, 4
PRIORITY = (BAD_INPUT, UNREACHABLE, DEVIATES, WAITING, OK)
DEFAULT_TIMEOUT_S = 10.0


def combine(codes: Iterable[int]) -> int:
    """The exit code for several hosts' codes: the first of PRIORITY that any has."""
    seen = set(codes)
    for code in PRIORITY:
        if code in seen:
            return code
    return OK


def endpoint(name: str, data: dict[str, Any]) -> tuple[str, int, str | None]:
    """(hostname, port, user) of the inventory host ``name``, after its ssh_config_file."""
    hostname = data.get("ssh_hostname") or name
    port = int(data.get("ssh_port") or 22)
    user = data.get("ssh_user")
    if data.get("ssh_config_file"):
        import paramiko

        entry = paramiko.SSHConfig.from_path(os.path.expanduser(data["ssh_config_file"])).lookup(
            hostname
        )
        hostname = entry.get("hostname", hostname)
        port = int(entry.get("port", port))
        user = user or entry.get("user")
    return str(hostname), port, user


def _proxy_command(name: str, data: dict[str, Any]) -> str | None:
    """The ProxyCommand of the host's ssh_config_file entry, if it has one."""
    if not data.get("ssh_config_file"):
        return None
    import paramiko

    found = paramiko.SSHConfig.from_path(os.path.expanduser(data["ssh_config_file"]))
    command = found.lookup(data.get("ssh_hostname") or name).get("proxycommand")
    return str(command) if command else None


def unreachable_line(name: str, why: str) -> str:
    """The one line a command prints for a host it cannot reach."""
    return f"{name}: unreachable: {why}"


def probe(name: str, data: dict[str, Any], timeout: float = DEFAULT_TIMEOUT_S) -> str | None:
    """Why the inventory host ``name`` cannot be reached over SSH (one line, without the
    host's name: 'DNS: ...', 'connection refused ...', 'timed out ...', 'authentication
    failed ...', 'SSH: ...'), or None when a session opens. Hosts with a ProxyCommand or
    pyinfra's @local/@docker connectors are not probed (None)."""
    if name.startswith("@"):
        return None
    try:
        hostname, port, user = endpoint(name, data)
    except (OSError, ValueError) as exc:
        return f"ssh_config_file: {exc}"
    if _proxy_command(name, data):
        return None
    sock, why = _open_socket(hostname, port, timeout)
    if sock is None:
        return why
    return _ssh_session(sock, hostname, port, user, data, timeout)


class Unreachable(Exception):
    """A host that cannot be reached; the message is the one-line reason (no host name)."""


def _host_keys(client: Any, data: dict[str, Any]) -> None:
    """Known host keys are checked; an unknown host is accepted unless
    ssh_strict_host_key_checking says yes (pyinfra's accept-new, without saving it)."""
    import paramiko

    strict = str(data.get("ssh_strict_host_key_checking", "")).lower()
    if strict in ("no", "off", "false"):
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        return
    with contextlib.suppress(OSError):
        client.load_system_host_keys()
    known = data.get("ssh_known_hosts_file")
    if known and os.path.exists(os.path.expanduser(known)):
        client.load_host_keys(os.path.expanduser(known))
    if strict in ("yes", "true", "on"):
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())


def _open_socket(hostname: str, port: int, timeout: float) -> tuple[socket.socket | None, str]:
    """A TCP connection to hostname:port, or None and why not (DNS, refused, timed out)."""
    try:
        infos = socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return None, f"DNS: {hostname} does not resolve ({exc.strerror or exc})"
    last = ""
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock, ""
        except TimeoutError:
            last = f"timed out after {timeout:g} s connecting to {hostname}:{port}"
        except ConnectionRefusedError:
            last = f"connection refused by {hostname}:{port} (is sshd running?)"
        except OSError as exc:
            last = f"{hostname}:{port}: {exc.strerror or exc}"
        sock.close()
    return None, last or f"{hostname}:{port}: no address"


def _ssh_session(
    sock: socket.socket,
    hostname: str,
    port: int,
    user: str | None,
    data: dict[str, Any],
    timeout: float,
    keep: bool = False,
) -> Any:
    """Open an SSH session over ``sock``: the reason it cannot be opened (str), None once it
    opened and closed again, or (``keep``) the open paramiko.SSHClient."""
    import getpass

    import paramiko

    client = paramiko.SSHClient()
    _host_keys(client, data)
    key = data.get("ssh_key")
    ok = False
    try:
        client.connect(
            hostname,
            port=port,
            username=user or getpass.getuser(),
            password=data.get("ssh_password"),
            key_filename=os.path.expanduser(key) if key else None,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            sock=sock,  # type: ignore[arg-type]
            allow_agent=True,
            look_for_keys=not key,
        )
        ok = True
    except paramiko.AuthenticationException as exc:
        return f"authentication failed for {user or getpass.getuser()}@{hostname}:{port} ({exc})"
    except (paramiko.SSHException, OSError, EOFError) as exc:
        transport = client.get_transport()
        if transport is not None and transport.is_active() and not transport.is_authenticated():
            # paramiko's last error after a refused key is its try at another key format
            who = f"{user or getpass.getuser()}@{hostname}:{port}"
            return f"authentication failed for {who} ({type(exc).__name__}: {exc})"
        text = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError) or "timed out" in text.lower():
            return f"timed out after {timeout:g} s in the SSH handshake with {hostname}:{port}"
        return f"SSH: {hostname}:{port}: {text}"
    finally:
        if not (ok and keep):
            client.close()
            sock.close()
    return client if keep else None


def connect(name: str, data: dict[str, Any], timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """An open paramiko.SSHClient to the inventory host ``name`` (its own ssh_* data); raises
    Unreachable with the one-line reason. Not for ProxyCommand hosts or @connectors."""
    if name.startswith("@"):
        raise Unreachable(f"{name} is a pyinfra connector, not an SSH host")
    try:
        hostname, port, user = endpoint(name, data)
    except (OSError, ValueError) as exc:
        raise Unreachable(f"ssh_config_file: {exc}") from None
    proxy = _proxy_command(name, data)
    if proxy:  # as ssh does: the session over the command's stdin and stdout
        import paramiko

        sock: Any = paramiko.ProxyCommand(proxy)
    else:
        sock, why = _open_socket(hostname, port, timeout)
        if sock is None:
            raise Unreachable(why)
    result = _ssh_session(sock, hostname, port, user, data, timeout, keep=True)
    if isinstance(result, str):
        raise Unreachable(result)
    return result


def probe_all(
    hosts: list[tuple[str, dict[str, Any]]], timeout: float = DEFAULT_TIMEOUT_S
) -> dict[str, str]:
    """The hosts that cannot be reached, with why; probed side by side, so that many
    unreachable hosts take one timeout, not one each."""
    from concurrent.futures import ThreadPoolExecutor

    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        found = list(pool.map(lambda h: probe(h[0], h[1], timeout), hosts))
    return {name: why for (name, _), why in zip(hosts, found, strict=True) if why is not None}


def say_unreachable(unreachable: dict[str, str], file: Any = None) -> None:
    """Print one line per unreachable host (stdout unless ``file``)."""
    for name, why in unreachable.items():
        print(unreachable_line(name, why), file=file, flush=True)
