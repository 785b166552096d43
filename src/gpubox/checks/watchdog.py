"""Checks of the API server's watchdog (deploy/watchdog.py): its timer runs; its record (the
restart count doctor shows) is gpubox.knowledge.watchdog's state file."""

from __future__ import annotations

import json
from typing import Any

from gpubox.base import layout
from gpubox.checks.core import Check, Fact, Finding, Reading, fact
from gpubox.config import HostConfig
from gpubox.knowledge import reads
from gpubox.knowledge.reads import section
from gpubox.parsers import parse_sections, parse_unit_states


def parse_watchdog(text: str) -> dict[str, Any]:
    """The timer's properties (``timer``) and the state file (``state``: None when there is
    none, {"error": ...} when it does not parse)."""
    sections = parse_sections(text)
    timer = parse_unit_states(sections.get("timer", "")).get(layout.WATCHDOG_TIMER, {})
    raw = sections.get("state", "").strip()
    state: dict[str, Any] | None = None
    if raw:
        try:
            state = json.loads(raw)
        except ValueError:
            state = {"error": f"{layout.WATCHDOG_STATE} is not JSON"}
    return {"timer": timer, "state": state}


def _watchdog(config: HostConfig, target: Any) -> str:
    return (
        f"{section('timer')}; {reads.UNIT_STATES.command_for(layout.WATCHDOG_TIMER)}; "
        f"{section('state')}; cat {layout.WATCHDOG_STATE} 2>/dev/null; true"
    )


fact(Fact("watchdog", _watchdog, parse_watchdog))


def watched(c: HostConfig) -> str | None:
    if c.backend == "none":
        return "backend is none in the inventory"
    return None if c.watchdog else "watchdog is false in the inventory"


def timer_active(c: HostConfig, r: Reading) -> Finding | None:
    timer = r.get("watchdog")["timer"]
    active, state = timer.get("ActiveState", "unknown"), timer.get("UnitFileState", "unknown")
    if active == "active" and state == "enabled":
        return None
    return Finding(
        f"{layout.WATCHDOG_TIMER} is {active} and {state or 'not installed'}",
        f"journalctl -u {layout.WATCHDOG} -n 20; {{deploy}}",
    )


CHECKS = [
    Check(
        "watchdog.timer",
        "the watchdog's timer, which restarts a hung API server, is active and enabled",
        "quick",
        ("watchdog",),
        timer_active,
        applies=watched,
    ),
]
