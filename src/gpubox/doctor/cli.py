"""`gpubox doctor INVENTORY [--json]`: read each host (read-only), judge it with the checks that
do not act on the box, and print its screen or one JSON document.

Exit status (gpubox.remote.reach's codes; across hosts the first of 2, 3, 1, 0): 0 when no host
deviates, 1 when one does, 2 when the inventory is unusable (nothing contacted), 3 when a host
cannot be reached: one line for it, NAME: unreachable: WHY, and nothing else judged."""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpubox import bench, checks
from gpubox.checks.core import FACTS, Unreachable
from gpubox.config import ConfigError, HostConfig, load_host_config
from gpubox.doctor import alerts
from gpubox.doctor.render import (
    fleet_row,
    format_alerts,
    host_report,
    render_fleet,
    render_json,
    render_text,
)
from gpubox.doctor.view import describe
from gpubox.remote import inventory, reach


def doctor_checks() -> list[checks.Check]:
    """The checks doctor runs: every check that reads nothing active."""
    return checks.select(passive=True)


# The API requests doctor sends (each may wait minutes for a long answer), and curl's exit
# status when /health got no answer within its 5 s: a server that hangs (frozen, deadlocked:
# what BackendHung reports) would hold each request for its whole limit, minutes in all, so
# they are not sent and their checks say why.
API_REQUESTS = (
    "api_unauthorized",
    "api_models",
    "api_chat",
    "sane_short",
    "sane_long",
    "api_props",
    "api_metrics",
)
CURL_TIMEOUT = 28
NOT_SENT = "not sent: the API's /health gave no answer within 5 s (the server hangs)"


def gather(run: checks.Runner, config: HostConfig) -> checks.Facts:
    """Read every passive fact of the host once (failures are outputs, never crashes). A
    runner that raises on the first command (no connection) raises Unreachable. The API's
    requests go last, and not at all when /health timed out (``API_REQUESTS``)."""
    first = True

    def guarded(command: str) -> checks.Output:
        nonlocal first
        if first:
            first = False
            try:
                return run(command)
            except Exception as exc:
                raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
        return run(command)

    facts = checks.Facts(guarded, config)
    facts.read(n for n, fact in FACTS.items() if not fact.active and n not in API_REQUESTS)
    health = facts.get("health")
    if health is not None and health.rc == CURL_TIMEOUT:
        for name in API_REQUESTS:
            facts.not_read(name, NOT_SENT)
    facts.read(API_REQUESTS)
    return facts


def evaluate(
    host: str, config: HostConfig, facts: Any, inventory: str = "INVENTORY"
) -> list[checks.Verdict]:
    """Every doctor check's verdict on the host (pure, given the facts)."""
    return checks.run(doctor_checks(), host, config, facts, inventory)


def _runner(host: Any) -> checks.Runner:
    def run(command: str) -> checks.Output:
        result = host.run(command)
        return checks.Output(result.rc, result.stdout, result.stderr, command)

    return run


