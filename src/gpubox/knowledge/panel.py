"""The optional server panel, 1Panel v2 (key ``panel``; docs/panel.md): what the box is asked
about it and what those answers mean. Pure: the commands are strings, the parsers and the
decisions take text and configuration; the stage (gpubox.stages.panel) and the checks
(gpubox.checks.panel) run them.

The facts follow 1Panel's own layout, as its installer makes it (1Panel-dev/installer
install.sh at aa4a6bbf24ae0fd938b32294672f5086f940e483): the settings the core seeds its
database from are variables of /usr/local/bin/1pctl; the core and the agent are the systemd
units 1panel-core and 1panel-agent; the agent listens on /etc/1panel/agent.sock. The panel's
live settings (port, user, entrance) are its database's, read through `1pctl user-info`; that
command also prints the password until the first login, so its output is filtered on the box
and only the port, the user and whether the entrance is the one kept by gpubox come back."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from gpubox.base import layout
from gpubox.knowledge import apt_versions, reads
from gpubox.knowledge.reads import section
from gpubox.parsers import parse_sections

# `dpkg --print-architecture` -> 1Panel's name for it in its package file names (amd64, arm64,
# armv7, ppc64le, s390x, riscv64: the release's tarballs, 1Panel's .goreleaser.yaml).
ARCHES = {
    "amd64": "amd64",
    "arm64": "arm64",
    "armhf": "armv7",
    "ppc64el": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}
MASKED = "**********"  # what install.sh's Check_Ready leaves of the password in 1pctl
# The login page (1Panel's frontend/index.html, the SPA shell the core serves at /<entrance>)
# and the page the core serves for any other path, a wrong entrance included, with status 200
# by default (core/cmd/server/res/html/200.html): told apart by content, never by status.
LOGIN_MARKS = ("<title>loading...</title>", 'id="app"', "first-loading-wrap")
UNAVAILABLE_MARK = "Access Temporarily Unavailable"
# The variables of 1pctl gpubox reads back (never ORIGINAL_PASSWORD nor ORIGINAL_ENTRANCE).
CTL_VARS = (
    "BASE_DIR",
    "ORIGINAL_PORT",
    "ORIGINAL_VERSION",
    "ORIGINAL_USERNAME",
    "LANGUAGE",
    "PANEL_EDITION",
    "CHANGE_USER_INFO",
)
# The placeholders of 1pctl's template (1Panel-dev/installer branch v2, 1pctl @
# a364aaa1a8847024b2edd9eabf1dbeb96d534cb5: BASE_DIR=directory, ORIGINAL_PORT=port, ...,
# ORIGINAL_PASSWORD=password). 1Panel's upgrade from its own page (1Panel-dev/1Panel
# core/app/service/upgrade.go @ 0306eb53d36481c4279d6af2478a786cf2cd4d37, Upgrade) copies the
# new package's 1pctl over the old one and sets only BASE_DIR in it (sed): after it, 1pctl holds
# these. They are no settings: the panel's live ones are in its database.
PLACEHOLDERS = {
    "BASE_DIR": "directory",
    "ORIGINAL_PORT": "port",
    "ORIGINAL_VERSION": "version",
    "ORIGINAL_ENTRANCE": "entrance",
    "ORIGINAL_USERNAME": "username",
    "ORIGINAL_PASSWORD": "password",
}


def onepanel_arch(dpkg_arch: str) -> str | None:
    return ARCHES.get(dpkg_arch.strip())


@dataclass(frozen=True)
class Package:
    version: str
    arch: str
    url: str
    sha256: str  # "" when the catalog records none for the architecture

    @property
    def name(self) -> str:
        """The release's file name without .tar.gz (its top directory too)."""
        return f"1panel-{self.version}-linux-{self.arch}"

    @property
    def tarball(self) -> str:
        return f"{layout.PANEL_CACHE}/{self.name}.tar.gz"


def package(config: Any, arch: str) -> Package:
    entry = config.catalog["panel"]["onepanel"]
    version = str(entry["version"])
    url = str(entry["url"][config.panel_edition]).format(version=version, arch=arch)
    return Package(version, arch, url, str(entry["sha256"].get(arch) or ""))


