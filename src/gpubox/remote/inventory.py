"""Read a pyinfra inventory file without connecting to anything, and turn a host's
connection data into what testinfra needs (the host checks use the same inventory)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any


class InventoryError(Exception):
    """An inventory file that cannot be read. The message says what went wrong in one line
    (the exception the file raised, and its line; a directory; no such file), and for a file
    that defines no hosts adds an example of the format; callers name the file:
    ``cannot read {exc.path}: {exc}``."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(message)


# What `gpubox check` shows for a file that defines no hosts.
FORMAT_EXAMPLE = """\
an inventory is a Python file whose lists name the hosts, each a name and its data, e.g.:
    hosts = [
        ("mybox", {"ssh_hostname": "192.0.2.10", "ssh_user": "root",
                   "gpu_model": "Tesla V100-SXM2-32GB", "gpu_count": 2}),
    ]
(inventories/example.py in gpubox's source is one; docs/keys.md lists the keys)"""


def load(
    path: str, override_data: dict[str, Any] | None = None, group_data: Sequence[str] = ()
) -> list[tuple[str, dict[str, Any]]]:
    """(host name, merged host data) for every host of a pyinfra inventory file, merged by
    pyinfra itself: ``override_data`` (pyinfra's ``--data``, from ``data_overrides``) over the
    host's data, over its groups' (the inventory's, ``group_data/`` and ``group_data``'s
    directories: pyinfra's ``--group-data``). Raises InventoryError when the path is no file
    (missing, a directory), when the file raises when run, or when it defines no hosts."""
    inventory = _make(path, override_data, group_data)
    try:
        hosts = [(host.name, host.data.dict()) for host in inventory]
    except (Exception, SystemExit) as exc:
        raise InventoryError(path, _describe(exc, path)) from None
    if not hosts:
        raise InventoryError(path, f"it defines no hosts; {FORMAT_EXAMPLE}")
    return hosts


def group_members(path: str, group: str, group_data: Sequence[str] = ()) -> list[str] | None:
    """The names of the hosts in the inventory's group ``group`` (a list of that name in the
    file), in the inventory's order (pyinfra's); None when the inventory has no such group.
    Raises InventoryError as ``load`` does."""
    from pyinfra.api.exceptions import NoGroupError

    inventory = _make(path, None, group_data)
    try:
        return [host.name for host in inventory.get_group(group)]
    except NoGroupError:
        return None


def _make(path: str, override_data: dict[str, Any] | None, group_data: Sequence[str]) -> Any:
    """pyinfra's own Inventory of the file (see ``load``); raises InventoryError."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    _check_path(path)
    # pyinfra executes inventory files inside a state context; this state connects nothing.
    try:
        with ctx_state.use(State(Inventory(([], {})), Config())):
            return make_inventory(
                path,
                cwd=os.getcwd(),
                override_data=dict(override_data or {}),
                group_data_directories=list(group_data) or None,
            )
    except (Exception, SystemExit) as exc:
        raise InventoryError(path, _describe(exc, path)) from None


def data_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """pyinfra's ``--data KEY=VALUE`` options as the host data pyinfra makes of them
    (pyinfra_cli/cli.py, ``_set_override_data``): each split at its first ``=``, a later KEY
    winning, and each value read by pyinfra's own parser, ``parse_cli_arg`` (true and false
    any case: a bool; an integer: an int; else JSON when it parses, "4.5" a float, '"570"' a
    string, '[1, 2]' a list; else the text as written). Raises ValueError naming a pair with
    no ``=`` (pyinfra would stop on it with a traceback)."""
    from pyinfra_cli.util import parse_cli_arg  # pyinfra's CLI: only a command that takes --data

    raw: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--data {pair}: not KEY=VALUE")
        key, value = pair.split("=", 1)
        raw[key] = value
    return {key: parse_cli_arg(value) for key, value in raw.items()}


def add_data_arguments(p: argparse.ArgumentParser, then: str) -> None:
    """pyinfra's --data and --group-data on a command of gpubox that reads the inventory as
    pyinfra will (``load``'s ``override_data`` and ``group_data``)."""
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"pyinfra's --data: a host data value over every host's own ({then})",
    )
    p.add_argument(
        "--group-data",
        action="append",
        default=[],
        metavar="PATH",
        help=f"pyinfra's --group-data: more group data files or directories ({then})",
    )


