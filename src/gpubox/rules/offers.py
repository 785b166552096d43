"""What the configured apt repositories really offer, asked before anything changes.

Every package gpubox installs at an exact version (the driver, the CUDA toolkit, DCGM, the
container toolkit, Docker's packages) comes from a repository gpubox does not control, and a
catalog pin that the repository no longer carries used to surface as a failed `apt-get install`
halfway through a deploy. Preflight now asks the host's own apt which versions each repository
offers, and refuses the run, nothing changed, with one line per missing package naming the
versions offered and the catalog key to override.

How the host is asked: apt in a private root (its own source list with just that repository,
an empty dpkg status, its own lists under /var/cache/gpubox/apt-query/<repo>), so nothing of
the host's apt configuration changes and the system's package lists are untouched. The lists
are kept between runs, so a re-run costs apt's If-Modified-Since requests only. The query reads
the index with ``[trusted=yes]``: it only decides what to pin and whether to refuse; the
install itself goes through the signed-by keyring whose fingerprint the catalog pins. When the
repository cannot be reached and an earlier answer is cached, that answer is used with a
warning; with nothing cached the run is refused.

The driver is special: which packages make up NVIDIA's driver build is not known in advance
(Debian's packaging differs from Ubuntu's, and NVIDIA's set may change), so the answer for
NVIDIA's CUDA repository also lists every package offered at the driver's exact version; the
driver stage pins that set (gpubox.plans.driver).
Asked only when needed: gpubox.preflight.answers keeps the answers on the box.

This module is pure (the query's command, its parser, the pinned sets and what they miss); the
pyinfra fact that runs the query, ``RepoOffers``, is gpubox.preflight.answers'.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpubox.base import layout
from gpubox.config import HostConfig, Problem, Target
from gpubox.knowledge import apt_versions
from gpubox.rules import nccl
from gpubox.rules.apt_sources import placeholders


@dataclass
class RepoIndex:
    """One repository's answer: versions offered per package, warnings, or why it failed."""

    offers: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


def parse_query(lines: Iterable[str]) -> RepoIndex:
    """The query's output: ``P name version`` per package version, ``W text`` for a warning,
    ``E text`` when the repository could not be read at all."""
    index = RepoIndex()
    errors: list[str] = []
    for line in lines:
        kind, _, rest = line.strip().partition(" ")
        if kind == "P":
            name, _, version = rest.partition(" ")
            if name and version:
                versions = index.offers.setdefault(name, [])
                if version not in versions:
                    versions.append(version)
        elif kind == "W" and rest:
            index.warnings.append(rest)
        elif kind == "E" and rest:
            errors.append(rest)
    if errors:
        index.error = " ".join(errors)
    return index


def query_command(
    name: str,
    source_line: str,
    packages: Sequence[str],
    at_version: str,
    base: str = layout.APT_QUERY_DIR,
) -> str:
    """Shell that asks apt, in a private root, what the repository of ``source_line`` offers
    for ``packages`` (every version) and at ``at_version`` (every package)."""
    line = trusted_source_line(source_line)
    d = f"{base}/{name}"
    opts = " ".join(
        f"-o {o}"
        for o in (
            f"Dir::Etc::sourcelist={d}/sources.list",
            f"Dir::Etc::sourceparts={d}/parts",
            f"Dir::Etc::preferencesparts={d}/parts",
            f"Dir::State::Lists={d}/lists",
            f"Dir::State::status={d}/status",
            f"Dir::Cache={d}/cache",
            "APT::Sandbox::User=root",
            "Debug::NoLocking=1",
            "Acquire::Languages=none",
        )
    )
    want = " " + " ".join(packages) + " "
    awk = (
        "/^Package:/{p=$2} /^Version:/{v=$2} "
        '/^$/{if(p!=""&&(index(w," "p" ")||v==at))print "P",p,v; p="";v=""} '
        'END{if(p!=""&&(index(w," "p" ")||v==at))print "P",p,v}'
    )
    return (
        f"# gpubox-apt-query {name}\n"
        f'd={shlex.quote(d)}; mkdir -p "$d/lists/partial" "$d/parts" "$d/cache/archives/partial" '
        f'&& : > "$d/status" && printf "%s\\n" {shlex.quote(line)} > "$d/sources.list" '
        '|| { echo "E cannot write $d"; exit 0; }\n'
        f"err=$(apt-get {opts} -q update 2>&1 >/dev/null); rc=$?\n"
        'bad=$(printf "%s\\n" "$err" | grep -E "^(E:|W: Failed to fetch|Err:)" | head -n 3)\n'
        'if [ $rc -ne 0 ] || [ -n "$bad" ]; then\n'
        '  msg=$(printf "%s" "${bad:-$err}" | tr "\\n" " " | cut -c1-400)\n'
        '  if ls "$d"/lists/*Packages* >/dev/null 2>&1; then echo "W apt update failed, using '
        'the answer cached by an earlier run: $msg"; else echo "E $msg"; exit 0; fi\n'
        "fi\n"
        'for f in "$d"/lists/*Packages*; do [ -f "$f" ] || continue; '
        '/usr/lib/apt/apt-helper cat-file "$f" 2>/dev/null; echo; done | '
        f"awk -v w={shlex.quote(want)} -v at={shlex.quote(at_version)} {shlex.quote(awk)}\n"
        "exit 0"
    )


