"""doctor's alerts line: the alerts firing for each box, read once per run from the fleet's
monitor (the host with monitoring "prometheus") over SSH: curl on the monitor asks its
Alertmanager (``GET /api/v2/alerts``, the active ones: not silenced, not inhibited), and
gpubox.parsers.alertmanager groups them by their ``host`` label. No monitor in the inventory:
no line. An Alertmanager that does not answer, or a monitor that cannot be reached: one line
saying so on each box, never a crash."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from gpubox import parsers
from gpubox.checks import Runner
from gpubox.config import HostConfig

QUERY = "/api/v2/alerts?active=true&silenced=false&inhibited=false&unprocessed=false"


@dataclass
class FleetAlerts:
    """What the monitor's Alertmanager said: the firing alerts by host, or why not known."""

    monitor: str
    by_host: dict[str, list[parsers.Alert]] = field(default_factory=dict)
    error: str | None = None


def monitor_of(hosts: list[tuple[str, dict[str, Any]]]) -> str | None:
    """The inventory's monitor: its first host with monitoring "prometheus"."""
    # the raw data: doctor reads the inventory offline ("none", the key's default, when unset)
    return next((n for n, d in hosts if str(d.get("monitoring") or "none") == "prometheus"), None)


def address_of(config: HostConfig) -> tuple[str, int]:
    """Where Alertmanager listens on the monitor, as curl there reaches it (a wildcard
    address: loopback)."""
    address, port = config.alertmanager_address, config.alertmanager_port
    if address in ("0.0.0.0", "::", "[::]"):
        address = "127.0.0.1"
    return address, port


def alerts_command(address: str, port: int) -> str:
    """curl on the monitor: the firing alerts, or its error on standard error."""
    host = f"[{address.strip('[]')}]" if ":" in address.strip("[]") else address
    return f"curl -sS --fail --max-time 10 {shlex.quote(f'http://{host}:{port}{QUERY}')}"


def read(run: Runner, monitor: str, config: HostConfig) -> FleetAlerts:
    """Ask the monitor's Alertmanager once, through ``run`` (the monitor's SSH)."""
    address, port = address_of(config)
    where = f"Alertmanager on {monitor} ({address}:{port})"
    try:
        out = run(alerts_command(address, port))
    except Exception as exc:  # noqa: BLE001 - the connection: one line, never a crash
        return FleetAlerts(monitor, error=f"{where} not asked: {type(exc).__name__}: {exc}")
    if out.rc != 0:
        why = out.first_error_line() or f"exit status {out.rc}"
        return FleetAlerts(monitor, error=f"{where} does not answer: {why}")
    try:
        alerts = parsers.parse_alerts(out.stdout)
    except parsers.ParseError as exc:
        return FleetAlerts(monitor, error=f"{where} answered something else: {exc}")
    return FleetAlerts(monitor, by_host=parsers.firing_by_host(alerts))


def unreachable(monitor: str, why: str) -> FleetAlerts:
    return FleetAlerts(monitor, error=f"the monitor {monitor} cannot be reached: {why}")


def view_for(fleet: FleetAlerts, host: str) -> dict[str, Any]:
    """A box's alerts for its view (JSON-able): each firing alert, or why none is known."""
    if fleet.error is not None:
        return {"monitor": fleet.monitor, "firing": None, "error": fleet.error}
    firing = [
        {"alert": a.name, "severity": a.severity, "since": a.starts_at, "summary": a.summary}
        for a in fleet.by_host.get(host, [])
    ]
    return {"monitor": fleet.monitor, "firing": firing, "error": None}
