"""The kept driver builds on a box (gpubox.plans.driver_move), read before anything changes:
the driver stage keeps a build once, and a pinned version that is kept counts as offered."""

from __future__ import annotations

from pyinfra.api import FactBase

from gpubox.config import HostConfig, Target
from gpubox.infra.host_facts import read_once
from gpubox.plans import driver_move
from gpubox.plans.driver_move import KeptState


class KeptDrivers(FactBase[KeptState]):
    """The complete kept builds, the kept repository and source, and ``version``'s stanzas."""

    def command(self, version: str) -> str:  # type: ignore[override]
        return driver_move.kept_command(version)

    @staticmethod
    def default() -> KeptState:
        return KeptState()

    def process(self, output: list[str]) -> KeptState:
        return driver_move.parse_kept(output)


def kept(config: HostConfig) -> KeptState:
    """The current host's kept builds, read once per run (preflight prefetches it)."""
    return read_once(KeptDrivers, version=config.driver_version)  # type: ignore[no-any-return]


def kept_offers(config: HostConfig, target: Target) -> dict[str, list[str]]:
    """What the kept build of the pinned version offers ({} when it is not kept)."""
    packages = config.driver_packages(target.family)
    return driver_move.kept_offers(
        kept(config),
        config.driver_version,
        packages.package_version,
        packages.installed + packages.refused,
    )
