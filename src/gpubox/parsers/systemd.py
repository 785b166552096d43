"""systemd's outputs: `systemctl get-default`, `systemctl show -p ...` and `loginctl
show-session -p ...` (KEY=VALUE lines), the same in systemd 252 (Debian 12) and 255 (Ubuntu
24.04)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpubox.parsers._common import ParseError, _lines, _quote

_PROPERTY = re.compile(r"^([A-Za-z][A-Za-z0-9]*)=(.*)$")


def parse_properties(text: str) -> dict[str, str]:
    """`systemctl show -p A -p B UNIT` / `loginctl show-session ID -p A -p B`: one KEY=value
    line per property, in the bus object's order (not the order of the -p options); an empty
    value prints "KEY=". Blank lines (between several objects) are skipped."""
    values: dict[str, str] = {}
    for line in _lines(text):
        if not line.strip():
            continue
        match = _PROPERTY.match(line.strip())
        if not match:
            raise ParseError(
                f"not a KEY=value property line (systemctl/loginctl show): {_quote(line)}"
            )
        values[match.group(1)] = match.group(2)
    return values


_TARGET = re.compile(r"^[A-Za-z0-9:_.@-]+\.target$")


def parse_default_target(text: str) -> str | None:
    """`systemctl get-default`: the default target's name ("graphical.target",
    "multi-user.target"); None when it printed nothing (no systemd)."""
    lines = [ln.strip() for ln in _lines(text) if ln.strip()]
    if not lines:
        return None
    if len(lines) != 1 or not _TARGET.match(lines[0]):
        raise ParseError(
            f"want one unit name ending in .target (systemctl get-default): {_quote(lines[0])}"
        )
    return lines[0]


@dataclass(frozen=True)
class UnitState:
    """`systemctl show -p Id -p LoadState -p ActiveState -p SubState UNIT`. Asked by an alias
    (display-manager.service), Id names the unit it resolves to (gdm.service)."""

    id: str
    load_state: str  # loaded, not-found, masked, ...
    active_state: str  # active, inactive, failed, activating, ...
    sub_state: str = ""

    @property
    def exists(self) -> bool:
        return self.load_state == "loaded"

    @property
    def active(self) -> bool:
        return self.active_state == "active"


def parse_unit_state(text: str) -> UnitState | None:
    """None when systemctl printed nothing (no systemd)."""
    values = parse_properties(text)
    if not values:
        return None
    if "Id" not in values or "LoadState" not in values:
        raise ParseError(
            f"want Id= and LoadState= (systemctl show -p Id -p LoadState ...): {values}"
        )
    return UnitState(
        values["Id"], values["LoadState"], values.get("ActiveState", ""), values.get("SubState", "")
    )


GRAPHICAL_TYPES = ("x11", "wayland", "mir")


@dataclass(frozen=True)
class LoginSession:
    """One logind session: `loginctl show-session ID -p Id -p Name -p Seat -p Type -p Class
    -p State -p Remote`. Type: unspecified, tty, x11, wayland, mir, web; Class: user, greeter,
    lock-screen, background (systemd 256 adds user-early, manager, ...); State: online,
    active, closing (loginctl(1), org.freedesktop.login1(5))."""

    id: str
    name: str  # the user
    type: str
    klass: str
    seat: str  # "" when it has none (ssh, background)
    state: str
    remote: bool = False

    @property
    def graphical(self) -> bool:
        return self.type in GRAPHICAL_TYPES

    @property
    def user_at_the_display(self) -> bool:
        """A user (not the display manager's greeter) logged in to a graphical session that
        is open: active (in the foreground) or online (switched away from)."""
        user = self.klass in ("user", "user-early", "user-light", "user-early-light")  # 256+
        return self.graphical and user and self.state in ("active", "online")


def parse_login_session(text: str) -> LoginSession:
    values = parse_properties(text)
    if "Id" not in values:
        raise ParseError(f"want Id= (loginctl show-session ID -p Id -p Type ...): {values}")
    return LoginSession(
        id=values["Id"],
        name=values.get("Name", ""),
        type=values.get("Type", ""),
        klass=values.get("Class", ""),
        seat=values.get("Seat", ""),
        state=values.get("State", ""),
        remote=values.get("Remote", "no") == "yes",
    )


def parse_unit_states(text: str) -> dict[str, dict[str, str]]:
    """`systemctl show -p Id,LoadState,ActiveState,UnitFileState UNIT...`: one block of
    KEY=value lines per unit, blocks apart by a blank line; keyed by the Id without
    ``.service``. A block without an Id (a unit systemd printed nothing for) is left out."""
    units: dict[str, dict[str, str]] = {}
    for block in text.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            units[props["Id"].removesuffix(".service")] = props
    return units
