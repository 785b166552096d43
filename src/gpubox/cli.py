"""Layer 11, entry points: the gpubox command."""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from gpubox import config
from gpubox.config.keys import KEYS
from gpubox.remote import inventory, reach
from gpubox.rules import driver_lifecycle

# What a command needs beyond this module, imported only when that command runs (_lazy):
# `gpubox --help`, `check` and `keys` need none of it, and together these take about 220 ms
# to import (pytest, testinfra, the checks, the bench, doctor), more than `gpubox --help`
# takes in all (about 120 ms, measured 2026-12-02). Each module but gpubox.checks has a
# main(argv) that parses the command's own arguments.
LAZY = {
    "deploy": "gpubox.commands.deploying",
    "verify": "gpubox.hostchecks.command",
    "sandbox": "gpubox.sandbox.cli",
    "bench": "gpubox.bench",
    "doctor": "gpubox.doctor",
    "nvlink": "gpubox.commands.nvlink",
    "outdated": "gpubox.commands.outdated",
    "checks": "gpubox.checks",
}


def _lazy(command: str) -> ModuleType:
    """The module of LAZY that ``command`` needs, imported now."""
    return importlib.import_module(LAZY[command])  # lazy: only the command that runs (LAZY)


def _load_hosts(
    command: str,
    path: str,
    overrides: dict[str, Any] | None = None,
    group_data: Sequence[str] = (),
) -> list[tuple[str, dict[str, Any]]] | None:
    """The inventory's hosts, their data merged by pyinfra as a pyinfra run given
    ``--data`` (``overrides``) and ``--group-data`` merges them; or None once a one-line
    reason is printed (exit status 2)."""
    try:
        hosts = inventory.load(path, overrides, group_data)
    except inventory.InventoryError as exc:
        print(f"gpubox {command}: cannot read {path}: {exc}", file=sys.stderr)
        return None
    if not hosts:
        print(f"gpubox {command}: {path} defines no hosts", file=sys.stderr)
        return None
    return hosts


def _report(
    hosts: list[tuple[str, dict[str, Any]]],
    overrides: dict[str, Any],
    warnings: bool = True,
    origins: dict[str, str] | None = None,
) -> int:
    """Print every host's problems (with ``overrides`` applied); return the error count."""
    counts = _report_by_host(hosts, overrides, warnings, origins)
    return sum(errors for errors, _ in counts.values())


def _report_by_host(
    hosts: list[tuple[str, dict[str, Any]]],
    overrides: dict[str, Any],
    warnings: bool = True,
    origins: dict[str, str] | None = None,
) -> dict[str, tuple[int, int]]:
    """Print every host's problems; return (errors, warnings) per host. ``overrides`` are
    over every host's data, as pyinfra's ``--data`` is; a problem with a key of theirs says
    where the value came from: ``origins[key]``, by default ``--data KEY=VALUE``."""
    counts = {}
    found = {name: config.validate(name, {**data, **overrides}) for name, data in hosts}
    configs = {name: c for name, (c, _) in found.items() if c is not None}
    # the rules that need every host (gpubox.config.monitoring_rules), once each host is valid
    fleet = config.fleet_problems(configs) if len(configs) == len(found) else []
    for name in found:
        problems = found[name][1] + [p for p in fleet if p.host == name]
        errors = warned = 0
        for problem in problems:
            if problem.severity == "error" or warnings:
                came = _origin(problem.key, overrides, origins or {})
                print(f"{problem.severity}: {problem}" + (f" (from {came})" if came else ""))
            errors += problem.severity == "error"
            warned += problem.severity != "error"
        counts[name] = (errors, warned)
    return counts


def _origin(key: str, overrides: dict[str, Any], origins: dict[str, str]) -> str | None:
    if key not in overrides:
        return None
    return origins.get(key) or f"--data {key}={overrides[key]!r}"


def _with_data(command: str, args: argparse.Namespace) -> tuple[Any, Any] | None:
    """(hosts, overrides) of ``args``'s inventory with its --data and --group-data, or None
    once a one-line reason is printed (a --data without "=", an inventory not read)."""
    try:
        overrides = inventory.data_overrides(args.data)
    except ValueError as exc:
        print(f"gpubox {command}: {exc}", file=sys.stderr)
        return None
    hosts = _load_hosts(command, args.inventory, overrides, args.group_data)
    return None if hosts is None else (hosts, overrides)


