"""Exit codes shared by every gpubox command, and whether a host can be reached at all.

Exit codes (across several hosts the code is the first that applies in the order of
``PRIORITY``):

    0  OK          everything fine
    1  DEVIATES    a host deviates from its config, or a deploy failed
    2  BAD_INPUT   bad input (an argument, the inventory); nothing was contacted
    3  UNREACHABLE a host could not be reached (DNS, refused, timeout, authentication)
    4  WAITING     a deliberate stop that waits for the owner (a Secure Boot key to enroll,
                   a reboot to consent to)

``probe`` opens the inventory's own SSH connection to one host (paramiko, as testinfra and
pyinfra do) within a timeout and says in one line why it cannot, or None when it can. A
command that contacts hosts probes each first and judges nothing else about one it cannot
reach.
"""

from __future__ import annotations

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
    if data.get("ssh_config_file"):
        import paramiko

        found = paramiko.SSHConfig.from_path(os.path.expanduser(data["ssh_config_file"]))
        if found.lookup(data.get("ssh_hostname") or name).get("proxycommand"):
            return None
    try:
        infos = socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"DNS: {hostname} does not resolve ({exc.strerror or exc})"
    sock = None
    last = ""
    for family, kind, proto, _, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(timeout)
            sock.connect(address)
            break
        except TimeoutError:
            last = f"timed out after {timeout:g} s connecting to {hostname}:{port}"
        except ConnectionRefusedError:
            last = f"connection refused by {hostname}:{port} (is sshd running?)"
        except OSError as exc:
            last = f"{hostname}:{port}: {exc.strerror or exc}"
        if sock is not None:
            sock.close()
            sock = None
    if sock is None:
        return last or f"{hostname}:{port}: no address"
    return _ssh_session(sock, hostname, port, user, data, timeout)


def _ssh_session(
    sock: socket.socket,
    hostname: str,
    port: int,
    user: str | None,
    data: dict[str, Any],
    timeout: float,
) -> str | None:
    import getpass

    import paramiko

    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    key = data.get("ssh_key")
    try:
        client.connect(
            hostname,
            port=port,
            username=user or getpass.getuser(),
            key_filename=os.path.expanduser(key) if key else None,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            sock=sock,  # type: ignore[arg-type]
            allow_agent=True,
            look_for_keys=not key,
        )
    except paramiko.AuthenticationException as exc:
        return f"authentication failed for {user or getpass.getuser()}@{hostname}:{port} ({exc})"
    except (paramiko.SSHException, OSError, EOFError) as exc:
        text = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError) or "timed out" in text.lower():
            return f"timed out after {timeout:g} s in the SSH handshake with {hostname}:{port}"
        return f"SSH: {hostname}:{port}: {text}"
    finally:
        client.close()
        sock.close()
    return None
