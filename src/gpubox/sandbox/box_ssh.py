"""SSH to a sandbox box: its sshd's settings, the key and ssh_config ``box.up`` writes in the
state directory, the command lines that enter the box's network namespace, and waiting until
the box answers.

sshd listens on 127.0.0.1 at the box's port *inside* its network namespace, so pyinfra and
pytest reach it by running inside that namespace (``gpubox sandbox exec --``); from any other
namespace, ssh goes through the box's own with a ProxyCommand (the ``NAME.fleet`` alias)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpubox.sandbox.common import SandboxError
from gpubox.sandbox.identity import (
    BASE_SSH_PORT,
    SSH_HOST,
    SSH_USER,
    Box,
    current,
    netns_argv,
)
from gpubox.sandbox.processes import box_info

READY_TIMEOUT_S = 120.0
SSHD_DROPIN_PATH = "etc/ssh/sshd_config.d/10-sandbox.conf"


def sshd_dropin(port: int = BASE_SSH_PORT) -> str:
    return f"""\
# gpubox sandbox: sshd of the local stand-in box (never shipped to a real box).
# Debian's sshd_config includes sshd_config.d/*.conf first, so these settings win.
ListenAddress {SSH_HOST}
Port {port}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""


SSHD_DROPIN = sshd_dropin()


def ensure_key(sdir: Path) -> Path:
    key = sdir / "id_ed25519"
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpubox-sandbox", "-f", str(key)],
            check=True,
        )
    return key


def write_ssh_config(sdir: Path, key: Path, box: Box) -> Path:
    path = sdir / "ssh_config"
    settings = (
        f"    HostName {SSH_HOST}\n"
        f"    Port {box.ssh_port}\n"
        f"    User {SSH_USER}\n"
        f"    IdentityFile {key}\n"
        "    IdentitiesOnly yes\n"
        "    StrictHostKeyChecking no\n"
        "    UserKnownHostsFile /dev/null\n"
        "    LogLevel ERROR\n"
    )
    path.write_text(
        "# gpubox sandbox: reach the box from inside its network namespace\n"
        "# (gpubox sandbox exec -- ssh -F THIS gpubox-sandbox; testinfra --ssh-config=THIS)\n"
        f"Host {box.name}\n{settings}\n"
        "# from any network namespace, through the box's own\n"
        f"Host {box.name}.fleet\n{settings}"
        f"    ProxyCommand {' '.join(proxy_command(box.number))}\n"
    )
    return path


def proxy_command(k: int | None = None) -> list[str]:
    """An ssh ProxyCommand that reaches box ``k``'s sshd through its network namespace (the
    current box's by default)."""
    box = current() if k is None else Box.of(k)
    return ["ip", "netns", "exec", box.name, "socat", "STDIO", f"TCP:{SSH_HOST}:{box.ssh_port}"]


def ssh_argv(info: dict[str, Any], command: Sequence[str] = (), tty: bool = False) -> list[str]:
    """An ssh command line into the box of ``info`` (to run on the host: it enters the
    box's namespace)."""
    options = ["-F", info["ssh_config"], "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    options.append("-t" if tty else "-T")
    alias = info.get("ssh_host_alias", current().name)
    argv = ["ssh", *options, alias, *(["--", *command] if command else [])]
    return netns_argv(argv, info.get("netns"))


def ssh(
    command: str | Sequence[str],
    check: bool = True,
    timeout: float | None = 300,
    info: dict[str, Any] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command in the box over SSH; returns stdout/stderr as text."""
    info = info or box_info()
    argv = ssh_argv(info, [command] if isinstance(command, str) else command)
    # input= or stdin=, never both (gevent's subprocess refuses stdin=None beside input=)
    feed: dict[str, Any] = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **feed)
    if check and result.returncode != 0:
        raise SandboxError(
            f"in the box: {command!r} exited {result.returncode}:\n{result.stderr}{result.stdout}"
        )
    return result


def wait_ready(
    timeout: float = READY_TIMEOUT_S,
    info: dict[str, Any] | None = None,
    since_boot_id: str | None = None,
) -> str:
    """Wait until the box answers over SSH and systemd has finished booting.

    Returns the system state ("running" or "degraded"). With ``since_boot_id``, first waits
    for a boot with a different boot id (after a reboot).
    """
    info = info or box_info()
    deadline = time.monotonic() + timeout
    last = ""
    script = "cat /proc/sys/kernel/random/boot_id; systemctl is-system-running --wait"
    while time.monotonic() < deadline:
        try:
            result = ssh(
                script, check=False, timeout=max(5.0, deadline - time.monotonic()), info=info
            )
        except subprocess.TimeoutExpired:
            break
        lines = result.stdout.split()
        if result.returncode != 255 and len(lines) >= 2 and lines[0] != since_boot_id:
            state = lines[-1]
            if state in ("running", "degraded"):
                return state
            last = state
        else:
            last = (result.stderr.strip().splitlines() or [""])[-1]
        time.sleep(0.2)
    log = Path(info["state_dir"]) / "logs" / "nspawn.log"
    tail = (
        "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        if log.exists()
        else ""
    )
    raise SandboxError(
        f"the box did not become ready in {timeout:.0f} s (last: {last!r});"
        f" console log {log}:\n{tail}"
    )


def failed_units(info: dict[str, Any] | None = None) -> str:
    return ssh("systemctl --failed --no-pager", check=False, info=info).stdout
