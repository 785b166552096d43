"""systemd units as the stages handle them: a unit restarted once when one of its files (unit
file, drop-in, config file) or its package changed, never at every deploy; systemd's units
reloaded only when a unit file or drop-in changed.

A change is what an operation returned (or ManagedFiles.put's unchanged marker); None stands
for an operation that was not planned and so changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyinfra.operations import systemd


def changed(*changes: Any, stopped: bool = False, unless: Any = None) -> Callable[[], bool]:
    """An ``_if`` condition: true when the unit is ``stopped`` or any of ``changes`` changed,
    and ``unless`` (an operation that restarted the unit already) did not."""
    planned = [c for c in changes if c is not None]

    def condition() -> bool:
        if unless is not None and unless.did_change():
            return False
        return stopped or any(c.did_change() for c in planned)

    return condition


def reload_units(*changes: Any, label: str = "") -> Any:
    """`systemctl daemon-reload` when a unit file or drop-in of ``changes`` changed."""
    return systemd.daemon_reload(
        name="Reload systemd units" + (f" ({label})" if label else ""), _if=changed(*changes)
    )


def restart_on_change(
    unit: str,
    name: str,
    *changes: Any,
    stopped: bool = False,
    unless: Any = None,
    reload: bool = False,
) -> Any:
    """Restart ``unit`` once when any of ``changes`` changed (or it is ``stopped``), not when
    ``unless`` changed; ``reload``: reload it instead (settings it takes live)."""
    return systemd.service(
        name=name,
        service=unit,
        restarted=not reload,
        reloaded=reload,
        _if=changed(*changes, stopped=stopped, unless=unless),
    )


def keep_running(unit: str, label: str, *changes: Any, enabled: bool | None = True) -> None:
    """``unit`` running (and enabled; None: its enablement left alone), then restarted once
    when any of ``changes`` changed, so that it runs with its new settings."""
    systemd.service(
        name=f"{label} running" + (" and enabled" if enabled else ""),
        service=unit,
        running=True,
        enabled=enabled,
    )
    restart_on_change(unit, f"Restart {label} with its new settings", *changes)