def cmd_check(args: argparse.Namespace) -> int:
    loaded = _with_data("check", args)
    if loaded is None:
        return 2
    hosts, overrides = loaded
    counts = _report_by_host(hosts, overrides, origins=inventory.data_origins(args.data))
    notes = _lifecycle_notes(hosts, datetime.date.today())
    width = max(len(name) for name in counts)
    for name, (errors, warned) in counts.items():
        verdict = "valid" if not errors else f"{errors} error(s)"
        print(
            f"{name:<{width}}  {verdict}"
            + (f", {warned} warning(s)" if warned else "")
            + (", 1 note" if name in notes else "")
        )
    errors = sum(e for e, _ in counts.values())
    with_data = "".join(f" --data {pair}" for pair in args.data)
    if errors:
        bad = sum(1 for e, _ in counts.values() if e)
        print(
            f"{errors} problem(s) on {bad} of {len(hosts)} host(s) in {args.inventory}"
            f"{with_data}; no host was contacted",
            file=sys.stderr,
        )
        return 2
    print(f"{args.inventory}{with_data}: {len(hosts)} host(s) valid")
    return 0


def _lifecycle_notes(hosts: list[tuple[str, dict[str, Any]]], today: datetime.date) -> set[str]:
    """Print each valid host's driver lifecycle note (a note, never an error: the exit status
    does not change); return the hosts that got one."""
    noted = set()
    for name, data in hosts:
        host_config, _ = config.validate(name, data)
        found = None if host_config is None else driver_lifecycle.host_note(host_config, today)
        if found is not None:
            print(f"note: {name}: {found.text}")
            noted.add(name)
    return noted


def cmd_burnin(args: argparse.Namespace) -> int:
    """Run the burn-in deploy against the inventory (pyinfra, as a user would type it); the
    deploy file ships inside the package, so an installed gpubox has it too."""
    # The inventory is read and checked here first, so a broken one is one line, not a
    # pyinfra traceback, and a wrong key (or --seconds) stops before any host is contacted.
    hosts = _load_hosts("burnin", args.inventory)
    if hosts is None:
        return 2
    overrides = {} if args.seconds is None else {"burnin_seconds": args.seconds}
    origins = {"burnin_seconds": f"--seconds {args.seconds}"}
    errors = _report(hosts, overrides, warnings=False, origins=origins)
    if errors:
        print(f"{errors} problem(s) in {args.inventory}; no host was contacted", file=sys.stderr)
        return 2
    unreachable = reach.probe_all(hosts)  # one line each; the rest are burned in
    reach.say_unreachable(unreachable)
    if len(unreachable) == len(hosts):
        return reach.UNREACHABLE
    deploy_file = Path(__file__).resolve().parent / "deploy" / "burnin.py"
    pyinfra = Path(sys.executable).parent / "pyinfra"
    argv = [str(pyinfra), "-y", args.inventory, str(deploy_file)]
    if args.seconds is not None:
        argv[2:2] = ["--data", f"burnin_seconds={args.seconds}"]
    if not unreachable:
        os.execv(argv[0], argv)
    argv[2:2] = [arg for name in unreachable for arg in ("--exclude", name)]
    rc = subprocess.run(argv, check=False).returncode
    return reach.combine([reach.UNREACHABLE, reach.OK if rc == 0 else reach.DEVIATES])


def cmd_checks(args: argparse.Namespace) -> int:
    """List every check: id, marker, who runs it, title, the facts it reads (and with what)."""
    checks = _lazy("checks")
    rows = [
        (
            c.id,
            c.marker or "none",
            "host checks"
            if c.active
            else "host checks, doctor"
            + ("" if c.marker != "quick" or c.area == "burnin" else ", deploy"),
            c.title,
            ", ".join(f"{n} ({checks.FACTS[n].reads_with})" for n in c.reads),
        )
        for c in checks.ALL
    ]
    if args.markdown:
        print("| check | marker | run by | what it proves | reads (parser) |")
        print("|---|---|---|---|---|")
        for row in rows:
            print("| " + " | ".join(f"`{row[0]}`" if i == 0 else row[i] for i in range(5)) + " |")
        return 0
    for row in rows:
        print(f"{row[0]:<28} {row[1]:<6} {row[3]}")
    return 0


