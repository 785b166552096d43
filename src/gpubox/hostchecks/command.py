"""`gpubox verify INVENTORY [-m MARKER] [-k EXPR] [--limit NAME]`: the packaged host checks
through pytest (``--limit``: only the hosts it names, the others not contacted).

The inventory is validated first (a bad one exits 2, nothing contacted); every host is probed
at once (``gpubox.remote.reach.probe``, within the SSH timeout), and one that cannot be reached is
one line, ``NAME: unreachable: WHY``, and no check. The reachable hosts are then checked by
pytest (its output), one test per host and check.

Exit: 0 every check passed, 1 a host deviates, 2 bad input (nothing contacted, or a selection
that selects no check), 3 a host unreachable (before 1: the order of gpubox.remote.reach)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpubox.commands.deploying import probe_all
from gpubox.hostchecks import plugin
from gpubox.remote import inventory, reach

HERE = Path(__file__).resolve().parent


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpubox verify",
        description=(
            "Run every host check (gpubox checks lists them) on every host of the inventory, "
            "over SSH, through pytest. Exit: 0 all passed, 1 a host deviates, 2 bad input "
            "(nothing contacted), 3 a host unreachable."
        ),
    )
    p.add_argument("inventory", help="a pyinfra inventory file (inventories/example.py)")
    p.add_argument(
        "-m",
        dest="marker",
        metavar="MARKER",
        help="only the checks with this marker expression (quick, gpu, slow, burn)",
    )
    p.add_argument("-k", dest="expr", metavar="EXPR", help="only the checks matching EXPR")
    p.add_argument("--burn", action="store_true", help="also the checks that load the GPUs")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per check")
    p.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME",
        help="only these hosts (host names, comma separated or repeated; * and ? match), as "
        "pyinfra's --limit selects them by name; the others are not contacted",
    )
    inventory.add_data_arguments(p, "the hosts judged as a deploy given it converged them")
    return p


def pytest_argv(args: argparse.Namespace) -> list[str]:
    argv = [
        str(HERE / "run.py"),
        "-c",
        str(HERE / "pytest.ini"),
        "--rootdir",
        str(HERE),
        "-p",
        "no:cacheprovider",
        "-p",
        "gpubox.hostchecks.plugin",
        # gpubox imported the plugin (and testinfra) before pytest started: nothing to rewrite
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--inventory",
        args.inventory,
        "-v" if args.verbose else "-q",
    ]
    if args.marker:
        argv += ["-m", args.marker]
    if args.expr:
        argv += ["-k", args.expr]
    if args.burn:
        argv.append("--burn")
    argv += [f"--limit={limit}" for limit in args.limit]
    argv += [arg for pair in args.data for arg in ("--data", pair)]
    argv += [arg for path in args.group_data for arg in ("--group-data", path)]
    return argv


# pytest's exit status -> gpubox's: 1 tests failed, 4 usage error, 5 nothing selected.
PYTEST_CODES = {0: reach.OK, 1: reach.DEVIATES, 4: reach.BAD_INPUT, 5: reach.BAD_INPUT}


def main(
    argv: list[str],
    load_hosts: Callable[..., list[tuple[str, dict[str, Any]]] | None],
    report: Callable[..., int],
    probe: Callable[[str, dict[str, Any]], str | None] | None = None,
) -> int:
    args = parser().parse_args(argv)
    try:
        overrides = inventory.data_overrides(args.data)
    except ValueError as exc:
        print(f"gpubox verify: {exc}", file=sys.stderr)
        return reach.BAD_INPUT
    hosts = load_hosts("verify", args.inventory, overrides, args.group_data)
    if hosts is None:
        return reach.BAD_INPUT
    errors = report(hosts, overrides, warnings=False, origins=inventory.data_origins(args.data))
    if errors:
        with_data = "".join(f" --data {pair}" for pair in args.data)
        print(
            f"{errors} problem(s) in {args.inventory}{with_data}; no host was contacted",
            file=sys.stderr,
        )
        return reach.BAD_INPUT
    hosts, unmatched = plugin.limited(hosts, args.limit)
    if unmatched:
        print(f"gpubox verify: --limit {', '.join(unmatched)} names no host", file=sys.stderr)
        return reach.BAD_INPUT
    found = probe_all(hosts, probe)
    down = {name: why for name, why in found.items() if why is not None}
    for name, why in down.items():
        print(reach.unreachable_line(name, why), flush=True)
    if len(down) == len(hosts):
        return reach.UNREACHABLE
    plugin.PROBED.clear()
    plugin.PROBED.update(found)
    plugin.REPORTED.clear()
    plugin.REPORTED.update(down)
    try:
        rc = int(pytest.main(pytest_argv(args)))
    finally:
        plugin.PROBED.clear()
        plugin.REPORTED.clear()
    code = PYTEST_CODES.get(rc, reach.DEVIATES)
    return reach.combine([code, reach.UNREACHABLE if down else reach.OK])
