"""apt's real resolver in a private apt root: no box, no network, no root.

Repositories are ``file:`` directories (flat, ``[trusted=yes]``) with a Release file made by
apt-ftparchive, so apt sees each one's Origin, Label and Suite as it would on a host. The dpkg
status file, the sources, the preferences and every cache live under one temporary directory;
apt's configuration on this machine (``/etc/apt``) is never read. ``apt-get -s`` answers what a
command would install or remove.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpubox.parsers import apt as deb822
from gpubox.parsers import parse_apt_policy

# Fields of an index stanza that a dpkg status stanza does not carry.
_INDEX_ONLY = re.compile(
    r"^(Filename|Size|MD5sum|SHA1|SHA256|SHA512|Description-md5|X-Recorded-From|Origin|Bugs)$"
)


class Stanza(deb822.Stanza):
    """One package stanza: ``gpubox.parsers.apt``'s (its fields in order, continuation lines
    kept in the value), with what the resolver tier asks of a package."""

    @classmethod
    def parse(cls, text: str) -> Stanza:
        """The one stanza of ``text``."""
        (stanza,) = deb822.parse_stanzas(text)
        return cls(stanza.fields)

    @property
    def package(self) -> str:
        return self.get("Package", "")

    @property
    def version(self) -> str:
        return self.get("Version", "")

    @property
    def source(self) -> str:
        """The source package's name (the binary's own name when the stanza has none)."""
        return self.get("Source", self.package).split(" ")[0]

    def replace(self, **values: str | None) -> Stanza:
        """A copy with fields set (``Field_Name`` for ``Field-Name``) or, with None, dropped;
        new fields go at the end."""
        wanted = {k.replace("_", "-"): v for k, v in values.items()}
        out = [(k, wanted.get(k, v)) for k, v in self.fields]
        out += [(k, v) for k, v in wanted.items() if k not in dict(self.fields)]
        return Stanza(tuple((k, v) for k, v in out if v is not None))

    def as_installed(self, status: str = "install ok installed") -> Stanza:
        kept = [(k, v) for k, v in self.fields if not _INDEX_ONLY.match(k)]
        return Stanza((kept[0], ("Status", status), *kept[1:]))


def read_stanzas(text: str) -> list[Stanza]:
    """The stanzas of a Packages file; ``#`` comment lines (the recording's header) dropped,
    apt does not read them in an index."""
    return [Stanza(s.fields) for s in deb822.parse_stanzas(text)]


@dataclass(frozen=True)
class Repo:
    """A flat apt repository: its Release fields and its packages."""

    name: str
    origin: str
    label: str
    suite: str
    stanzas: tuple[Stanza, ...]
    not_automatic: bool = False  # backports: installed only when asked for


@dataclass(frozen=True)
class Action:
    """One line of ``apt-get -s``: Inst or Remv (Conf lines are not kept)."""

    kind: str  # "Inst" or "Remv"
    package: str
    version: str  # the new version (Inst) or the removed one (Remv)
    old: str  # Inst over an installed version: that version


# Inst name [old] (new Origin:Suite [arch]) ; Remv name [old]
_ACTION = re.compile(r"^(Inst|Remv) (\S+)(?: \[([^\]]+)\])?(?: \((\S+)[^)]*\))?")


@dataclass(repr=False)
class Result:
    command: list[str]
    returncode: int
    output: str
    actions: list[Action] = field(default_factory=list)

    @property
    def installs(self) -> dict[str, str]:
        return {a.package: a.version for a in self.actions if a.kind == "Inst"}

    @property
    def removes(self) -> set[str]:
        return {a.package for a in self.actions if a.kind == "Remv"}

    def __repr__(self) -> str:  # what a failed assertion shows: the command and apt's answer
        return f"\n$ {' '.join(self.command)}\n(exit {self.returncode})\n{self.output}"


class AptRoot:
    """A private apt root under ``path``; ``update`` once after the repositories are set."""

    def __init__(self, path: Path, arch: str = "amd64"):
        for tool in ("apt-get", "apt-ftparchive"):
            if shutil.which(tool) is None:
                raise RuntimeError(
                    f"the resolver tier needs {tool} on this machine "
                    "(apt and apt-utils: make host-packages)"
                )
        self.path = path
        self.arch = arch
        self.repos: dict[str, Repo] = {}
        for sub in ("repos", "lists/partial", "cache/archives/partial", "prefs", "parts", "empty"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        self.status_file = path / "status"
        self.status_file.write_text("")
        (path / "extended_states").write_text("")
        # Read first (APT_CONFIG): keeps the machine's own /etc/apt configuration out.
        (path / "apt.conf").write_text(
            f'Dir::Etc::parts "{path}/parts";\nDir::Etc::main "/dev/null";\n'
        )

    # -- the world ------------------------------------------------------------------------

    def add_repo(self, repo: Repo) -> None:
        where = self.path / "repos" / repo.name
        where.mkdir(parents=True, exist_ok=True)
        (where / "Packages").write_text(deb822.format_stanzas(repo.stanzas))
        options = {
            "Origin": repo.origin,
            "Label": repo.label,
            "Suite": repo.suite,
            "Codename": repo.suite,
            "Architectures": f"{self.arch} all",
        }
        if repo.not_automatic:
            options.update(NotAutomatic="yes", ButAutomaticUpgrades="yes")
        args = [f"-oAPT::FTPArchive::Release::{k}={v}" for k, v in options.items()]
        release = subprocess.run(
            ["apt-ftparchive", *args, "release", "."],
            cwd=where,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (where / "Release").write_text(release)
        self.repos[repo.name] = repo

    def set_status(self, stanzas: Iterable[Stanza]) -> None:
        self.status_file.write_text(deb822.format_stanzas(stanzas))

    def status(self) -> list[Stanza]:
        return read_stanzas(self.status_file.read_text())

    def set_pin(self, text: str | None) -> None:
        """The one preferences file (None: no preferences at all)."""
        for old in (self.path / "prefs").iterdir():
            old.unlink()
        if text is not None:
            (self.path / "prefs" / "90-gpubox-nvidia-driver").write_text(text)

    def options(self) -> list[str]:
        p = self.path
        sources = p / "sources.list"
        return [
            f"-oDir::State::status={self.status_file}",
            f"-oDir::State::extended_states={p}/extended_states",
            f"-oDir::State::Lists={p}/lists",
            f"-oDir::Cache={p}/cache",
            f"-oDir::Etc::sourcelist={sources}",
            f"-oDir::Etc::sourceparts={p}/empty",
            "-oDir::Etc::preferences=/dev/null",
            f"-oDir::Etc::preferencesparts={p}/prefs",
            f"-oDir::Etc::trustedparts={p}/empty",
            "-oDebug::NoLocking=1",
            f"-oAPT::Architecture={self.arch}",
            f"-oAPT::Architectures::={self.arch}",
            "-oAPT::Get::List-Cleanup=0",
            "-oAcquire::Languages=none",
            "-oAPT::Sandbox::User=root",  # file: repositories under a private temporary dir
        ]

    def _run(self, args: Sequence[str]) -> Result:
        command = ["apt-get", "-q", *self.options(), *args]
        env = {
            **os.environ,
            "APT_CONFIG": str(self.path / "apt.conf"),
            "LC_ALL": "C",
            "DEBIAN_FRONTEND": "noninteractive",
        }
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        output = done.stdout + done.stderr
        actions = [
            Action(m[1], m[2], m[4] or m[3] or "", m[3] or "")
            for m in (_ACTION.match(line) for line in done.stdout.splitlines())
            if m
        ]
        shown = ["apt-get", "-s", *args[1:]] if args[:1] == ["-s"] else ["apt-get", *args]
        return Result(shown, done.returncode, output, actions)

    def update(self) -> None:
        lines = [
            f"deb [trusted=yes] file:{self.path / 'repos' / name}/ ./\n" for name in self.repos
        ]
        (self.path / "sources.list").write_text("".join(lines))
        done = self._run(["update"])
        if done.returncode != 0 or re.search(r"^(W|E):", done.output, re.M):
            raise RuntimeError(f"apt-get update failed in the private root:{done!r}")

    def policy(self, *packages: str) -> dict[str, dict[str, int]]:
        """``apt-cache policy``: each package's versions and the pin priority apt gives each."""
        command = ["apt-cache", *self.options(), "policy", *packages]
        env = {**os.environ, "APT_CONFIG": str(self.path / "apt.conf"), "LC_ALL": "C"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"apt-cache policy failed:\n{done.stdout}{done.stderr}")
        return {
            name: {v.version: v.priority for v in policy.versions}
            for name, policy in parse_apt_policy(done.stdout).items()
        }

    def simulate(self, *args: str) -> Result:
        """``apt-get -s ARGS`` (answers yes; nothing is installed anywhere)."""
        return self._run(["-s", "-y", *args])

    def find(self, package: str, version: str) -> tuple[Repo, Stanza]:
        """The repository stanza apt installs for package=version (exactly one must match)."""
        hits = [
            (repo, s)
            for repo in self.repos.values()
            for s in repo.stanzas
            if s.package == package and s.version == version
        ]
        if not hits or len({repo.origin for repo, _ in hits}) > 1:
            where = [repo.name for repo, _ in hits]
            raise AssertionError(f"{package}={version} is in {len(hits)} repositories: {where}")
        return hits[0]

    def apply(self, result: Result) -> None:
        """Write a simulated run's outcome into the private dpkg status file, as dpkg would
        leave it: each Inst'd package's control fields (from the stanza apt chose) replace any
        installed version, each Remv'd package leaves."""
        if result.returncode != 0:
            raise AssertionError(f"cannot apply a failed run:{result!r}")
        status = {s.package: s for s in self.status()}
        for action in result.actions:
            if action.kind == "Remv":
                status.pop(action.package, None)
            else:
                _, stanza = self.find(action.package, action.version)
                status[action.package] = stanza.as_installed()
        self.set_status(status.values())