def arch_problem(config: Any, dpkg_arch: str) -> str | None:
    """Why this box's architecture cannot get the panel (preflight refuses), or None."""
    arch = onepanel_arch(dpkg_arch)
    if arch is None:
        known = ", ".join(sorted(ARCHES))
        return f"1Panel publishes no package for architecture {dpkg_arch.strip()!r} ({known})"
    if not package(config, arch).sha256:
        return (
            f"the catalog records no sha256 of 1Panel's package for {arch}: set "
            f"catalog_overrides panel.onepanel.sha256.{arch} (from the release's checksums.txt)"
        )
    return None


# --------------------------------------------------------------------------- the box's state


def state_command(config: Any) -> str:
    """The panel as the box has it: 1pctl's variables (the password only as masked, clear or
    absent), the units, `1pctl user-info` filtered on the box (port, user, and whether the
    entrance is the one in gpubox's file), the version, the agent's socket, the entrance
    file's sha256 (compared with an inventory's entrance, never shown), and the login page on
    the inventory's port, asked on the box with the entrance read from its file and handed to
    curl on standard input (never on a command line)."""
    ctl = layout.PANEL_CTL
    entrance = shlex.quote(layout.PANEL_ENTRANCE)
    names = "|".join(CTL_VARS)
    url_line = (
        r"""sed -n -e 's/[\\"]/\\&/g' """
        f"""-e '1s|.*|url = "http://127.0.0.1:{int(config.panel_port)}/&"|p' {entrance}"""
    )
    page = "/tmp/gpubox-panel-page.$$"
    return "; ".join(
        [
            section("ctl"),
            f"if [ -f {ctl} ]; then grep -E '^({names})=' {ctl}",
            f"if grep -qxF 'ORIGINAL_PASSWORD={MASKED}' {ctl}; then echo PASSWORD=masked; "
            f"elif grep -qxF 'ORIGINAL_PASSWORD={PLACEHOLDERS['ORIGINAL_PASSWORD']}' {ctl}; "
            "then echo PASSWORD=placeholder; "
            f"elif grep -q '^ORIGINAL_PASSWORD=' {ctl}; then echo PASSWORD=clear; fi; fi",
            section("units"),
            reads.UNIT_STATES.command_for(layout.PANEL_CORE, layout.PANEL_AGENT),
            section("info"),
            # the address line's port and path, and the user line: the password line never
            # leaves the box (it shows the password until the first login)
            f"if [ -x {ctl} ]; then a=$({ctl} user-info 2>/dev/null | tr -d '\\r' | "
            "sed -n 's#.*Panel address: *[a-z]*://[^ /]*:"
            "\\([0-9][0-9]*\\)/*\\([^ ]*\\).*#\\1 \\2#p'"
            " | head -n1); "
            'echo "port=${a%% *}"; '
            f"{ctl} user-info 2>/dev/null | tr -d '\\r' | "
            "sed -n 's/.*Panel user: *\\([^ ]*\\).*/user=\\1/p' | head -n1; "
            f'e=$(cat {entrance} 2>/dev/null || true); p="${{a#* }}"; '
            'if [ -z "$a" ]; then echo entrance=unknown; '
            'elif [ "$p" = "$a" ] || [ -z "$p" ]; then echo entrance=none; '
            'elif [ -n "$e" ] && [ "$p" = "$e" ]; then echo entrance=same; '
            "else echo entrance=differs; fi; fi",
            section("version"),
            f"if [ -x {ctl} ]; then {ctl} version 2>/dev/null | tr -d '\\r' | "
            "sed -n 's/.*version: *\\(v[^ ]*\\).*/\\1/p' | head -n1; fi",
            section("socket"),
            f"if [ -S {layout.PANEL_AGENT_SOCKET} ]; then echo yes; else echo no; fi",
            section("entrance_file"),
            f"sha256sum {entrance} 2>/dev/null | cut -d' ' -f1",
            section("page"),
            f"if [ -s {entrance} ] && command -v curl >/dev/null; then "
            f"s=$({url_line} | curl -s --max-time 10 -o {page} -w '%{{http_code}}' --config - "
            "|| true); "
            'echo "status=${s:-000}"; '
            + "".join(
                f"grep -qF {shlex.quote(m)} {page} 2>/dev/null && echo mark={i}; "
                for i, m in enumerate(LOGIN_MARKS)
            )
            + f"grep -qF {shlex.quote(UNAVAILABLE_MARK)} {page} 2>/dev/null && echo unavailable; "
            f"rm -f {page}; fi",
            "true",
        ]
    )


