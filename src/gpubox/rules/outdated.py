"""What `gpubox outdated` lists: for every pin of a host, what the box's own repositories offer
that is newer in the same line.

Pure: the pins come from the host's configuration (the driver's roots and the exactly pinned
sets of gpubox.rules.offers, the same the deploy's preflight asks about), the offers from the
deploy's own repository query (``offers.query_command``, parsed by ``offers.parse_query``),
the installed versions from dpkg. The versions are ordered by dpkg's rules
(gpubox.knowledge.apt_versions).

A line is what a newer version may differ in without being another release of the component
(``LINE_PARTS``: how many leading numbers of the upstream version, with the epoch, stay the
same):

- the driver: its branch (570.x: NVIDIA's fixes within a branch; another branch is a move,
  issue 30 B);
- CUDA: its minor release (12.8.x: cuda-toolkit-12-8's updates; 12.9 is another package);
- the container toolkit: its minor release (1.17.x: NVIDIA's fixes; a minor release changes
  defaults, 1.18 made CDI the default mode);
- DCGM: its major release (4.x: the datacenter-gpu-manager-4-* packages);
- Docker's packages: each one's major release (docker-ce 28.x, containerd.io 1.x);
- NCCL: its pin is a pattern ("*+cuda12.8"), and the pattern is its line.

The images (the DCGM exporter's, vLLM's, Grafana's) are not asked: gpubox has no registry
client, and the box's `docker pull` would change the box. Their rows say so.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpubox.config import HostConfig, Target
from gpubox.knowledge import apt_versions
from gpubox.rules import driver_lifecycle
from gpubox.rules.offers import RepoIndex, pinned_sets

# How many leading numbers of a version make its line, per component (a pattern pin: 0).
LINE_PARTS = {"driver": 1, "cuda": 2, "container_toolkit": 2, "dcgm": 1, "docker": 1, "nccl": 0}

CURRENT, BEHIND, NOT_OFFERED, UNKNOWN, NOT_ASKED, UNREACHABLE = (
    "current",
    "behind",
    "not offered",
    "unknown",
    "not asked",
    "unreachable",
)
# The statuses that make `gpubox outdated` exit 1 (unreachable: 3; not asked: 0).
STALE = (BEHIND, NOT_OFFERED, UNKNOWN)

NO_REGISTRY = (
    "not asked: gpubox has no registry client, and `docker pull` on the box would change it "
    "(docs/tools.md, gpubox outdated)"
)


@dataclass(frozen=True)
class Component:
    """One pin of a host: packages installed together at one version from one repository
    (``repo``: catalog repos.<name>), or an image (``repo`` None)."""

    name: str  # driver, cuda, container_toolkit, dcgm, nccl, docker, dcgm_exporter, vllm, grafana
    repo: str | None
    packages: tuple[str, ...]  # the first names the row; an image: its reference
    pinned: str  # an exact version, a pattern (NCCL), or an image reference
    # the packages whose versions make the component's offers (all of them but a root named
    # after its own version, nvidia-firmware-570-570.211.01, offered at that version only)
    compared: tuple[str, ...] = ()

    @property
    def parts(self) -> int:
        return LINE_PARTS.get(self.name, 0)

    @property
    def line(self) -> str:
        """The line in words: "570.x", "12.8.x", "*+cuda12.8"; "" for an image."""
        if self.repo is None:
            return ""
        if apt_versions.is_pattern(self.pinned):
            return self.pinned
        found = apt_versions.line(self.pinned, self.parts)
        return ".".join(map(str, found[1])) + ".x" if found else self.pinned


@dataclass(frozen=True)
class Row:
    """One line of `gpubox outdated` (its JSON object, ``as_json``)."""

    host: str
    component: str
    package: str | None
    line: str
    pinned: str | None
    installed: str | None
    newest: str | None  # the newest version the repository offers in the line
    status: str  # CURRENT, BEHIND, NOT_OFFERED, UNKNOWN, NOT_ASKED or UNREACHABLE
    detail: str  # why, where the status needs it ("" otherwise)
    note: str  # the lifecycle note (``lifecycle_note``), "" when there is none

    @property
    def stale(self) -> bool:
        return self.status in STALE

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def components(config: HostConfig, target: Target) -> list[Component]:
    """Every pin of the host, in the deploy's order: the driver, then the exactly pinned sets
    the deploy's preflight asks about (gpubox.rules.offers.pinned_sets: CUDA, DCGM, the
    container toolkit, NCCL where the box gets it, Docker's packages one by one where they come
    from Docker's repository), then the images the box runs."""
    driver = config.driver_packages(target.family)
    found = [
        Component(
            "driver",
            "nvidia_cuda",
            tuple(driver.installed),
            driver.package_version,
            tuple(n for n in driver.installed if config.driver_version not in n),
        )
    ]
    # {}: the Docker engine is not read, so Docker's packages are listed whenever
    # docker_source is "docker" (docker_keep_existing's kept engine too: docs/tools.md)
    for pinned in pinned_sets(config, target, {}):
        versions = dict(pinned.packages)
        if pinned.stage == "docker":
            found += [
                Component("docker", pinned.repo, (name,), version, (name,))
                for name, version in versions.items()
            ]
            continue
        names = tuple(versions)
        found.append(Component(pinned.stage, pinned.repo, names, versions[names[0]], names))
    if config.dcgm_exporter:
        image = config.catalog["dcgm"]["exporter_image"]
        found.append(Component("dcgm_exporter", None, (image,), image))
    if config.backend == "vllm":
        image = config.catalog["vllm"]["image"]
        found.append(Component("vllm", None, (image,), image))
    if config.grafana:
        image = config.catalog["grafana"]["image"]
        found.append(Component("grafana", None, (image,), image))
    return found


