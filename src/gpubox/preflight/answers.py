"""The repositories' answers in a run (gpubox.rules.offers asks): kept from an earlier run where
they change nothing, asked otherwise.

Asked only when needed. The answers are kept on the box (layout.KEPT_OFFERS, root-only, each
under the digest of its question: the repository's source line, so its URL, the packages
asked and the driver's version), and a repository is asked again only when its kept answer
could not stand for a new one: no answer kept, the file unreadable, the question changed (a
mirror URL, a catalog pin, the driver version or flavour), a package from it to install or
change (not installed at its pin), or, for NVIDIA's CUDA repository, the driver's pin file or
unattended-upgrades blacklist computed from the kept answer not the one on the box. So a kept
answer is used only where it changes nothing: it can never write a pin of its own. The file
is written by an operation at the end of the first stage, so a refused run leaves it as it was.
(A package NVIDIA adds later at the same driver version is picked up the next time something
from the repository changes; removing the file makes the next run ask.)
"""

from __future__ import annotations

import hashlib
import json
import shlex
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import files

from gpubox.base import layout
from gpubox.base.rendering import as_file
from gpubox.config import HostConfig, Target
from gpubox.infra.host_facts import read_once
from gpubox.knowledge import apt_versions
from gpubox.plans import driver as driver_plan
from gpubox.plans import driver_move
from gpubox.preflight import driver_kept
from gpubox.rules.apt_sources import source_line
from gpubox.rules.offers import (
    PinnedSet,
    RepoIndex,
    parse_query,
    pinned_sets,
    query_command,
    trusted_source_line,
)


class RepoOffers(FactBase[RepoIndex]):
    """What one apt repository offers (gpubox.rules.offers' query, in a private apt root); read-only
    for the host's apt: only /var/cache/gpubox/apt-query/<name> is written."""

    readahead = False  # it asks the repository (apt-get update): never read ahead

    def command(  # type: ignore[override]
        self, repo: str, source_line: str, packages: tuple[str, ...], at_version: str = ""
    ) -> str:
        return query_command(repo, source_line, packages, at_version)

    def process(self, output: list[str]) -> RepoIndex:
        return parse_query(output)


KEPT_FORMAT = 1  # the kept file's layout; another one is not read (every repository asked)