@dataclass
class PanelState:
    ctl: dict[str, str] = field(default_factory=dict)  # 1pctl's variables ({} when absent)
    units: dict[str, dict[str, str]] = field(default_factory=dict)
    port: int | None = None  # the database's, through 1pctl user-info
    user: str | None = None
    entrance: str = "unknown"  # same (as gpubox's file), differs, none, unknown
    version: str | None = None
    socket: bool = False
    entrance_sha256: str | None = None  # of gpubox's entrance file
    page_status: int = 0
    page: str = "none"  # login, unavailable, other, none (not asked)

    @property
    def installed(self) -> bool:
        return bool(self.ctl)

    @property
    def from_template(self) -> bool:
        """Whether 1pctl holds its template's placeholders (after an upgrade from 1Panel's
        own page, PLACEHOLDERS): its ORIGINAL_* and PANEL_EDITION then say nothing of the
        panel."""
        return (
            self.ctl.get("ORIGINAL_PORT") == PLACEHOLDERS["ORIGINAL_PORT"]
            or self.ctl.get("PASSWORD") == "placeholder"
        )

    @property
    def installed_version(self) -> str | None:
        recorded = self.ctl.get("ORIGINAL_VERSION")
        if recorded == PLACEHOLDERS["ORIGINAL_VERSION"]:
            recorded = None
        return self.version or recorded or None

    @property
    def edition(self) -> str | None:
        """The edition 1pctl records (PANEL_EDITION, written at the install); None when 1pctl
        has none or holds the template's (the package's 1pctl, not the install's)."""
        if self.from_template:
            return None
        return self.ctl.get("PANEL_EDITION") or None

    def unit(self, name: str) -> tuple[str, str]:
        """(ActiveState, UnitFileState) of a unit; "missing" for one systemd does not know."""
        props = self.units.get(name, {})
        if props.get("LoadState") in (None, "not-found"):
            return "missing", "missing"
        return props.get("ActiveState") or "unknown", props.get("UnitFileState") or "unknown"


def _sections(text: str) -> dict[str, list[str]]:
    return {k: [ln.rstrip() for ln in v.splitlines()] for k, v in parse_sections(text).items()}


def _pairs(lines: list[str]) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in lines if "=" in ln)


def parse_state(text: str) -> PanelState:
    s = _sections(text)
    ctl = {k: v.strip().strip("'\"") for k, v in _pairs(s.get("ctl", [])).items()}
    units = reads.UNIT_STATES.parse("\n".join(s.get("units", [])))
    info = _pairs(s.get("info", []))
    port = info.get("port", "")
    version = next((ln.strip() for ln in s.get("version", []) if ln.strip()), None)
    page_lines = s.get("page", [])
    page_info = _pairs(page_lines)
    status = page_info.get("status", "")
    marks = {ln for ln in page_lines if ln.startswith("mark=")}
    if not page_lines:
        page = "none"
    elif len(marks) == len(LOGIN_MARKS):
        page = "login"
    elif "unavailable" in page_lines:
        page = "unavailable"
    else:
        page = "other"
    digest = next((ln.strip() for ln in s.get("entrance_file", []) if ln.strip()), None)
    return PanelState(
        ctl=ctl,
        units=units,
        port=int(port) if port.isdigit() else None,
        user=info.get("user") or None,
        entrance=info.get("entrance", "unknown"),
        version=version,
        socket=s.get("socket", ["no"])[:1] == ["yes"],
        entrance_sha256=digest,
        page_status=int(status) if status.isdigit() else 0,
        page=page,
    )


def dir_command(config: Any) -> str:
    """What the stage needs of <panel_dir>/1panel before it installs: whether it exists with
    anything in it, has the core's database (1Panel's installer keeps the data then) or
    gpubox's marker; the box's architecture; who listens on the panel's port."""
    run = shlex.quote(f"{config.panel_dir.rstrip('/')}/1panel")
    return "; ".join(
        [
            f'if [ -n "$(ls -A {run} 2>/dev/null)" ]; then echo dir=full; else echo dir=empty; fi',
            f"[ -f {run}/db/core.db ] && echo db=yes",
            f"[ -e {run}/{layout.PANEL_MARKER} ] && echo marker=yes",
            "echo arch=$(dpkg --print-architecture 2>/dev/null || uname -m)",
            f"ss -Htlnp 'sport = :{int(config.panel_port)}' 2>/dev/null | sed 's/^/listen=/'",
            "command -v curl >/dev/null && echo curl=yes",
            "true",
        ]
    )