def asked(found: Sequence[Component]) -> dict[str, tuple[str, ...]]:
    """The packages to ask each repository about (the query's names; every version of each)."""
    names: dict[str, set[str]] = {}
    for component in found:
        if component.repo is not None:
            names.setdefault(component.repo, set()).update(component.packages)
    return {repo: tuple(sorted(packages)) for repo, packages in names.items()}


def offered_together(component: Component, index: RepoIndex) -> list[str]:
    """The versions the repository offers for every one of the component's packages (they are
    installed together at one version)."""
    sets = [set(index.offers.get(name, ())) for name in component.compared]
    return sorted(set.intersection(*sets)) if sets else []


def installed_version(component: Component, installed: Mapping[str, str]) -> tuple[str | None, str]:
    """The component's installed version (the lowest where its packages differ) and, where
    they differ, what each is at."""
    versions = {name: installed[name] for name in component.packages if name in installed}
    if not versions:
        return None, ""
    lowest = min(versions.values(), key=_Key)
    if len(set(versions.values())) == 1:
        return lowest, ""
    return lowest, "installed at several versions: " + ", ".join(
        f"{name} {version}" for name, version in versions.items()
    )


class _Key:
    """A version as a sort key, in dpkg's order."""

    def __init__(self, version: str) -> None:
        self.version = version

    def __lt__(self, other: _Key) -> bool:
        return apt_versions.compare(self.version, other.version) < 0


def judge(
    host: str,
    config: HostConfig,
    component: Component,
    index: RepoIndex | None,
    installed: Mapping[str, str],
    today: datetime.date,
) -> Row:
    """The component's row: the newest version of its line the repository offers, against the
    installed version (the pin when nothing is installed)."""
    note = lifecycle_note(config, component, today)
    package = component.packages[0]
    if component.repo is None:
        return Row(
            host, component.name, package, "", component.pinned, None, None, NOT_ASKED,
            NO_REGISTRY, note,
        )  # fmt: skip
    have, detail = installed_version(component, installed)
    if index is None or index.error is not None:
        why = index.error if index is not None else "not asked"
        return Row(
            host, component.name, package, component.line, component.pinned, have, None,
            UNKNOWN, f"cannot read repos.{component.repo}: {why}", note,
        )  # fmt: skip
    notes = [detail] if detail else []
    notes += [f"repos.{component.repo}: {warning}" for warning in index.warnings]
    newest = apt_versions.newest_in_line(
        offered_together(component, index), component.pinned, component.parts
    )
    basis = have or (None if apt_versions.is_pattern(component.pinned) else component.pinned)
    if newest is None:
        status = NOT_OFFERED
        notes.insert(0, f"repos.{component.repo} offers nothing of {component.line}")
    elif basis is not None and apt_versions.compare(newest, basis) > 0:
        status = BEHIND
    else:
        status = CURRENT
    if have is None:
        notes.append("not installed")
    return Row(
        host, component.name, package, component.line, component.pinned, have, newest, status,
        "; ".join(notes), note,
    )  # fmt: skip


def rows(
    host: str,
    config: HostConfig,
    target: Target,
    indexes: Mapping[str, RepoIndex],
    installed: Mapping[str, str],
    today: datetime.date,
) -> list[Row]:
    """Every pin's row for one host (``indexes``: each repository's answer to ``asked``;
    ``installed``: the versions dpkg has installed, by package)."""
    return [
        judge(host, config, c, indexes.get(c.repo) if c.repo else None, installed, today)
        for c in components(config, target)
    ]


def lifecycle_note(config: HostConfig, component: Component, today: datetime.date) -> str:
    """The row's note: for the driver, the lifecycle note on the host's branch (past its end
    of life or within six months of it, and the branch to move to for the host's GPUs: the
    same words `gpubox check` and doctor print); empty for every other component."""
    if component.name != "driver":
        return ""
    found = driver_lifecycle.host_note(config, today)
    return "" if found is None else found.text


def host_row(host: str, status: str, detail: str) -> Row:
    """A row for the whole host: it cannot be reached (UNREACHABLE), or not read (UNKNOWN)."""
    return Row(host, "host", None, "", None, None, None, status, detail, "")
