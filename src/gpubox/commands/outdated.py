"""`gpubox outdated INVENTORY [--json]`: for every host and every pin, what the box's own
repositories offer that is newer in the same line (gpubox.rules.outdated says the lines).

Each host is asked with the deploy's own repository query (gpubox.rules.offers.query_command:
apt in a private root under /var/cache/gpubox/apt-query/REPO, with just that repository, so
the host's sources, lists, pins, holds and packages stay as they are; only that private copy
of the repository's index is refreshed, as the deploy's preflight refreshes it), with the
installed versions from dpkg-query and the OS from /etc/os-release. Nothing else is run and
nothing is written; the deploy's kept answers (/var/lib/gpubox/apt-offers.json) are neither
read nor written.

``--data KEY=VALUE`` and ``--group-data`` are pyinfra's, read as ``gpubox deploy`` reads them
(gpubox.remote.inventory): ``--data driver_branch=580`` asks what a move to that branch would
install, before the move.

Exit status (gpubox.remote.reach's codes; across hosts the first of 2, 3, 1, 0): 0 when
nothing is behind, 1 when a pin is behind, its line no longer offered or its repository
unreadable, 2 for an unusable inventory (nothing contacted), 3 when a host cannot be reached
(one line: NAME: unreachable: WHY)."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import testinfra

from gpubox import parsers
from gpubox.checks.core import Output, Runner, Unreachable
from gpubox.checks.facts import DPKG_QUERY
from gpubox.config import ConfigError, HostConfig, load_host_config, target_for
from gpubox.knowledge import reads
from gpubox.remote import inventory, reach
from gpubox.rules import offers, outdated
from gpubox.rules.apt_sources import source_line
from gpubox.rules.outdated import Row

COLUMNS = ("HOST", "COMPONENT", "PACKAGE", "LINE", "INSTALLED", "NEWEST", "STATUS")


def read_host(name: str, config: HostConfig, run: Runner, today: datetime.date) -> list[Row]:
    """Every pin's row for one host, read through ``run`` (one command in, its Output out).
    A runner that raises on the first command (no connection) raises Unreachable."""
    try:
        release = run(reads.OS_RELEASE.command_for())
    except Exception as exc:  # the connection, lost after the probe
        raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
    try:
        return _read(name, config, run, release, today)
    except Exception as exc:  # the connection, lost mid-way: this host's pins are not known
        if not isinstance(exc, OSError | EOFError) and not type(exc).__module__.startswith(
            "paramiko"
        ):
            raise
        return [outdated.host_row(name, outdated.UNKNOWN, f"{type(exc).__name__}: {exc}")]


def _read(
    name: str, config: HostConfig, run: Runner, release: Output, today: datetime.date
) -> list[Row]:
    target = target_for(reads.OS_RELEASE.parse(release.stdout), config.catalog)
    if target is None:
        os_id = reads.OS_RELEASE.parse(release.stdout).get("PRETTY_NAME") or "unknown"
        return [outdated.host_row(name, outdated.UNKNOWN, f"not a supported OS: {os_id}")]
    dpkg = run(DPKG_QUERY)
    try:
        packages = parsers.parse_dpkg_query(dpkg.stdout)
    except parsers.ParseError as exc:
        return [outdated.host_row(name, outdated.UNKNOWN, f"dpkg-query: {exc}")]
    installed = {p.name: p.version for p in packages.values() if p.installed}
    indexes = {}
    for repo, names in outdated.asked(outdated.components(config, target)).items():
        answer = run(offers.query_command(repo, source_line(config, repo, target), names, ""))
        index = offers.parse_query(answer.stdout.splitlines())
        if answer.rc != 0 and index.error is None:
            index.error = f"the query exited {answer.rc}: {answer.stderr.strip()[-200:]}"
        indexes[repo] = index
    return outdated.rows(name, config, target, indexes, installed, today)


def exit_code(rows: Sequence[Row]) -> int:
    """reach's code for the rows: 3 a host unreachable, 1 a pin stale, else 0."""
    return reach.combine(
        reach.UNREACHABLE
        if row.status == outdated.UNREACHABLE
        else reach.DEVIATES
        if row.stale
        else reach.OK
        for row in rows
    )