@dataclass(frozen=True)
class DirState:
    full: bool
    db: bool
    marker: bool
    arch: str
    listeners: tuple[str, ...]  # `ss` lines of whatever listens on the panel's port
    curl: bool


def parse_dir(text: str) -> DirState:
    lines = text.splitlines()
    pairs = _pairs([ln for ln in lines if not ln.startswith("listen=")])
    return DirState(
        full=pairs.get("dir") == "full",
        db=pairs.get("db") == "yes",
        marker=pairs.get("marker") == "yes",
        arch=pairs.get("arch", "").strip(),
        listeners=tuple(ln.removeprefix("listen=") for ln in lines if ln.startswith("listen=")),
        curl=pairs.get("curl") == "yes",
    )


# --------------------------------------------------------------------------- the decision


@dataclass
class PanelPlan:
    action: str  # install, upgrade, converge, keep
    use_existing: bool = False  # 1pctl's CHANGE_USER_INFO=use_existing (the data is kept)
    differs: list[str] = field(default_factory=list)  # the settings that differ
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # logged, never a failure
    mask: bool = False  # gpubox-panel mask at the end (install.sh's Check_Ready)
    refused: list[str] = field(default_factory=list)  # (key, why) as "key: why"


def settings_differ(
    config: Any, state: PanelState, entrance_changes: bool, password_new: bool = False
) -> list[str]:
    """The settings of an installed panel that differ from the inventory."""
    differs = []
    if state.port != config.panel_port:
        differs.append(f"panel_port (the panel has {state.port})")
    if state.user != config.panel_user:
        differs.append(f"panel_user (the panel has {state.user})")
    if entrance_changes or state.entrance != "same":
        differs.append("panel_entrance (the panel's is not gpubox's)")
    if password_new:
        differs.append(f"the password ({layout.PANEL_PASSWORD} was missing: a new one is set)")
    # never the edition: an installed panel's is refused when it differs (edition_problem)
    return differs


def newer_than(version: str, pin: str) -> bool:
    """Whether 1Panel ``version`` ("v2.3.3") is newer than ``pin``: compared in dpkg's order
    without the "v" (gpubox.knowledge.apt_versions); False for an unknown version."""
    if not version.startswith("v") or not pin.startswith("v"):
        return False
    return apt_versions.compare(version[1:], pin[1:]) > 0


def edition_problem(config: Any, state: PanelState) -> str | None:
    """An installed panel of another edition than panel_edition: refused, never converged.
    1Panel v2's core reads its edition from its database (core.db), and the use_existing hook
    of CHANGE_USER_INFO (1Panel-dev/1Panel core/init/hook/hook.go) copies the port, user,
    password and entrance from 1pctl, not the edition: PANEL_EDITION written into 1pctl would
    change nothing but 1pctl. None when 1pctl records no edition of the install."""
    if state.edition is None or state.edition == config.panel_edition:
        return None
    return (
        f"panel_edition: the installed panel is the {state.edition!r} edition, the inventory "
        f"says {config.panel_edition!r}; 1Panel keeps its edition in its database and gpubox "
        f'cannot change it on an installed panel: set "panel_edition": "{state.edition}" '
        "(or uninstall the panel and deploy again)"
    )