def _type_text(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def python_literal(value: Any) -> str:
    """``value`` as an inventory (a Python file) writes it: True, not true; strings in double
    quotes, as JSON writes them (and Python reads them)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    return repr(value)


def _default_text(key: Any, quote: str = "`") -> str:
    if key.default is None:
        return "derived" if key.derive is not None else "none"
    return f"{quote}{python_literal(key.default)}{quote}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def cmd_keys(args: argparse.Namespace) -> int:
    """Every inventory key: name, type, default, what it means (and what it accepts)."""
    if args.python:
        print(config.fields_source(), end="")
        return 0
    if args.markdown:
        print("| key | type | default | meaning |")
        print("|---|---|---|---|")
    for key in KEYS:
        accepts = ""
        if key.choices:
            tick = "`" if args.markdown else ""
            accepts = "; one of " + ", ".join(
                f"{tick}{python_literal(c)}{tick}" for c in key.choices
            )
        elif key.min is not None or key.max is not None:
            accepts = f"; {key.range_text()}"
        if args.markdown:
            cells = [f"`{key.name}`", _type_text(key.type), _default_text(key), key.doc + accepts]
            print("| " + " | ".join(_cell(c) for c in cells) + " |")
        else:
            default = _default_text(key, quote="")
            print(f"{key.name:<29} {_type_text(key.type):<11} {default:<24} {key.doc}{accepts}")
    return 0


def version() -> str:
    try:
        return metadata.version("gpubox")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: run pip install .)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    if command in ("deploy", "verify"):  # the inventory read and reported as `check` does
        return int(_lazy(command).main(argv[1:], _load_hosts, _report))
    if command in ("sandbox", "bench", "doctor", "nvlink", "outdated"):
        return int(_lazy(command).main(argv[1:]))
    parser = argparse.ArgumentParser(
        prog="gpubox",
        description="Converge and verify an NVIDIA GPU inference box: deploy it, check it, "
        "measure it. An inventory is a Python file of hosts and their keys (gpubox keys); "
        'a key is written as Python reads it, e.g. "allow_desktop_reboot": True.',
        epilog="Exit codes: 0 fine, 1 a host deviates or a deploy failed, 2 bad input "
        "(nothing contacted), 3 a host unreachable, 4 a deploy stopped for the owner (earlier "
        "work kept; enroll the Secure Boot key or reboot, then run it again).",
    )
    parser.add_argument("--version", action="version", version=f"gpubox {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("deploy", help="validate the inventory, then converge its hosts (pyinfra)")
    sub.add_parser("verify", help="run every host check on the inventory's hosts (pytest)")
    check = sub.add_parser("check", help="validate an inventory offline (no host is contacted)")
    check.add_argument("inventory")
    inventory.add_data_arguments(check, "seen as gpubox deploy sees it")
    check.set_defaults(func=cmd_check)
    listing = sub.add_parser("checks", help="list every check on a box (id, marker, title)")
    listing.add_argument("--markdown", action="store_true", help="as a Markdown table")
    listing.set_defaults(func=cmd_checks)
    keys = sub.add_parser("keys", help="list every inventory key (type, default, meaning)")
    keys.add_argument("--markdown", action="store_true", help="as a Markdown table")
    keys.add_argument(
        "--python", action="store_true", help="as src/gpubox/config/fields.py (typed attributes)"
    )
    keys.set_defaults(func=cmd_keys)
    burnin = sub.add_parser("burnin", help="burn in every host's GPUs (gpu-burn, dcgmi diag)")
    burnin.add_argument("inventory")
    burnin.add_argument("--seconds", type=int, help="override burnin_seconds")
    burnin.set_defaults(func=cmd_burnin)
    sub.add_parser("sandbox", help="the local sandbox box: up|down|status|ssh|exec")
    sub.add_parser("bench", help="measure a served model (TTFT, TPOT, ITL, tok/s)")
    sub.add_parser("doctor", help="the whole box on one screen, and every deviation (read-only)")
    sub.add_parser("nvlink", help="watch NVLink traffic per GPU (dcgmi dmon, labelled)")
    sub.add_parser(
        "outdated", help="what the box's repositories offer newer in each pin's line (read-only)"
    )
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `gpubox keys | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
