"""Stage: the optional server panel, 1Panel v2 (key panel: "1panel"; docs/panel.md), on the
box's own Docker.

gpubox does not run 1Panel's install.sh (it would install Docker, may replace daemon.json, opens
firewall ports and asks ipify for the public address): it downloads the catalog's release for
the box's architecture into its cache, verifies its sha256, and reproduces the installer's
Init_Panel and Check_Ready steps with gpubox-panel (src/gpubox/files/gpubox-panel), one step per
operation. The password is generated on the box into a root-only file and reaches 1pctl there;
the installer's clear copy in 1pctl is masked at the end of the run, as Check_Ready does. An
installed panel is kept: its settings that differ from the inventory are converged through
1pctl's CHANGE_USER_INFO=use_existing (the core applies the ORIGINAL_* values at its next start),
its version, when not the catalog's, is a warning unless panel_version_policy is converge.
With panel: "none" the stage does nothing (an installed panel is left alone)."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from gevent import sleep
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, deploy, operation
from pyinfra.operations import apt, files, server, systemd

from gpubox.base import layout
from gpubox.base.rendering import FILES
from gpubox.config import HostConfig, Target
from gpubox.infra.host_facts import CommandOutput, read_once
from gpubox.infra.operations import ManagedFiles
from gpubox.knowledge import panel as rules
from gpubox.preflight import gate as preflight
from gpubox.stages import current_config

SCRIPT = "/usr/local/lib/gpubox/gpubox-panel"
CONF = "/etc/gpubox/panel.conf"
WAIT_S = 120  # for the port and the agent's socket after a start (install.sh: 60 s)


def conf_text(config: HostConfig, package: rules.Package) -> str:
    """The script's settings (no secret: the password and entrance stay in their files)."""
    values = {
        "PANEL_VERSION": package.version,
        "PANEL_ARCH": package.arch,
        "PANEL_DIR": config.panel_dir.rstrip("/"),
        "PANEL_PORT": str(config.panel_port),
        "PANEL_USER": config.panel_user,
        "PANEL_EDITION": config.panel_edition,
        "PANEL_CACHE": layout.PANEL_CACHE,
    }
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def script_text() -> str:
    return (FILES / "gpubox-panel").read_text(encoding="utf-8")


def compose_packages(config: HostConfig, target: Target) -> tuple[list[str], str | None]:
    """Docker Compose for the panel's apps on the distribution's path, and a warning when it
    is Compose v1 (Debian 12 has no v2). Docker's repository ships the v2 plugin with the
    engine (docker_source docker): nothing more then."""
    if config.docker_source != "distro":
        return [], None
    names = list(config.catalog["panel"]["compose_distro_packages"][target.family])
    warning = None
    if target.family == "debian":
        warning = (
            f"Debian {target.version_id}'s only Docker Compose is docker-compose 1.29 "
            '(Compose v1): 1Panel\'s apps want Compose v2 (docker compose); set "docker_source": '
            '"docker" (Docker\'s repository, docker-compose-plugin) for it'
        )
    return names, warning


def secret_ops(config: HostConfig) -> bool:
    """The password, generated once; the entrance: the inventory's, or generated once. Both
    root-only files. Returns whether the entrance file will change (the panel's must follow)."""
    have = secrets_present()
    if layout.PANEL_PASSWORD not in have:
        server.shell(
            name=f"Generate the panel's password ({layout.PANEL_PASSWORD}, root only)",
            commands=[generate(layout.PANEL_PASSWORD, 24)],
        )
    if config.panel_entrance:
        entrance = ManagedFiles({layout.PANEL_ENTRANCE: config.panel_entrance + "\n"}, mode="0600")
        changes = entrance.differs(layout.PANEL_ENTRANCE)
        entrance.put("The panel's entrance (panel_entrance, root only)", layout.PANEL_ENTRANCE)
        return changes
    if layout.PANEL_ENTRANCE not in have:
        server.shell(
            name=f"Generate the panel's entrance ({layout.PANEL_ENTRANCE}, root only)",
            commands=[generate(layout.PANEL_ENTRANCE, 16)],
        )
        return True
    return False


def secrets_present() -> list[str]:
    """Which of the password and entrance files the box has (not empty)."""
    return str(
        read_once(
            CommandOutput,
            command=f"for f in {layout.PANEL_PASSWORD} {layout.PANEL_ENTRANCE}; do "
            'test -s "$f" && echo "$f"; done',
        )
    ).split()


def generate(path: str, length: int) -> str:
    """Letters and digits from /dev/urandom into a root-only file (1Panel's rules accept them)."""
    q = shlex.quote(path)
    return (
        f"mkdir -p $(dirname {q}) && umask 077 && "
        f"head -c 256 /dev/urandom | tr -dc 'A-Za-z0-9' | head -c {length} > {q} && "
        f"echo >> {q} && chmod 600 {q}"
    )


