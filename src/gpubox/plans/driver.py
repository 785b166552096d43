"""What the driver stage installs, pins and refuses, from the catalog and what NVIDIA offers.

Pure: no host, no pyinfra state. The catalog names only the roots (the packages NVIDIA
documents installing); everything else the driver needs comes through their exactly versioned
dependencies, and the pin covers every package NVIDIA's repository builds at the pinned version
(``offered``: asked of the host's apt), so no dependency can slip to another driver build.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpubox.base.rendering import render
from gpubox.config import HostConfig, Target
from gpubox.parsers.apt import parse_stanzas


class DriverUnavailable(Exception):
    """NVIDIA's repository does not offer a catalog root at the pinned version."""


@dataclass(frozen=True)
class DriverPlan:
    package_version: str  # NVIDIA's version string, e.g. 570.211.01-1 / 570.211.01-0ubuntu1
    install: list[str]  # roots: installed as name=package_version and held
    pinned: list[str]  # at package_version 1001, every other version -1
    refused: list[str]  # the other kernel module flavour's roots: -1 and removed
    forbidden: list[str]  # metas that drag in a driver of their own: removed
    distro_refused: list[str]  # apt preferences Package: patterns, -1 from the distribution
    pin: str  # the apt preferences file
    unattended: str  # the unattended-upgrades blacklist


def package_version(config: HostConfig, family: str) -> str:
    """NVIDIA's version string for the host's driver on an OS family (an explicit
    ``driver_version`` keeps the catalog's revision: ``570.211.01-1`` -> ``570.195.03-1``)."""
    return config.driver_packages(family).package_version


def roots(config: HostConfig, family: str) -> tuple[list[str], list[str]]:
    """(install, refused): the catalog's roots for the host's kernel module flavour and the
    other flavour's."""
    packages = config.driver_packages(family)
    return packages.installed, packages.refused


def offered_from_stanzas(
    text: str, package_version: str, roots: Iterable[str]
) -> dict[str, list[str]]:
    """What NVIDIA's repository offers that the plan needs, from its package stanzas (a
    Packages index or ``apt-cache show``; ``parsers.apt.parse_stanzas`` reads them).

    Every package name that has a version equal to ``package_version``, plus every root,
    mapped to all the versions the repository has of it (in index order, no repeats). A root
    the repository does not have at all is absent."""
    versions: dict[str, list[str]] = {}
    for stanza in parse_stanzas(text):
        name, version = stanza.get("Package"), stanza.get("Version")
        if name and version and version not in versions.setdefault(name, []):
            versions[name].append(version)
    wanted = {name for name, have in versions.items() if package_version in have}
    wanted.update(name for name in roots if name in versions)
    return {name: versions[name] for name in sorted(wanted)}


def _missing_message(
    config: HostConfig,
    target: Target,
    version: str,
    missing: Sequence[str],
    offered: Mapping[str, Sequence[str]],
) -> str:
    branch = config.values["driver_branch"]
    parts = []
    for name in missing:
        have = list(offered.get(name) or [])
        parts.append(
            f"{name} (the repository has {', '.join(have)})"
            if have
            else f"{name} (not in the repository)"
        )
    return (
        f"{config.host}: NVIDIA's {target.distro} repository does not offer driver "
        f"{config.values['driver_version']} as {version}: {'; '.join(parts)}. "
        f"Set driver_version to a version it offers, or correct the catalog with "
        f"catalog_overrides: driver.branches.{branch}.package_version.{target.family} "
        f"(the version string) or driver.packages.{target.family}.* (the package names)"
    )


def plan(config: HostConfig, target: Target, offered: Mapping[str, Sequence[str]]) -> DriverPlan:
    """The driver packages, pin and unattended-upgrades blacklist for a host (pure).

    ``offered``: for every package NVIDIA's repository has at the pinned version, and every
    catalog root, the versions the repository has (see ``offered_from_stanzas``)."""
    family = target.family
    driver = config.catalog["driver"]
    version = package_version(config, family)
    install, refused = roots(config, family)
    forbidden = config.driver_packages(family).forbidden

    missing = [name for name in install if version not in (offered.get(name) or ())]
    if missing:
        raise DriverUnavailable(_missing_message(config, target, version, missing, offered))

    excluded = set(refused) | set(forbidden)
    pinned = sorted(
        name for name, versions in offered.items() if version in versions and name not in excluded
    )
    distro_refused = list(driver["distro_refused"][family])
    pin = render(
        "apt-pin-nvidia-driver.j2",
        version=config.values["driver_version"],
        package_version=version,
        flavour=config.values["driver_kernel_modules"],
        pinned=pinned,
        refused=refused,
        distro_refused=distro_refused,
        distro_origin=target.distro_origin,
        # Debian's backports archive has an Origin of its own ("Debian Backports").
        distro_origins=[target.distro_origin]
        + (["Debian Backports"] if target.family == "debian" else []),
    )
    unattended = render("unattended-upgrades-blacklist.j2", packages=pinned + refused)
    return DriverPlan(
        package_version=version,
        install=install,
        pinned=pinned,
        refused=refused,
        forbidden=forbidden,
        distro_refused=distro_refused,
        pin=pin,
        unattended=unattended,
    )
