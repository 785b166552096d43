"""Stage: Docker Engine, from Docker's apt repository or the distribution's docker.io.

A Docker that is already installed and running (a panel such as 1Panel installs its own) is
kept and only configured, unless docker_keep_existing is false. daemon.json is merged, never
overwritten: gpubox sets only the keys it owns. The users of docker_users (each must exist:
preflight refuses one the box lacks) are added to the docker group; a user taken out of the
list keeps the group (gpubox adds members, it never removes one)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from gpubox.base import layout
from gpubox.config import HostConfig, Target
from gpubox.infra import operations
from gpubox.infra.host_facts import DockerEngine, UserGroups, read_once
from gpubox.ops import units
from gpubox.ops.apt_repo import apt_repo
from gpubox.preflight import answers
from gpubox.preflight import gate as preflight
from gpubox.rules.apt_sources import placeholders
from gpubox.stages import current_config

GROUP = layout.DOCKER_GROUP

# daemon.json keys `systemctl reload docker` applies without restarting containers.
RELOADABLE = {
    "runtimes",
    "default-runtime",
    "registry-mirrors",
    "insecure-registries",
    "labels",
    "debug",
    "max-concurrent-downloads",
    "max-concurrent-uploads",
    "live-restore",
    "features",
}


@dataclass(frozen=True)
class DockerPlan:
    install: list[str]  # package specs (name or name=version)
    repo: bool  # Docker's repository is added
    keep_existing: str | None  # why the installed engine is kept, if it is
    daemon: dict[str, Any]  # daemon.json keys gpubox sets
    users: list[str] = field(default_factory=list)  # docker_users not yet in the docker group


def daemon_settings(config: HostConfig) -> dict[str, Any]:
    settings: dict[str, Any] = dict(config.docker_daemon_options)
    if config.docker_registry_mirrors:
        settings["registry-mirrors"] = list(config.docker_registry_mirrors)
    return settings


def users_to_add(config: HostConfig, groups: Mapping[str, list[str] | None]) -> list[str]:
    """The docker_users that exist and are not in the docker group yet (``groups``: each
    user's, None for one the box lacks, which preflight refuses)."""
    return [u for u in config.docker_users if GROUP not in (groups.get(u) or [GROUP])]


def add_user_command(user: str) -> str:
    """Add ``user`` to the docker group (made first when the Docker kept has none, as a snap's
    or a rootless one's)."""
    return (
        f"getent group {GROUP} >/dev/null || groupadd --system {GROUP}; "
        f"usermod -aG {GROUP} {shlex.quote(user)}"
    )


def plan(
    config: HostConfig,
    target: Target,
    engine: dict[str, Any],
    groups: Mapping[str, list[str] | None] | None = None,
) -> DockerPlan:
    keep = None
    if config.docker_keep_existing and engine["binary"] and engine["active"]:
        keep = (
            f"Docker is already installed ({engine['package'] or engine['binary']}) and "
            "running: kept, only configured (docker_keep_existing)"
        )
    values = placeholders(target)
    if keep:
        install: list[str] = []
    elif config.docker_source == "docker":
        install = [
            f"{name}={version.format(**values)}"
            for name, version in config.catalog["docker"]["packages"].items()
        ]
    else:
        install = list(config.catalog["docker"]["distro_packages"])
    return DockerPlan(
        install,
        bool(install) and config.docker_source == "docker",
        keep,
        daemon_settings(config),
        users_to_add(config, groups or {}),
    )


@deploy("Docker")
def docker() -> None:
    config = current_config()
    target = preflight.run(config)
    groups = read_once(UserGroups, users=tuple(config.docker_users)) if config.docker_users else {}
    p = plan(config, target, read_once(DockerEngine), groups)
    if p.keep_existing:
        logger.info(f"{host.name}: {p.keep_existing}")
    if p.repo:
        apt_repo(config, "docker", target, "Docker")
    if p.install:
        apt.packages(
            name="Install Docker Engine"
            + (" (Docker's packages)" if p.repo else " (the distribution's docker.io)"),
            packages=p.install,
            allow_downgrades=p.repo,
            no_recommends=not p.repo,
        )
    daemon = None
    if p.daemon:
        daemon = operations.json_file_merge(
            name=f"daemon.json: {', '.join(sorted(p.daemon))}",
            path=layout.DAEMON_JSON,
            values=p.daemon,
        )
    systemd.service(
        name="Docker running and enabled", service=layout.DOCKER, running=True, enabled=True
    )
    if daemon is not None:
        reload_docker(daemon, set(p.daemon))
    for user in p.users:
        server.shell(
            name=f"docker_users: add {user} to the docker group (from {user}'s next login)",
            commands=[add_user_command(user)],
        )
    answers.keep_answers()  # this run's answers, kept (only if they changed)


def reload_docker(change: Any, keys: set[str], unless: Any = None) -> None:
    """Apply a daemon.json change: reload when Docker can take the keys live, else restart
    (nothing when the operation ``unless`` changed: Docker was restarted after it)."""
    live = keys <= RELOADABLE
    units.restart_on_change(
        layout.DOCKER,
        f"{'Reload' if live else 'Restart'} Docker (daemon.json changed)",
        change,
        unless=unless,
        reload=live,
    )
