"""Packages installed at the exact version a stage's apt pin names, then held."""

from __future__ import annotations

from typing import Any

from pyinfra.operations import apt

from gpubox.infra import operations


def install_pinned(
    name: str, packages: list[str], version: str, hold: str, no_recommends: bool = False
) -> Any:
    """Install ``packages`` at ``version`` (a downgrade allowed and a held package changed, so
    the pinned version wins over whatever is installed), then apt-mark hold them (``hold``: the
    operation's name). Returns the install operation."""
    installed = apt.packages(
        name=name,
        packages=[f"{package}={version}" for package in packages],
        allow_downgrades=True,
        no_recommends=no_recommends,
        extra_install_args="--allow-change-held-packages",
    )
    operations.apt_hold(name=hold, packages=packages)
    return installed