def data_origins(pairs: Sequence[str]) -> dict[str, str]:
    """KEY -> the ``--data KEY=VALUE`` that set it (the last one for a KEY given twice), for
    a problem's line to say where its value came from."""
    return {pair.split("=", 1)[0]: f"--data {pair}" for pair in pairs if "=" in pair}


def _check_path(path: str) -> None:
    """InventoryError unless ``path`` is a file: a directory names the inventory files in it."""
    where = Path(path)
    if where.is_dir():
        inside = sorted(
            str(where / f.name)
            for f in where.iterdir()
            if f.suffix == ".py" and f.is_file() and not f.name.startswith("_")
        )
        hint = (
            f": name one of its inventory files, e.g. {', '.join(inside[:5])}"
            if inside
            else " with no inventory file (a .py file) in it"
        )
        raise InventoryError(path, f"is a directory, not an inventory file{hint}")
    if not where.exists():
        raise InventoryError(path, "no such file")
    if not where.is_file():
        raise InventoryError(path, "not a regular file")


def _describe(exc: BaseException, path: str) -> str:
    """'RuntimeError: boom (line 3)' for an exception an inventory file raised. pyinfra wraps
    the file's own exception in a click exception whose str() fails: unwrap it first."""
    inner = getattr(exc, "exception", None)
    if isinstance(inner, BaseException):
        exc = inner
    try:
        text = str(exc)
    except Exception:
        text = ""
    text = " ".join(text.split())  # one line
    where = ""
    if not isinstance(exc, SyntaxError):  # its text already says where
        lineno = _line_in(exc, path)
        if lineno is not None:
            where = f" (line {lineno})"
    name = type(exc).__name__
    return f"{name}: {text}{where}" if text else f"{name}{where}"


def _line_in(exc: BaseException, path: str) -> int | None:
    """The line of ``path`` the exception was raised from (its deepest frame in the file)."""
    tb = getattr(exc, "_traceback", None) or exc.__traceback__  # pyinfra keeps it there
    target = os.path.realpath(path)
    lineno = None
    while tb is not None:
        if os.path.realpath(tb.tb_frame.f_code.co_filename) == target:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    return lineno


def ssh_config_entry(name: str, data: dict[str, Any]) -> str:
    """An ssh_config block for testinfra's paramiko backend (--ssh-config)."""
    hostname, proxy = data.get("ssh_hostname") or name, None
    if data.get("ssh_config_file"):  # pyinfra's key: an ssh_config (HostName, ProxyCommand)
        import paramiko

        found = paramiko.SSHConfig.from_path(os.path.expanduser(data["ssh_config_file"]))
        entry = found.lookup(hostname)
        proxy = entry.get("proxycommand")
        hostname = entry.get("hostname", hostname)
    lines = [f"Host {name}", f"  HostName {hostname}"]
    if proxy:
        lines.append(f"  ProxyCommand {proxy}")
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


def plans_json(path: str, host_plan: Callable[[str, dict[str, Any]], Any]) -> str:
    """Every host's plan (``host_plan(name, data)``, a dataclass) as JSON, for a child process
    to print (see ``plans_in_child``); exits with the one-line reason when the inventory
    cannot be read."""
    try:
        hosts = load(path)
    except InventoryError as exc:
        sys.exit(str(exc))
    return json.dumps([asdict(host_plan(name, data)) for name, data in hosts])


def plans_in_child(module: str, path: str) -> list[dict[str, Any]]:
    """What ``module.plans_json(path)`` prints, run in a child Python process: pyinfra's CLI
    patches threads with gevent, and the command asking (a bench that measures the served
    API) must not run under it. Raises InventoryError with the child's last error line."""
    code = (
        "import sys\nfrom importlib import import_module\n"
        f"print(import_module({module!r}).plans_json(sys.argv[1]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise InventoryError(path, lines[-1] if lines else "unknown error")
    plans: list[dict[str, Any]] = json.loads(proc.stdout)
    return plans
