"""Read a pyinfra inventory file without connecting to anything, and turn a host's
connection data into what testinfra needs (the host checks use the same inventory)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def load(path: str) -> list[tuple[str, dict[str, Any]]]:
    """(host name, merged host data) for every host of a pyinfra inventory file."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    if not Path(path).is_file():
        raise FileNotFoundError(f"no inventory file {path}")
    # pyinfra executes inventory files inside a state context; this state connects nothing.
    with ctx_state.use(State(Inventory(([], {})), Config())):
        inventory = make_inventory(path, cwd=os.getcwd())
    return [(host.name, host.data.dict()) for host in inventory]


def ssh_config_entry(name: str, data: dict[str, Any]) -> str:
    """An ssh_config block for testinfra's paramiko backend (--ssh-config)."""
    lines = [f"Host {name}", f"  HostName {data.get('ssh_hostname') or name}"]
    if data.get("ssh_port"):
        lines.append(f"  Port {data['ssh_port']}")
    if data.get("ssh_user"):
        lines.append(f"  User {data['ssh_user']}")
    if data.get("ssh_key"):
        lines.append(f"  IdentityFile {os.path.expanduser(data['ssh_key'])}")
    if str(data.get("ssh_strict_host_key_checking", "")).lower() in ("no", "off", "false"):
        lines.append("  StrictHostKeyChecking no")
        lines.append("  UserKnownHostsFile /dev/null")
    elif data.get("ssh_known_hosts_file"):
        lines.append(f"  UserKnownHostsFile {os.path.expanduser(data['ssh_known_hosts_file'])}")
    return "\n".join(lines) + "\n"


def uses_sudo(data: dict[str, Any]) -> bool:
    return bool(data.get("_sudo")) and data.get("ssh_user") not in (None, "root")