@dataclass(frozen=True)
class Question:
    """What the host's apt is asked about one repository."""

    repo: str
    source_line: str
    packages: tuple[str, ...]
    at_version: str

    @property
    def key(self) -> str:
        """The digest a kept answer is filed under: another URL, suite, package list or
        driver version is another question."""
        text = json.dumps(
            [
                KEPT_FORMAT,
                self.repo,
                trusted_source_line(self.source_line),
                self.packages,
                self.at_version,
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()


def questions(config: HostConfig, target: Target, sets: Sequence[PinnedSet]) -> list[Question]:
    """One question per repository the pinned sets and the driver need."""
    driver = config.driver_packages(target.family)
    wanted: dict[str, set[str]] = {"nvidia_cuda": set(driver.installed + driver.refused)}
    for pinned in sets:
        wanted.setdefault(pinned.repo, set()).update(pinned.packages)
    at_version = {"nvidia_cuda": driver.package_version}
    return [
        Question(
            repo,
            source_line(config, repo, target),
            tuple(sorted(names)),
            at_version.get(repo, ""),
        )
        for repo, names in wanted.items()
    ]


@dataclass
class Kept:
    """What the box keeps: the answers by repository ({"key", "offers"}), the sha256 of the
    driver's pin file and blacklist (None when absent), the file's text, and why it cannot be
    used (None when it can, or when there is none)."""

    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    digests: dict[str, str | None] = field(default_factory=dict)
    text: str | None = None
    problem: str | None = None


def parse_kept(lines: Iterable[str]) -> Kept:
    """KeptOffers' output: ``D path sha256`` per file present, then ``K`` and the kept file."""
    kept = Kept(digests={layout.DRIVER_PIN: None, layout.UNATTENDED_BLACKLIST: None})
    body: list[str] | None = None
    for line in lines:
        if body is not None:
            body.append(line)
        elif line.startswith("D "):
            _, path, digest = line.rsplit(" ", 2) if line.count(" ") >= 2 else ("", "", "")
            if path:
                kept.digests[path] = digest
        elif line.strip() == "K":
            body = []
    if body is None:
        return kept
    kept.text = "\n".join(body).strip()
    try:
        data = json.loads(kept.text)
        if not isinstance(data, dict) or data.get("format") != KEPT_FORMAT:
            raise ValueError(f"not format {KEPT_FORMAT}")
        repos = data["repos"]
        for name, entry in repos.items():
            offers = entry["offers"]
            if not isinstance(entry["key"], str) or not all(
                isinstance(v, list) and all(isinstance(x, str) for x in v) for v in offers.values()
            ):
                raise ValueError(f"repos.{name} malformed")
        kept.answers = repos
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        kept.problem = f"the kept answers are unreadable ({str(exc)[:80]})"
    return kept


class KeptOffers(FactBase[Kept]):
    """The repositories' kept answers and the digests of the files computed from them."""

    def command(self) -> str:
        paths = " ".join(shlex.quote(p) for p in (layout.DRIVER_PIN, layout.UNATTENDED_BLACKLIST))
        f = shlex.quote(layout.KEPT_OFFERS)
        return (
            "# gpubox-kept-offers\n"
            f'for p in {paths}; do [ -f "$p" ] && '
            'printf \'D %s %s\\n\' "$p" "$(sha256sum -- "$p" | cut -d\' \' -f1)"; done; '
            f"if [ -f {f} ]; then echo K; cat {f}; echo; fi; true"
        )

    @staticmethod
    def default() -> Kept:
        return Kept()

    def process(self, output: list[str]) -> Kept:
        return parse_kept(output)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def reasons_to_ask(
    config: HostConfig,
    target: Target,
    sets: Sequence[PinnedSet],
    asked: Sequence[Question],
    kept: Kept,
    installed: Mapping[str, Sequence[str]],
    kept_driver: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, str | None]:
    """Pure: per repository, why it must be asked (None: its kept answer changes nothing).
    ``kept_driver``: what the box's kept build of the pinned driver offers
    (gpubox.plans.driver_move), counted with NVIDIA's repository's answer."""
    reasons: dict[str, str | None] = {}
    for question in asked:
        entry = kept.answers.get(question.repo)
        if entry is not None and question.repo == "nvidia_cuda" and kept_driver:
            offers = driver_move.merge_offers(entry["offers"], kept_driver)
            entry = {**entry, "offers": offers}
        reasons[question.repo] = _reason(
            config, target, sets, question, kept, entry, installed, driver_plan
        )
    return reasons


def _reason(
    config: HostConfig,
    target: Target,
    sets: Sequence[PinnedSet],
    question: Question,
    kept: Kept,
    entry: dict[str, Any] | None,
    installed: Mapping[str, Sequence[str]],
    driver_plan: Any,
) -> str | None:
    if kept.problem:
        return kept.problem
    if entry is None:
        return "no answer kept"
    if entry["key"] != question.key:
        return "another question (source line, packages or driver version changed)"
    offered: Mapping[str, Sequence[str]] = entry["offers"]
    for pinned in sets:
        if pinned.repo != question.repo:
            continue
        for name, version in pinned.packages.items():
            # a pin may be a pattern (NCCL's "*+cuda12.8"): any matching version counts
            if not apt_versions.satisfies(version, installed.get(name, ())):
                return f"{name}={version} to install"
            if not apt_versions.satisfies(version, offered.get(name, ())):
                return f"the kept answer lacks {name}={version}"
    if question.repo == "nvidia_cuda":
        try:
            plan = driver_plan.plan(config, target, offered)
        except driver_plan.DriverUnavailable:
            return "the kept answer lacks a driver package"
        for name in plan.install:
            if plan.package_version not in installed.get(name, ()):
                return f"{name}={plan.package_version} to install"
        for path, text in (
            (layout.DRIVER_PIN, plan.pin),
            (layout.UNATTENDED_BLACKLIST, plan.unattended),
        ):
            if kept.digests.get(path) != _sha256(text):
                return f"{path} is not the one the kept answer gives"
    return None


def to_keep(kept: Kept, asked: Sequence[Question], indexes: Mapping[str, RepoIndex]) -> str | None:
    """The kept file's new text, None when it stays as it is: each answer asked without an
    error or a warning (a warning: apt's lists of an earlier run) replaces the kept one."""
    repos = {} if kept.problem else dict(kept.answers)
    for question in asked:
        index = indexes[question.repo]
        entry = {"key": question.key, "offers": index.offers}
        if index.error is None and not index.warnings and repos.get(question.repo) != entry:
            repos[question.repo] = entry
    text = json.dumps({"format": KEPT_FORMAT, "repos": repos}, sort_keys=True)
    return None if text == kept.text else text


# Per run and host: the repositories' answers (preflight asks once; the driver stage reads).
_answers: weakref.WeakKeyDictionary[Any, dict[str, dict[str, RepoIndex]]] = (
    weakref.WeakKeyDictionary()
)
# Per run and host: the kept file's new text (None: unchanged), written by keep_answers.
_kept: weakref.WeakKeyDictionary[Any, dict[str, str | None]] = weakref.WeakKeyDictionary()


def ask(
    config: HostConfig, target: Target, docker_engine: dict[str, Any]
) -> tuple[list[PinnedSet], dict[str, RepoIndex]]:
    """The current host's answer for every repository the pinned sets and the driver need:
    kept from an earlier run where it changes nothing (``reasons_to_ask``), asked otherwise."""
    sets = pinned_sets(config, target, docker_engine)
    asked = questions(config, target, sets)
    kept = read_once(KeptOffers)  # preflight read it with its other facts (prefetch)
    kept_driver = driver_kept.kept_offers(config, target)
    reasons = reasons_to_ask(
        config, target, sets, asked, kept, host.get_fact(DebPackages), kept_driver
    )
    indexes: dict[str, RepoIndex] = {}
    for question in asked:
        reason = reasons[question.repo]
        if reason is None:
            offered = kept.answers[question.repo]["offers"]
            indexes[question.repo] = RepoIndex(offers={k: list(v) for k, v in offered.items()})
            continue
        logger.debug(f"{config.host}: repos.{question.repo}: asking it ({reason})")
        indexes[question.repo] = host.get_fact(
            RepoOffers,
            repo=question.repo,
            source_line=question.source_line,
            packages=question.packages,
            at_version=question.at_version,
        )
    _kept.setdefault(host.state, {})[host.name] = to_keep(kept, asked, indexes)
    cuda = indexes.get("nvidia_cuda")
    if kept_driver and cuda is not None and cuda.error is None:
        # the kept build of the pinned driver counts as offered (the way back, when NVIDIA's
        # repository dropped it); never written into the kept answers
        indexes["nvidia_cuda"] = RepoIndex(
            offers=driver_move.merge_offers(cuda.offers, kept_driver), warnings=cuda.warnings
        )
    _answers.setdefault(host.state, {})[host.name] = indexes
    return sets, indexes


def keep_answers() -> None:
    """Add the operation that keeps this run's answers on the box, when they differ from the
    kept ones: once per run, at the end of the first stage that calls it (the stages that
    install from these repositories do). A refused run never gets there and writes nothing;
    a stage's own first operations (a runfile's uninstall, the desktop's warnings) come first."""
    text = _kept.get(host.state, {}).pop(host.name, None)
    if text is None:
        return
    files.put(
        name="Keep the repositories' answers (asked again only when needed)",
        src=as_file(text),
        dest=layout.KEPT_OFFERS,
        mode="0600",
    )


def answer(repo: str) -> RepoIndex:
    """The current host's answer for ``repo`` in this run (asked by preflight, or kept)."""
    return _answers[host.state][host.name][repo]
