"""Alertmanager's answer to ``GET /api/v2/alerts`` (API v2: prometheus/alertmanager
api/v2/openapi.yaml, ``gettableAlerts``; the fixtures are Debian 12's Alertmanager 0.25's own
answers): the alerts firing now, by the box their ``host`` label names."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpubox.parsers._common import ParseError, _quote


@dataclass(frozen=True)
class Alert:
    name: str  # its alertname label
    severity: str  # its severity label ("" without one)
    host: str  # its host label ("" without one)
    state: str  # status.state: active, suppressed (silenced or inhibited), unprocessed
    starts_at: str
    summary: str  # its summary annotation ("" without one)


def parse_alerts(text: str) -> list[Alert]:
    """Every alert of the answer, in its order. Not a JSON list of alerts: ParseError."""
    try:
        found = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"not Alertmanager's JSON: {_quote(text.strip())}") from exc
    if not isinstance(found, list):
        raise ParseError(f"not a list of alerts: {_quote(text.strip())}")
    alerts = []
    for item in found:
        labels = item.get("labels") if isinstance(item, dict) else None
        if not isinstance(labels, dict) or "alertname" not in labels:
            raise ParseError(f"an alert without labels or alertname: {_quote(json.dumps(item))}")
        status = item.get("status") or {}
        alerts.append(
            Alert(
                name=str(labels["alertname"]),
                severity=str(labels.get("severity", "")),
                host=str(labels.get("host", "")),
                state=str(status.get("state", "")) if isinstance(status, dict) else "",
                starts_at=str(item.get("startsAt", "")),
                summary=str((item.get("annotations") or {}).get("summary", "")),
            )
        )
    return alerts


def firing_by_host(alerts: list[Alert]) -> dict[str, list[Alert]]:
    """The active alerts (not silenced, not inhibited) by their host label, each box's sorted
    by name; alerts without a host label are left out."""
    by_host: dict[str, list[Alert]] = {}
    for alert in alerts:
        if alert.state == "active" and alert.host:
            by_host.setdefault(alert.host, []).append(alert)
    return {host: sorted(found, key=lambda a: a.name) for host, found in by_host.items()}
