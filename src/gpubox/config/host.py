"""What a validated host is: its typed config (HostConfig, with the facts derived from it), the
problems validation reports, and what its OS release means (Target)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpubox.base import compat
from gpubox.config.fields import KeyFields


@dataclass(frozen=True)
class Problem:
    host: str
    key: str
    message: str
    severity: str = "error"  # or "warning"

    def __str__(self) -> str:
        return f"{self.host}: {self.key}: {self.message}"


class ConfigError(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid inventory ({len(problems)} problem(s)):\n{lines}")


@dataclass(frozen=True)
class HostConfig(KeyFields):
    """A host's validated config: each key's value as a typed attribute (``config.gpu_count``,
    from ``fields.py``, generated from the key table; an unknown name is a mypy error and an
    AttributeError), the catalog with the host's overrides, and the facts derived from them."""

    host: str
    values: dict[str, Any] = field(repr=False)
    catalog: dict[str, Any] = field(repr=False)

    # Derived facts, in one place.
    @property
    def gpu(self) -> compat.GpuModel:
        return compat.GPU_MODELS[self.gpu_model]

    @property
    def branch(self) -> int:
        return int(self.driver_branch)

    @property
    def cuda(self) -> dict[str, Any]:
        return dict(self.catalog["cuda"]["versions"][self.cuda_version])

    def driver_packages(self, family: str) -> DriverPackages:
        """The driver packages for an OS family, expanded from the catalog."""
        driver = self.catalog["driver"]
        branch, version = self.driver_branch, self.driver_version
        package_version = driver["branches"][branch]["package_version"][family]
        if version != driver["branches"][branch]["version"]:
            # An explicit driver_version: NVIDIA's version string keeps the catalog's suffix.
            package_version = f"{version}-{package_version.split('-', 1)[1]}"
        cuda_dash = self.cuda_version.replace(".", "-")

        def expand(names: list[str]) -> list[str]:
            return [n.format(branch=branch, version=version, cuda_dash=cuda_dash) for n in names]

        names = driver["packages"][family]
        flavour = self.driver_kernel_modules
        other = "open" if flavour == "proprietary" else "proprietary"
        return DriverPackages(
            installed=expand(names["common"] + names[flavour]),
            package_version=package_version,
            refused=expand(names[other]),
            forbidden=expand(driver["forbidden_packages"]),
        )


@dataclass(frozen=True)
class DriverPackages:
    installed: list[str]  # installed as name=package_version, pinned, held
    package_version: str
    refused: list[str]  # the other kernel module flavour: pinned away and removed
    forbidden: list[str]  # metas that drag in a driver of their own: removed


@dataclass(frozen=True)
class Target:
    """What the host's OS release means to gpubox."""

    os_id: str
    version_id: str
    distro: str  # NVIDIA's repository name: ubuntu2404, debian12
    family: str  # package naming: ubuntu (suffixed names) or debian (unsuffixed)

    @property
    def distro_origin(self) -> str:
        """The Origin of the distribution's own archive (apt preferences' o=)."""
        return "Ubuntu" if self.family == "ubuntu" else "Debian"


def target_for(os_release: Mapping[str, str], host_catalog: dict[str, Any]) -> Target | None:
    os_id = os_release.get("ID", "")
    version_id = os_release.get("VERSION_ID", "")
    entry = host_catalog["os"].get(f"{os_id}-{version_id}")
    if entry is None:
        return None
    return Target(os_id, version_id, entry["distro"], entry["family"])