def render_text(rows: Sequence[Row]) -> str:
    """One table, a row per host and pin, then each row's detail and note, then a summary."""
    table = [COLUMNS]
    below: list[str] = []
    for row in rows:
        if row.status == outdated.UNREACHABLE:
            below.append(reach.unreachable_line(row.host, row.detail))
            continue
        table.append(
            (
                row.host,
                row.component,
                row.package or "-",
                row.line or "-",
                row.installed or "-",
                row.newest or "-",
                row.status,
            )
        )
        what = " ".join(x for x in (row.host, row.component, row.package or "") if x)
        below += [f"  {what}: {text}" for text in (row.detail, row.note) if text]
    widths = [max(len(cells[i]) for cells in table) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()
        for cells in table
    ]
    hosts = len({row.host for row in rows})
    stale = sum(row.stale for row in rows)
    summary = (
        f"{hosts} host(s): nothing behind"
        if not stale
        else f"{hosts} host(s): {stale} pin(s) behind, no longer offered or not read"
    )
    return "\n".join(lines + below + [summary]) + "\n"


def render_json(rows: Sequence[Row]) -> str:
    """The rows as one JSON list (docs/tools.md gives the objects' shape)."""
    return json.dumps([row.as_json() for row in rows], indent=2) + "\n"


def _runner(host: Any) -> Runner:
    def run(command: str) -> Output:
        result = host.run(command)
        return Output(result.rc, result.stdout, result.stderr, command)

    return run


def main(argv: list[str], today: datetime.date | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpubox outdated",
        description="For every host and pin (the driver within its branch, CUDA's toolkit "
        "within its release, DCGM, the container toolkit, NCCL, Docker), list what the box's own "
        "repositories offer that is newer in the same line. Changes nothing on the box.",
        epilog="Exit: 0 nothing behind, 1 a pin behind (or its line no longer offered, or its "
        "repository unreadable), 2 bad input (nothing contacted), 3 a host unreachable.",
    )
    parser.add_argument("inventory")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON list: an object per host and pin (host, component, package, "
        "line, pinned, installed, newest, status, detail, note)",
    )
    inventory.add_data_arguments(parser, "e.g. --data driver_branch=580: what a move would get")
    args = parser.parse_args(argv)
    try:
        overrides = inventory.data_overrides(args.data)
    except ValueError as exc:
        print(f"gpubox outdated: {exc}", file=sys.stderr)
        return reach.BAD_INPUT
    try:
        hosts = inventory.load(args.inventory, overrides, args.group_data)
    except inventory.InventoryError as exc:
        print(f"gpubox outdated: cannot read {args.inventory}: {exc}", file=sys.stderr)
        return reach.BAD_INPUT
    if not hosts:
        print(f"gpubox outdated: {args.inventory} defines no hosts", file=sys.stderr)
        return reach.BAD_INPUT
    configs: dict[str, HostConfig] = {}
    for name, data in hosts:
        try:
            configs[name] = load_host_config(name, data)
        except ConfigError as exc:
            print(f"gpubox outdated: {exc}\n(gpubox check {args.inventory})", file=sys.stderr)
            return reach.BAD_INPUT
    today = today or datetime.datetime.now(datetime.UTC).date()
    unreachable = reach.probe_all(hosts)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpubox-outdated-") as tmp:
        ssh_config = Path(tmp) / "ssh_config"
        ssh_config.write_text("".join(inventory.ssh_config_entry(n, d) for n, d in hosts))
        for name, data in hosts:
            if name not in unreachable:
                host = testinfra.get_host(
                    f"paramiko://{name}", ssh_config=str(ssh_config), sudo=inventory.uses_sudo(data)
                )
                try:
                    rows += read_host(name, configs[name], _runner(host), today)
                    continue
                except Unreachable as exc:  # reached by the probe, lost since
                    unreachable[name] = str(exc)
            rows.append(outdated.host_row(name, outdated.UNREACHABLE, unreachable[name]))
    if args.json:
        print(render_json(rows), end="")
        reach.say_unreachable(unreachable, file=sys.stderr)
    else:
        print(render_text(rows), end="")
    return exit_code(rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
