"""Checks of the optional server panel, 1Panel v2 (deploy/panel.py; docs/panel.md): its two
services, the agent's socket, the login page on its entrance, and its settings against the
inventory. They apply only when panel is not "none". The entrance is a secret: the fact asks
the page on the box with the entrance read from its file there, and no check prints it."""

from __future__ import annotations

from gpubox.base import layout
from gpubox.checks.core import Check, Finding, Reading
from gpubox.config import HostConfig
from gpubox.knowledge import panel as rules


def wanted(c: HostConfig) -> str | None:
    return "panel is none in the inventory" if c.panel == "none" else None


def services(c: HostConfig, r: Reading) -> list[Finding]:
    state: rules.PanelState = r.get("panel")
    found = []
    for unit in (layout.PANEL_CORE, layout.PANEL_AGENT):
        active, enabled = state.unit(unit)
        if (active, enabled) != ("active", "enabled"):
            found.append(
                Finding(
                    f"{unit} is {active} and {enabled}",
                    f"journalctl -u {unit} -n 30; systemctl enable --now {unit}; {{deploy}}",
                )
            )
    return found


def socket(c: HostConfig, r: Reading) -> Finding | None:
    state: rules.PanelState = r.get("panel")
    if state.socket:
        return None
    return Finding(
        f"the agent's socket {layout.PANEL_AGENT_SOCKET} is missing (the panel's pages answer "
        "502 without it)",
        f"systemctl restart {layout.PANEL_AGENT}; journalctl -u {layout.PANEL_AGENT} -n 30",
    )


def login(c: HostConfig, r: Reading) -> str | None:
    state: rules.PanelState = r.get("panel")
    if state.page == "login" and state.page_status == 200:
        return None
    if state.page == "none":
        return (
            f"the login page was not asked: no entrance in {layout.PANEL_ENTRANCE} or no curl "
            "on the box"
        )
    what = {
        "unavailable": "1Panel's 'Access Temporarily Unavailable' page (a wrong entrance)",
        "other": "no login page",
    }[state.page]
    status = f"HTTP {state.page_status}" if state.page_status else "no answer"
    return f"port {c.panel_port} on the entrance answers {what} ({status})"


def settings(c: HostConfig, r: Reading) -> list[str]:
    state: rules.PanelState = r.get("panel")
    if not state.installed:
        return [f"1Panel is not installed ({layout.PANEL_CTL} is missing)"]
    return rules.ctl_problems(c, state, rules.entrance_digest(c.panel_entrance))


CHECKS = [
    Check(
        "panel.services",
        "the panel's core and agent (1panel-core, 1panel-agent) are active and enabled",
        "quick",
        ("panel",),
        services,
        applies=wanted,
    ),
    Check(
        "panel.socket",
        f"the panel's agent listens on {layout.PANEL_AGENT_SOCKET}",
        "quick",
        ("panel",),
        socket,
        applies=wanted,
    ),
    Check(
        "panel.login",
        "the panel's port answers its login page on the entrance (told apart by content)",
        "quick",
        ("panel",),
        login,
        applies=wanted,
    ),
    Check(
        "panel.settings",
        "the panel's port, user and entrance are the inventory's, its version the catalog's "
        '(a newer one passes with "panel_version_policy": "warn"); its password is masked in '
        "1pctl",
        "quick",
        ("panel",),
        settings,
        applies=wanted,
    ),
]
