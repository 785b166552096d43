"""Stage: Docker Engine, from Docker's apt repository or the distribution's docker.io.

A Docker that is already installed and running (a panel such as 1Panel installs its own) is
kept and only configured, unless docker_keep_existing is false. daemon.json is merged, never
overwritten: gpubox sets only the keys it owns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import apt, systemd

from gpubox import answers, layout, operations, preflight
from gpubox.config import HostConfig, Target
from gpubox.facts import DockerEngine, read_once
from gpubox.stages import current_config, units
from gpubox.stages.apt_repo import apt_repo, placeholders

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


def daemon_settings(config: HostConfig) -> dict[str, Any]:
    settings: dict[str, Any] = dict(config.docker_daemon_options)
    if config.docker_registry_mirrors:
        settings["registry-mirrors"] = list(config.docker_registry_mirrors)
    return settings


def plan(config: HostConfig, target: Target, engine: dict[str, Any]) -> DockerPlan:
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
        install, bool(install) and config.docker_source == "docker", keep, daemon_settings(config)
    )


@deploy("Docker")
def docker() -> None:
    config = current_config()
    target = preflight.run(config)
    p = plan(config, target, read_once(DockerEngine))
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
