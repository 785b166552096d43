"""The driver stage's kept builds (gpubox.plans.driver_move): the operation that keeps the
installed build before a move replaces it, and the apt source that serves a kept build of the
pinned version (the way back)."""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import files, server

from gpubox.base import layout
from gpubox.base.rendering import as_file
from gpubox.config import HostConfig
from gpubox.infra.progress import StreamingCommand
from gpubox.plans import driver_move
from gpubox.plans.driver import DriverPlan
from gpubox.plans.driver_move import KeptState


@operation(is_idempotent=False)
def keep_driver(version: str, package_versions: list[str]):
    """Keep the installed packages of driver ``version`` (at ``package_versions``) in
    layout.DRIVER_KEPT_DIR/<version>, its progress shown as it goes; fails naming the packages
    it cannot keep. The stage adds it only when the build is not kept (complete) already."""
    yield StreamingCommand(driver_move.keep_command(version, package_versions))


def installed_at_pin(plan: DriverPlan) -> bool:
    """Whether every root of the plan is installed at the pinned version (dpkg's whole list,
    as preflight's kept answers read it: a root's source package need not be a driver
    build's, NVIDIA's nvidia-driver-cuda)."""
    installed = host.get_fact(DebPackages) or {}
    return all(plan.package_version in installed.get(name, ()) for name in plan.install)


def kept_source(config: HostConfig, kept: KeptState, install: bool) -> Any:
    """The kept build of the pinned version as an apt source (gpubox.plans.driver_move): its
    files checked against SHA256SUMS and served from layout.DRIVER_KEPT_REPO when it is not
    served yet or the driver is to be installed (``install``), and the source file; both
    removed when the pinned version is not kept. Returns the operation that changes apt's
    sources (for the apt update), or None."""
    version = config.driver_version
    if version in kept.versions:
        if install or kept.repo != kept.versions[version]:
            server.shell(
                name=f"Check driver {version}'s kept packages (SHA256SUMS) and serve them to apt",
                commands=[driver_move.repo_command(version)],
            )
        line = driver_move.source_line()
        if kept.source == line.strip():
            return None
        return files.put(
            name=f"apt source: driver {version}'s kept packages",
            src=as_file(line),
            dest=layout.DRIVER_KEPT_SOURCE,
            mode="0644",
        )
    if kept.source is None and kept.repo is None:
        return None
    removed = files.file(
        name="Remove the kept driver's apt source (the pinned driver is not a kept one)",
        path=layout.DRIVER_KEPT_SOURCE,
        present=False,
    )
    files.directory(
        name="Remove the kept driver's apt repository", path=layout.DRIVER_KEPT_REPO, present=False
    )
    return removed
