"""Checks of the monitoring stage (deploy/monitoring.py fixes them; docs/monitoring.md), on the
monitor (the host with monitoring "prometheus"): its node exporter answers with gpubox's
metrics, Prometheus and Alertmanager run, every target of the fleet is up, and the rules are
loaded. The other boxes' exporters are judged by the targets check: a host's own config does
not say whether another host monitors it."""

from __future__ import annotations

import json
from typing import Any

import yaml

from gpubox.base import layout
from gpubox.base.rendering import FILES
from gpubox.checks.core import Check, Fact, Finding, Reading, fact
from gpubox.config import HostConfig
from gpubox.knowledge import reads
from gpubox.knowledge.reads import section
from gpubox.parsers import parse_sections, parse_unit_states
from gpubox.plans.monitoring import bracket, local

UNITS = (layout.NODE_EXPORTER, layout.PROMETHEUS, layout.ALERTMANAGER)


def _url(address: str, port: int, path: str) -> str:
    return f"http://{bracket(local(address))}:{port}{path}"


def _curl(url: str) -> str:
    """The answer, and a line end: Prometheus's JSON has none, and the next section's marker
    must start a line of its own."""
    return f"curl -fsS --max-time 10 '{url}'; echo"


def _monitor(config: HostConfig, target: Any) -> str | None:
    if config.monitoring != "prometheus":
        return None
    prometheus = (config.prometheus_address, config.prometheus_port)
    return "; ".join(
        [
            section("units"),
            reads.UNIT_STATES.command_for(*UNITS),
            section("node"),
            # gpubox's lines only: the node exporter's whole page is a few hundred kB
            "curl -fsS --max-time 10 "
            f"'{_url(config.node_exporter_address, config.node_exporter_port, '/metrics')}'"
            " | grep '^gpubox_'",
            section("targets"),
            _curl(_url(*prometheus, "/api/v1/targets?state=active")),
            section("rules"),
            _curl(_url(*prometheus, "/api/v1/rules?type=alert")),
            "true",
        ]
    )


def _json(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return None


def parse_monitor(text: str) -> dict[str, Any]:
    """The units' states, gpubox's lines of the node exporter's /metrics, Prometheus's targets
    and alerting rules (its API's JSON; None when it did not answer)."""
    sections = parse_sections(text)
    return {
        "units": parse_unit_states(sections.get("units", "")),
        "node": sections.get("node", ""),
        "targets": _json(sections.get("targets", "")),
        "rules": _json(sections.get("rules", "")),
    }


fact(Fact("monitor", _monitor, parse_monitor))


def is_monitor(c: HostConfig) -> str | None:
    return None if c.monitoring == "prometheus" else "monitoring is not 'prometheus' here"


def _unit_up(r: Reading, unit: str) -> str | None:
    props = r.get("monitor")["units"].get(unit, {})
    active, state = props.get("ActiveState", "unknown"), props.get("UnitFileState", "unknown")
    if active == "active" and state == "enabled":
        return None
    return f"{unit} is {active} and {state or 'not installed'}"


def node_exporter(c: HostConfig, r: Reading) -> Finding | None:
    down = _unit_up(r, layout.NODE_EXPORTER)
    if down:
        return Finding(down, f"journalctl -u {layout.NODE_EXPORTER} -n 20; {{deploy}}")
    if "gpubox_gpus_expected" not in r.get("monitor")["node"]:
        address = f"{c.node_exporter_address}:{c.node_exporter_port}"
        return Finding(
            f"the node exporter on {address} does not answer with gpubox_gpus_expected "
            f"({layout.TEXTFILE_CONFIG})",
            f"ls -l {layout.TEXTFILE_DIR}; {{deploy}}",
        )
    return None


def services(c: HostConfig, r: Reading) -> list[Finding]:
    return [
        Finding(down, f"journalctl -u {unit} -n 20; {{deploy}}")
        for unit in (layout.PROMETHEUS, layout.ALERTMANAGER)
        if (down := _unit_up(r, unit))
    ]


def targets_up(c: HostConfig, r: Reading) -> list[str]:
    """Every target Prometheus scrapes answers (health "up"), each named by box and job."""
    answer = r.get("monitor")["targets"]
    if not isinstance(answer, dict) or answer.get("status") != "success":
        return [f"Prometheus on {c.prometheus_address}:{c.prometheus_port} did not answer"]
    active = answer["data"].get("activeTargets", [])
    if not active:
        return ["Prometheus has no target"]
    return [
        f"{t['labels'].get('host', '?')} {t['labels'].get('job', '?')} ({t.get('scrapeUrl')}) "
        f"is {t.get('health')}: {t.get('lastError') or 'not scraped yet'}"
        for t in active
        if t.get("health") != "up"
    ]


def shipped_rules() -> set[str]:
    """The alerting rules of the shipped rules file (files/monitoring/alerts.yml)."""
    data = yaml.safe_load((FILES / "monitoring" / "alerts.yml").read_text(encoding="utf-8"))
    return {rule["alert"] for group in data["groups"] for rule in group["rules"] if "alert" in rule}


def rules_loaded(c: HostConfig, r: Reading) -> str | None:
    answer = r.get("monitor")["rules"]
    if not isinstance(answer, dict) or answer.get("status") != "success":
        return f"Prometheus on {c.prometheus_address}:{c.prometheus_port} did not answer"
    loaded = {rule["name"] for group in answer["data"]["groups"] for rule in group["rules"]}
    missing = sorted(shipped_rules() - loaded)
    return f"Prometheus has not loaded {', '.join(missing)}" if missing else None


CHECKS = [
    Check(
        "monitoring.node-exporter",
        "the monitor's node exporter is active and answers with gpubox's metrics",
        "quick",
        ("monitor",),
        node_exporter,
        applies=is_monitor,
    ),
    Check(
        "monitoring.services",
        "Prometheus and Alertmanager are active and enabled on the monitor",
        "quick",
        ("monitor",),
        services,
        applies=is_monitor,
    ),
    Check(
        "monitoring.targets",
        "every box's exporters answer the monitor's scrapes (Prometheus's targets are up)",
        "quick",
        ("monitor",),
        targets_up,
        fix="gpubox doctor {inv}; {deploy}",
        applies=is_monitor,
    ),
    Check(
        "monitoring.rules",
        "Prometheus has loaded every alert rule of gpubox's rules file",
        "quick",
        ("monitor",),
        rules_loaded,
        applies=is_monitor,
    ),
]