def plan(
    config: Any,
    state: PanelState,
    where: DirState,
    entrance_changes: bool = False,
    password_new: bool = False,
) -> PanelPlan:
    """What the stage does: install, upgrade (panel_version_policy converge, never to an older
    version), converge the settings (never the edition), or keep; whether it masks the password
    in 1pctl at the end; and what it refuses, before anything changes."""
    pin = str(config.catalog["panel"]["onepanel"]["version"])
    run = f"{config.panel_dir.rstrip('/')}/1panel"
    result = PanelPlan("keep")
    problem = arch_problem(config, where.arch)
    foreign = [ln for ln in where.listeners if "1panel" not in ln]
    if not state.installed:
        result.action = "install"
        result.use_existing = where.db
        result.mask = True
        if problem:
            result.refused.append(f"panel: {problem}")
        if where.full and not where.db and not where.marker:
            result.refused.append(
                f"panel_dir: {run} exists and holds files but no 1Panel database (db/core.db) "
                "and no gpubox marker: 1Panel's installer would delete them; move them away "
                "or choose another panel_dir"
            )
        if foreign:
            result.refused.append(
                f"panel_port: {config.panel_port} is taken by another program: {foreign[0]}"
            )
        return result
    version = state.installed_version or "unknown"
    if version.startswith("v1."):
        result.refused.append(
            f"panel: 1Panel {version} (v1) is installed; gpubox installs v2, and v1 to v2 "
            'takes 1Panel\'s own migrator: migrate it, or set "panel": "none"'
        )
        return result
    base = state.ctl.get("BASE_DIR", "").rstrip("/")
    if base and base != config.panel_dir.rstrip("/"):
        result.refused.append(
            f"panel_dir: the installed panel keeps its data in {base}/1panel, not "
            f'{run}: set "panel_dir": "{base}" (gpubox does not move a panel\'s data)'
        )
    result.differs = settings_differ(config, state, entrance_changes, password_new)
    edition = edition_problem(config, state)
    if edition:
        result.refused.append(edition)
    if result.differs and state.port != config.panel_port and foreign:
        result.refused.append(
            f"panel_port: {config.panel_port} is taken by another program: {foreign[0]}"
        )
    if version != pin and newer_than(version, pin):
        # 1Panel's own upgrade (core/app/service/upgrade.go) has migrated its databases and
        # 1Panel has no downgrade but its own rollback: never installed over
        if config.panel_version_policy == "converge":
            result.refused.append(
                f"panel_version_policy: 1Panel {version} is installed, newer than the "
                f"catalog's {pin}; gpubox never downgrades a panel (1Panel's upgrade has "
                "migrated its databases, only 1Panel's own rollback goes back): set "
                f"catalog_overrides panel.onepanel.version to {version!r} (with its sha256), "
                'or "panel_version_policy": "warn"'
            )
        else:
            result.notes.append(
                f"1Panel {version} is installed, newer than the catalog's {pin}: kept "
                "(gpubox never downgrades a panel)"
            )
    elif version != pin:
        if config.panel_version_policy == "converge":
            result.action = "upgrade"
            if problem:
                result.refused.append(f"panel: {problem}")
        else:
            result.warnings.append(
                f"1Panel {version} is installed, the catalog pins {pin}: kept "
                "(panel_version_policy: converge installs the pin)"
            )
    if result.action == "keep" and result.differs:
        result.action = "converge"
    result.use_existing = result.action in ("upgrade", "converge")
    # every path ends with the password masked in 1pctl: a kept panel's too when its 1pctl holds
    # it in clear (a run stopped before its mask step) or the template's placeholder
    result.mask = result.action != "keep" or state.ctl.get("PASSWORD") in ("clear", "placeholder")
    return result


def ctl_problems(config: Any, state: PanelState, entrance_sha256: str | None) -> list[str]:
    """How the installed panel's settings differ from the inventory (the check's words):
    port, user, entrance, version, and a password left in clear in 1pctl."""
    found = []
    if state.port != config.panel_port:
        found.append(
            f"the panel listens on port {state.port}, the inventory says {config.panel_port}"
        )
    if state.user != config.panel_user:
        found.append(
            f"the panel's user is {state.user!r}, the inventory says {config.panel_user!r}"
        )
    if state.entrance != "same":
        found.append(f"the panel's entrance is not the one kept by gpubox ({state.entrance})")
    elif entrance_sha256 and state.entrance_sha256 != entrance_sha256:
        found.append("the entrance kept by gpubox is not the inventory's panel_entrance")
    pin = str(config.catalog["panel"]["onepanel"]["version"])
    version = state.installed_version
    newer_kept = (
        version is not None and newer_than(version, pin) and config.panel_version_policy == "warn"
    )
    if version != pin and not newer_kept:
        found.append(f"1Panel {version} is installed, the catalog pins {pin}")
    if state.ctl.get("PASSWORD") == "clear":
        found.append(f"{layout.PANEL_CTL} holds the password in clear (not masked)")
    return found


def entrance_digest(entrance: str | None) -> str | None:
    """The sha256 the entrance file has when it holds ``entrance`` (one line)."""
    if not entrance:
        return None
    import hashlib

    return hashlib.sha256((entrance + "\n").encode()).hexdigest()