@operation(is_idempotent=False)
def wait_for_panel(port: int, timeout: int):
    """Wait (with progress) until the core listens on the port and the agent's socket is
    there (install.sh's Check_Ready); on a timeout mask the password in 1pctl before failing."""

    def _wait(state, host) -> None:
        start = last = time.monotonic()
        probe = (
            f"ss -Htln 'sport = :{int(port)}' | grep -q . && echo port; "
            f"test -S {layout.PANEL_AGENT_SOCKET} && echo socket; true"
        )
        seen: set[str] = set()
        while time.monotonic() - start < timeout:
            _, out = host.run_shell_command(probe)
            seen = set(" ".join(out.stdout_lines).split()) & {"port", "socket"}
            if seen == {"port", "socket"}:
                logger.info(
                    f"{host.name}: 1Panel answers on port {port} after "
                    f"{time.monotonic() - start:.0f}s"
                )
                return
            if time.monotonic() - last > 10:
                logger.info(
                    f"{host.name}: waiting for 1Panel (port {port} "
                    f"{'up' if 'port' in seen else 'not yet'}, agent socket "
                    f"{'there' if 'socket' in seen else 'not yet'}, "
                    f"{time.monotonic() - start:.0f}s)"
                )
                last = time.monotonic()
            sleep(1)
        host.run_shell_command(f"{SCRIPT} mask")
        _, out = host.run_shell_command(
            f"journalctl -u {layout.PANEL_CORE} -u {layout.PANEL_AGENT} -n 30 --no-pager"
        )
        missing = {"port", "socket"} - seen
        raise OperationError(
            f"1Panel did not come up within {timeout}s ({', '.join(sorted(missing))} missing); "
            "its last log lines:\n" + "\n".join(out.stdout_lines)
        )

    yield FunctionCommand(_wait, (), {})


def refuse(config: HostConfig, problems: list[str]) -> None:
    lines = "\n".join(f"  - {config.host}: {p}" for p in problems)
    preflight.refuse(f"preflight failed, nothing was changed:\n{lines}")


@deploy("Panel")
def panel() -> None:
    config = current_config()
    if config.panel == "none":
        return
    target = preflight.run(config)
    state = rules.parse_state(read_once(CommandOutput, command=rules.state_command(config)))
    where = rules.parse_dir(read_once(CommandOutput, command=rules.dir_command(config)))
    entrance_changes = bool(config.panel_entrance) and state.entrance_sha256 != (
        rules.entrance_digest(config.panel_entrance)
    )
    # a password file lost on a box with the panel: the new one must reach the panel
    password_new = state.installed and layout.PANEL_PASSWORD not in secrets_present()
    plan = rules.plan(config, state, where, entrance_changes, password_new)
    if plan.refused:
        refuse(config, plan.refused)
    for warning in plan.warnings:
        logger.warning(f"{host.name}: panel: {warning}")
    for note in plan.notes:
        logger.info(f"{host.name}: panel: {note}")
    compose, compose_warning = compose_packages(config, target)
    if compose_warning:
        logger.warning(f"{host.name}: panel: {compose_warning}")
    if compose:
        apt.packages(
            name=f"Docker Compose for the panel's apps ({', '.join(compose)})",
            packages=compose,
            no_recommends=True,
        )
    secret_ops(config)
    package = rules.package(config, rules.onepanel_arch(where.arch) or where.arch)
    managed = ManagedFiles({CONF: conf_text(config, package)})
    managed.put("The panel's settings for gpubox-panel (no secret)", CONF)
    ManagedFiles({SCRIPT: script_text()}, mode="0755").put(
        "gpubox-panel (install.sh's steps)", SCRIPT
    )
    if plan.action in ("install", "upgrade"):
        if not where.curl:
            apt.packages(name="curl for the panel's download", packages=["curl"], update=True)
        files.directory(
            name=f"The panel's download cache ({layout.PANEL_CACHE})",
            path=layout.PANEL_CACHE,
            mode="0755",
        )
        files.download(
            name=f"Download and verify {Path(package.tarball).name}",
            src=package.url,
            dest=package.tarball,
            sha256sum=package.sha256,
        )
        step("unpack", f"Unpack 1Panel {package.version}")
        if plan.action == "upgrade":
            old = state.installed_version or "unknown"
            step(f"backup {shlex.quote(old)}", f"Keep 1Panel {old}'s files (upgrade backup)")
            server.shell(
                name="Stop 1Panel for the upgrade",
                commands=[f"systemctl stop {layout.PANEL_AGENT} {layout.PANEL_CORE}"],
            )
        step("files", "1Panel's binaries and 1pctl in /usr/local/bin, links in /usr/bin")
        step(
            "settings use_existing" if plan.use_existing else "settings",
            "1Panel's settings in 1pctl (the password read from its file on the box)",
        )
        step("units", "1Panel's GeoIP, languages and systemd units")
        step("start", "Start 1panel-core, then 1panel-agent")
    elif plan.action == "converge":
        logger.info(f"{host.name}: panel: converging {', '.join(plan.differs)}")
        step(
            "settings use_existing",
            "1Panel's settings in 1pctl, applied at the core's restart (CHANGE_USER_INFO)",
        )
        server.shell(
            name="Restart 1panel-core (it applies the settings)",
            commands=[f"systemctl restart {layout.PANEL_CORE}"],
        )
    if plan.action != "keep":
        wait_for_panel(
            name=f"Wait for 1Panel on port {config.panel_port}",
            port=config.panel_port,
            timeout=WAIT_S,
        )
    if plan.mask:
        step("mask", "Mask the password in 1pctl (install.sh's Check_Ready)")
    for unit in (layout.PANEL_CORE, layout.PANEL_AGENT):
        systemd.service(
            name=f"{unit} running and enabled", service=unit, running=True, enabled=True
        )
    stopped = [u for u in (layout.PANEL_CORE, layout.PANEL_AGENT) if state.unit(u)[0] != "active"]
    if plan.action == "keep" and stopped:
        # a panel found stopped is started above: wait for it as after an install
        wait_for_panel(
            name=f"Wait for 1Panel on port {config.panel_port} ({', '.join(stopped)} started)",
            port=config.panel_port,
            timeout=WAIT_S,
        )


def step(args: str, name: str) -> None:
    server.shell(name=name, commands=[f"{SCRIPT} {args}"])