def main(argv: list[str]) -> int:
    import testinfra  # not gpubox's: testinfra and paramiko load only when doctor runs

    parser = argparse.ArgumentParser(
        prog="gpubox doctor",
        description="Show each host of the inventory on one screen, and every deviation from "
        "its configuration with the command that fixes it. Read-only.",
    )
    parser.add_argument("inventory")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    inventory.add_data_arguments(parser, "each host judged as a deploy given it converged it")
    args = parser.parse_args(argv)
    try:
        overrides = inventory.data_overrides(args.data)
    except ValueError as exc:
        print(f"gpubox doctor: {exc}", file=sys.stderr)
        return reach.BAD_INPUT
    try:
        hosts = inventory.load(args.inventory, overrides, args.group_data)
    except Exception as exc:  # a broken inventory file is the user's to see, whole
        print(f"gpubox doctor: cannot read {args.inventory}: {exc}", file=sys.stderr)
        return reach.BAD_INPUT
    if not hosts:
        print(f"gpubox doctor: {args.inventory} defines no hosts", file=sys.stderr)
        return reach.BAD_INPUT
    configs: dict[str, HostConfig] = {}
    for name, data in hosts:
        try:
            configs[name] = load_host_config(name, data)
        except ConfigError as exc:
            print(f"gpubox doctor: {exc}\n(gpubox check {args.inventory})", file=sys.stderr)
            return reach.BAD_INPUT
    unreachable = reach.probe_all(hosts)
    reports: list[dict[str, Any]] = []
    screens: list[str] = []
    rows: list[dict[str, Any]] = []
    now = datetime.datetime.now(datetime.UTC)
    with tempfile.TemporaryDirectory(prefix="gpubox-doctor-") as tmp:
        ssh_config = Path(tmp) / "ssh_config"
        ssh_config.write_text("".join(inventory.ssh_config_entry(n, d) for n, d in hosts))

        def connect(name: str, data: dict[str, Any]) -> Any:
            return testinfra.get_host(
                f"paramiko://{name}", ssh_config=str(ssh_config), sudo=inventory.uses_sudo(data)
            )

        fleet = _fleet_alerts(hosts, configs, unreachable, connect)
        for name, data in hosts:
            config = configs[name]
            if name in unreachable:
                _unreachable(name, config, unreachable[name], reports, screens, rows, fleet)
                continue
            host = connect(name, data)
            try:
                facts = gather(_runner(host), config)
            except Unreachable as exc:  # reached by the probe, lost since
                unreachable[name] = str(exc)
                _unreachable(name, config, str(exc), reports, screens, rows, fleet)
                continue
            url = bench.host_url(name, data.get("ssh_hostname"), config.api_port)
            view = describe(config, facts, now, last_bench=bench.load_record(name, url))
            if fleet is not None:
                view["alerts"] = alerts.view_for(fleet, name)
            verdicts = evaluate(name, config, facts, args.inventory)
            reports.append(host_report(name, view, verdicts))
            screens.append(render_text(name, view, verdicts))
            rows.append(fleet_row(name, config, view, verdicts))
    if args.json:
        print(render_json(reports, rows), end="")
        reach.say_unreachable(unreachable, file=sys.stderr)  # "unreachable" in the JSON too
    else:
        print(render_fleet(rows))
        print("\n".join(screens), end="")
    return reach.combine(
        reach.UNREACHABLE
        if report["host"] in unreachable
        else (reach.OK if report["ok"] else reach.DEVIATES)
        for report in reports
    )


def _fleet_alerts(
    hosts: list[tuple[str, dict[str, Any]]],
    configs: dict[str, HostConfig],
    unreachable: dict[str, str],
    connect: Any,
) -> alerts.FleetAlerts | None:
    """The alerts firing, by box, from the inventory's monitor (read once); None without a
    monitor."""
    monitor = alerts.monitor_of(hosts)
    if monitor is None:
        return None
    if monitor in unreachable:
        return alerts.unreachable(monitor, unreachable[monitor])
    data = dict(hosts)[monitor]
    return alerts.read(_runner(connect(monitor, data)), monitor, configs[monitor])


def _unreachable(
    name: str,
    config: HostConfig,
    why: str,
    reports: list[dict[str, Any]],
    screens: list[str],
    rows: list[dict[str, Any]],
    fleet: alerts.FleetAlerts | None = None,
) -> None:
    """A host that cannot be reached: one line (NAME: unreachable: WHY), no verdict; then
    the alerts firing for it, when the fleet has a monitor (BoxDown, most likely)."""
    report: dict[str, Any] = {
        "host": name,
        "ok": False,
        "unreachable": why,
        "findings": [],
        "checks": {},
    }
    screen = reach.unreachable_line(name, why) + "\n"
    if fleet is not None:
        report["alerts"] = alerts.view_for(fleet, name)
        screen += f"Alerts    {format_alerts(report['alerts'])}\n"
    reports.append(report)
    screens.append(screen)
    rows.append(fleet_row(name, config, None, []))