def trusted_source_line(source_line: str) -> str:
    """The catalog's source line with its signed-by option replaced by trusted=yes."""
    words = source_line.strip().split()
    if len(words) > 1 and words[1].startswith("[") and words[1].endswith("]"):
        words[1] = "[trusted=yes]"
    else:
        words.insert(1, "[trusted=yes]")
    return " ".join(words)


@dataclass(frozen=True)
class PinnedSet:
    """Packages one stage installs at exact versions from one repository."""

    stage: str
    repo: str  # catalog repos.<name>
    packages: Mapping[
        str, str
    ]  # name -> exact version, or a pattern (gpubox.knowledge.apt_versions)
    catalog_key: str  # what to override (catalog_overrides dotted path, or a config key)


def pinned_sets(
    config: HostConfig, target: Target, docker_engine: dict[str, Any]
) -> list[PinnedSet]:
    """Every exact-version package set the deploy installs on this host, except the driver's
    (gpubox.plans.driver resolves that one from the repository's answer)."""
    cat = config.catalog
    cuda = config.cuda
    sets = [
        PinnedSet(
            "cuda",
            "nvidia_cuda",
            {cuda["package"]: cuda["package_version"]},
            f"catalog_overrides 'cuda.versions.{config.cuda_version}.package_version'",
        ),
        PinnedSet(
            "dcgm",
            "nvidia_cuda",
            {name: cat["dcgm"]["version"] for name in cat["dcgm"]["packages"]},
            "catalog_overrides 'dcgm.version'",
        ),
        PinnedSet(
            "container_toolkit",
            "nvidia_container_toolkit",
            {
                name: cat["container_toolkit"]["version"]
                for name in cat["container_toolkit"]["packages"]
            },
            "catalog_overrides 'container_toolkit.version'",
        ),
    ]
    if nccl.wanted(config):
        # a pattern (gpubox.rules.nccl): the repository must offer a version that matches it
        pattern = nccl.pin(config)
        sets.append(
            PinnedSet(
                "nccl",
                "nvidia_cuda",
                dict.fromkeys(nccl.PACKAGES, pattern),
                nccl.catalog_key(config),
            )
        )
    kept = (
        config.docker_keep_existing and docker_engine.get("binary") and docker_engine.get("active")
    )
    if config.docker_source == "docker" and not kept:
        values = placeholders(target)
        sets.append(
            PinnedSet(
                "docker",
                "docker",
                {n: v.format(**values) for n, v in cat["docker"]["packages"].items()},
                "catalog_overrides 'docker.packages.<name>'",
            )
        )
    return sets


def missing(
    config: HostConfig, sets: Sequence[PinnedSet], indexes: Mapping[str, RepoIndex]
) -> list[Problem]:
    """Pure: a problem per package whose exact version the repository does not offer, and per
    repository that could not be read."""
    problems: list[Problem] = []
    unreadable: set[str] = set()
    for pinned in sets:
        index = indexes[pinned.repo]
        if index.error is not None:
            if pinned.repo not in unreadable:
                unreadable.add(pinned.repo)
                problems.append(
                    Problem(
                        config.host,
                        f"repos.{pinned.repo}",
                        f"cannot read the repository ({index.error}); check the URL "
                        f"(catalog_overrides 'repos.{pinned.repo}.url' for a mirror) and the "
                        "box's network",
                    )
                )
            continue
        for name, version in pinned.packages.items():
            offered = index.offers.get(name, [])
            if apt_versions.satisfies(version, offered):
                continue
            have = ", ".join(offered[-6:]) if offered else "none: the package is not there"
            problems.append(
                Problem(
                    config.host,
                    pinned.stage,
                    f"repos.{pinned.repo} does not offer {name}={version} (offered: {have}); "
                    f"pin one it offers with {pinned.catalog_key}",
                )
            )
    return problems
