"""Debian's real NVIDIA driver packages: the source of truth for the sandbox's stand-ins.

The stand-in NVIDIA debian12 repository (repo.py) derives its driver packages from Debian 12's
own binary packages, so that what the deploy meets in the box (dependencies on Debian's support
packages, maintainer scripts, conffiles, alternatives, the ``nvpd`` user, DKMS) is Debian's
real packaging rather than a second copy of the product's assumptions. STANDINS.md lists what is
real, what is a stand-in and what is guessed, package by package.

This module fetches those packages with apt, in a private apt root under the sandbox cache
(``<cache dir>/debian-real``), from the Debian mirror the box uses (``common.debian_mirror()``)
and the host's bookworm-security source, with components main contrib non-free
non-free-firmware. It downloads only what the driver install touches (``REAL_SOURCES``); the
other binaries of the same sources are kept as index stanzas (metadata-only stand-ins). Once the
cache is complete nothing here touches the network again. debfile.py reads each downloaded
``.deb``; ``gpubox.parsers.apt`` reads the index stanzas and control files.

It also holds what the derivation (repo.py) uses: the version rewrite (535 build -> stand-in
version) and an apt simulation against Debian's index in a private apt root.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.parsers import Stanza, parse_stanzas
from gpubox.sandbox import common
from gpubox.sandbox.debfile import Entry, read_deb

SUITE = "bookworm"
COMPONENTS = "main contrib non-free non-free-firmware"
# Bump when the cache layout or the extraction (debfile.py) changes.
CACHE_FORMAT = 1

Progress = Callable[[str], None]


class RealError(RuntimeError):
    """Debian's real packages could not be fetched or read; the message says what to do."""


@dataclass(frozen=True)
class RealSource:
    """A Debian source package at a pinned version, and the binaries of it that the driver
    install touches (downloaded; every other binary of it becomes a metadata-only stand-in)."""

    source: str
    version: str
    binaries: tuple[str, ...]
    # where the pinned version lives (documentation; the index says where it really is)
    archive: str


# The closure of `nvidia-driver-cuda` + `nvidia-kernel-dkms` (and `nvidia-kernel-open-dkms`)
# without Recommends, as apt resolves it against Debian's own packages (see STANDINS.md).
REAL_SOURCES: tuple[RealSource, ...] = (
    RealSource(
        "nvidia-graphics-drivers",
        "535.309.01-0+deb12u1",
        (
            "firmware-nvidia-gsp",
            "libcuda1",
            "libnvidia-cfg1",
            "libnvidia-ml1",
            "libnvidia-pkcs11-openssl3",
            "libnvidia-ptxjitcompiler1",
            "nvidia-alternative",
            "nvidia-kernel-dkms",
            "nvidia-kernel-support",
            "nvidia-legacy-check",
            "nvidia-smi",
        ),
        "bookworm-security",
    ),
    RealSource(
        "nvidia-modprobe", "535.309.01-0+deb12u1", ("nvidia-modprobe",), "bookworm-security"
    ),
    RealSource("nvidia-persistenced", "535.171.04-1~deb12u1", ("nvidia-persistenced",), "bookworm"),
    # Debian has no 535.309.01 build of the open module; bookworm's own is 535.261.03.
    RealSource(
        "nvidia-open-gpu-kernel-modules",
        "535.261.03-1",
        ("nvidia-open-kernel-dkms", "nvidia-open-kernel-support"),
        "bookworm",
    ),
)
# Sources whose other binaries are offered as metadata-only stand-ins.
METADATA_SOURCES = ("nvidia-graphics-drivers", "nvidia-open-gpu-kernel-modules")
# NVIDIA's repository names a package differently from Debian: Debian name -> NVIDIA's name.
RENAMES = {"nvidia-open-kernel-dkms": "nvidia-kernel-open-dkms"}


# --------------------------------------------------------------------------- index stanzas


def field_value(fields: Iterable[tuple[str, str]], name: str) -> str | None:
    """A field of a stanza held as (name, value) pairs (the cache's metadata stanzas, as
    repo.py reads them), by its name in any case; None when it has none."""
    return Stanza(tuple(fields)).get(name)


def source_name(stanza: Stanza) -> str:
    """The Source of a binary stanza (its own name when it has no Source field)."""
    src = stanza.get("Source") or stanza.get("Package") or ""
    return src.split()[0]


def upstream(version: str) -> str:
    """535.309.01-0+deb12u1 -> 535.309.01 (epoch and Debian revision dropped)."""
    return version.split(":")[-1].rsplit("-", 1)[0]


# --------------------------------------------------------------------------- the rewrite


_RELATION = re.compile(
    r"^\s*(?P<name>[^\s(\[]+)\s*(?:\((?P<op><<|<=|=|>=|>>)\s*(?P<ver>[^)\s]+)\s*\))?"
)


@dataclass(frozen=True)
class Rewrite:
    """Turns what a Debian 535 build says about itself into what the stand-in of the same
    package says at the stand-in's version: the full version (535.309.01-0+deb12u1 ->
    570.211.01-1), the upstream version (535.309.01 -> 570.211.01, also inside names such as
    nvidia-kernel-535.309.01) and the branch where it stands alone as a version (>= 535)."""

    real: str  # 535.309.01-0+deb12u1
    new: str  # 570.211.01-1
    new_branch: str  # 570

    @property
    def real_upstream(self) -> str:
        return upstream(self.real)

    @property
    def real_branch(self) -> str:
        return self.real_upstream.split(".")[0]

    @property
    def new_upstream(self) -> str:
        return upstream(self.new)

    def version(self, version: str) -> str:
        if version == self.real:
            return self.new
        if version == self.real_upstream:
            return self.new_upstream
        if version == self.real_branch:
            return self.new_branch
        return version

    def text(self, text: str) -> str:
        """Versions inside file names, file contents, dkms.conf and triggers."""
        return text.replace(self.real, self.new).replace(self.real_upstream, self.new_upstream)

    def script(self, text: str) -> str:
        """A maintainer script: the versions, and the branch standing alone (the alternatives
        priority: ``update-alternatives --install ... 535``, ``$((535 - 1))``)."""
        text = self.text(text)
        return re.sub(rf"(?<![\w.\-]){re.escape(self.real_branch)}(?![\w.])", self.new_branch, text)

    def relation(self, relation: str) -> str:
        """One relation ("name (op version)", with alternatives) at the stand-in's version."""
        out = []
        for alternative in relation.split("|"):
            match = _RELATION.match(alternative)
            if not match:
                raise RealError(f"cannot parse the relation {alternative!r}")
            name = match["name"].replace(self.real_upstream, self.new_upstream)
            rest = alternative[match.end() :].strip()
            if match["op"]:
                name += f" ({match['op']} {self.version(match['ver'])})"
            out.append(f"{name} {rest}".strip())
        return " | ".join(out)

    def relations(self, value: str) -> str:
        items = [item.strip() for item in value.replace("\n", " ").split(",") if item.strip()]
        return ", ".join(self.relation(item) for item in items)

    def leftovers(self, text: str) -> list[str]:
        """Traces of the real build's version left in ``text`` after the rewrite."""
        found = re.findall(rf"(?<![\w.]){re.escape(self.real_branch)}\.\d+\.\d+", text)
        found += re.findall(rf"\([<>=]+\s*{re.escape(self.real_branch)}\)", text)
        return found


# --------------------------------------------------------------------------- the cache


@dataclass
class RealPackage:
    """A downloaded Debian binary package, reduced to what the stand-in derivation reads."""

    name: str
    version: str
    source: str
    archive: str  # e.g. "bookworm-security/non-free": the index it came from
    filename: str  # the .deb in the cache
    sha256: str
    fields: Stanza  # the control file
    control_files: dict[str, tuple[bytes, int]]  # maintainer scripts, conffiles, triggers, ...
    entries: list[Entry]


@dataclass
class RealArchive:
    """The cache: the downloaded packages, the other binaries' stanzas and the apt root."""

    base: Path
    packages: dict[str, RealPackage]
    # the other binaries' index stanzas, as (name, value) pairs (repo.metadata_package's)
    metadata: list[list[tuple[str, str]]]
    sources_list: str  # the Debian sources the index came from

    @property
    def apt_root(self) -> Path:
        return self.base / "apt"

    @property
    def lists(self) -> Path:
        return self.apt_root / "lists"

    def package(self, name: str) -> RealPackage:
        try:
            return self.packages[name]
        except KeyError:
            raise RealError(f"Debian's {name} is not in the real-package cache") from None

    def versions(self) -> dict[str, str]:
        """Source -> the version the cache holds."""
        return {p.source: p.version for p in self.packages.values()}


def cache_key() -> str:
    blob = json.dumps(
        {
            "format": CACHE_FORMAT,
            "suite": SUITE,
            "components": COMPONENTS,
            "sources": [(s.source, s.version, list(s.binaries)) for s in REAL_SOURCES],
            "metadata": list(METADATA_SOURCES),
        },
        sort_keys=True,
    ).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def default_base() -> Path:
    return common.cache_dir() / "debian-real"


def debian_sources(mirror: str | None = None, security: str | None = None) -> list[str]:
    """The one-line apt sources the real packages are fetched from: the box's Debian mirror
    (bookworm, bookworm-updates) and the host's bookworm-security source (or
    $GPUBOX_DEBIAN_SECURITY_MIRROR, or the mirror's ``-security`` sibling by Debian's
    convention), components main contrib non-free non-free-firmware."""
    mirror = (mirror or common.debian_mirror()).rstrip("/")
    if security is None:
        security = os.environ.get("GPUBOX_DEBIAN_SECURITY_MIRROR")
    if security is None:
        for uri, suite in common.host_apt_sources():
            if suite == f"{SUITE}-security":
                security = uri
                break
    if security is None and mirror.endswith("/debian"):
        security = mirror + "-security"
    lines = [
        f"deb {mirror} {SUITE} {COMPONENTS}",
        f"deb {mirror} {SUITE}-updates {COMPONENTS}",
    ]
    if security:
        lines.append(f"deb {security.rstrip('/')} {SUITE}-security {COMPONENTS}")
    return lines


def _apt_options(root: Path, sources_list: Path) -> list[str]:
    options = {
        "Dir::Etc::sourcelist": str(sources_list),
        "Dir::Etc::sourceparts": "-",
        "Dir::Etc::preferences": str(root / "preferences"),
        "Dir::Etc::preferencesparts": str(root / "preferences.d"),
        "Dir::State": str(root / "state"),
        "Dir::State::Lists": str(root / "lists"),
        "Dir::State::status": str(root / "status"),
        "Dir::Cache": str(root / "cache"),
        "Debug::NoLocking": "1",
        "APT::Architecture": "amd64",
        "APT::Architectures": "amd64",
        "Acquire::Languages": "none",
        "APT::Sandbox::User": "root",
        "APT::Get::List-Cleanup": "false",
    }
    return [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]


def _prepare_apt_root(root: Path, sources: str) -> Path:
    for sub in ("lists/partial", "cache/archives/partial", "state", "preferences.d"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "status").touch()
    (root / "preferences").touch()
    sources_list = root / "sources.list"
    sources_list.write_text(sources)
    return sources_list


def _run(argv: list[str], what: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        raise RealError(
            f"{what} failed (exit {result.returncode}): {' '.join(argv[:3])} ...\n"
            f"{result.stderr.strip()[-2000:]}"
        )
    return result


def _index_stanzas(lists: Path) -> Iterator[tuple[str, Stanza]]:
    """(archive, stanza) for every stanza of every Packages file in an apt lists directory;
    archive is "suite/component" as the file name tells it."""
    for path in sorted(lists.glob("*_Packages*")):
        match = re.search(r"_dists_([^_]+)_([^_]+)_binary-[^_]+_Packages", path.name)
        archive = f"{match[1]}/{match[2]}" if match else path.name
        text = _run(["/usr/lib/apt/apt-helper", "cat-file", str(path)], "reading the index").stdout
        for stanza in parse_stanzas(text):
            yield archive, stanza


def _choose(wanted: RealSource, index: dict[tuple[str, str], tuple[str, Stanza]]) -> str:
    """The version of ``wanted`` to use: the pinned one, or (when Debian's archive has moved on
    and dropped it) the newest of the same source and branch that has every binary."""
    if all((b, wanted.version) in index for b in wanted.binaries):
        return wanted.version
    branch = upstream(wanted.version).split(".")[0]
    candidates: set[str] = set()
    for (name, version), (_archive, stanza) in index.items():
        if (
            name == wanted.binaries[0]
            and source_name(stanza) == wanted.source
            and upstream(version).split(".")[0] == branch
            and all((b, version) in index for b in wanted.binaries)
        ):
            candidates.add(version)
    if not candidates:
        have = sorted({v for (n, v) in index if n == wanted.binaries[0]})
        raise RealError(
            f"Debian's archive has no {wanted.source} {wanted.version} (nor another "
            f"{branch} build) with {', '.join(wanted.binaries)}; it has "
            f"{wanted.binaries[0]} {have or 'in no version'}. Check the Debian mirror and the "
            "bookworm-security source, or update REAL_SOURCES in gpubox/sandbox/debian_real.py"
        )
    newest = sorted(candidates, key=_version_key)[-1]
    return newest


def _version_key(version: str) -> Any:
    @functools.total_ordering
    class Key:
        def __init__(self, v: str) -> None:
            self.v = v

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Key) and self.v == other.v

        def __lt__(self, other: Key) -> bool:
            return (
                subprocess.run(
                    ["dpkg", "--compare-versions", self.v, "lt", other.v], check=False
                ).returncode
                == 0
            )

    return Key(version)


@contextlib.contextmanager
def _locked(base: Path) -> Iterator[None]:
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def load(base: Path | None = None) -> RealArchive | None:
    """The cache as it is, or None when it is missing or incomplete (no network)."""
    base = base or default_base()
    manifest_path = base / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("key") != cache_key():
        return None
    packages = {}
    for name, data in manifest["packages"].items():
        skeleton = base / "skeletons" / f"{name}.json"
        if not (base / "debs" / data["filename"]).is_file() or not skeleton.is_file():
            return None
        sk = json.loads(skeleton.read_text())
        packages[name] = RealPackage(
            name=name,
            version=data["version"],
            source=data["source"],
            archive=data["archive"],
            filename=data["filename"],
            sha256=data["sha256"],
            fields=Stanza(tuple((name, value) for name, value in sk["fields"])),
            control_files={
                k: (base64.b64decode(v[0]), v[1]) for k, v in sk["control_files"].items()
            },
            entries=[Entry.from_json(e) for e in sk["entries"]],
        )
    metadata = [[tuple(f) for f in stanza] for stanza in manifest["metadata"]]
    if not any((base / "apt" / "lists").glob("*_Packages*")):
        return None
    return RealArchive(base, packages, metadata, manifest["sources_list"])  # type: ignore[arg-type]


def ensure(
    base: Path | None = None,
    progress: Progress = lambda message: None,
    mirror: str | None = None,
    security: str | None = None,
) -> RealArchive:
    """The real-package cache, fetched from Debian's archive when missing (about 130 MB, once)."""
    base = base or default_base()
    with _locked(base):
        found = load(base)
        if found is not None:
            return found
        return _fetch(base, progress, mirror, security)


def _fetch(base: Path, progress: Progress, mirror: str | None, security: str | None) -> RealArchive:
    root = base / "apt"
    sources = "\n".join(debian_sources(mirror, security)) + "\n"
    sources_list = _prepare_apt_root(root, sources)
    options = _apt_options(root, sources_list)
    progress(f"reading Debian's {SUITE} index for the real NVIDIA driver packages")
    _run(["apt-get", *options, "-q", "update"], "apt-get update (Debian's archive)", timeout=900)
    index: dict[tuple[str, str], tuple[str, Stanza]] = {}
    for archive, stanza in _index_stanzas(root / "lists"):
        name, version = stanza.get("Package"), stanza.get("Version")
        if name and version and source_name(stanza) in {s.source for s in REAL_SOURCES}:
            index.setdefault((name, version), (archive, stanza))
    chosen = {s.source: _choose(s, index) for s in REAL_SOURCES}
    for s in REAL_SOURCES:
        if chosen[s.source] != s.version:
            progress(f"  Debian no longer has {s.source} {s.version}; using {chosen[s.source]}")
    debs = base / "debs"
    debs.mkdir(exist_ok=True)
    wanted = [f"{b}={chosen[s.source]}" for s in REAL_SOURCES for b in s.binaries]
    progress(f"downloading {len(wanted)} real Debian packages into {debs}")
    _run(
        ["apt-get", *options, "-q", "download", *wanted],
        "apt-get download (Debian's real NVIDIA packages)",
        cwd=debs,
        timeout=1800,
    )
    skeletons = base / "skeletons"
    skeletons.mkdir(exist_ok=True)
    packages: dict[str, Any] = {}
    for s in REAL_SOURCES:
        version = chosen[s.source]
        for name in s.binaries:
            archive, stanza = index[(name, version)]
            filename = Path(stanza.get("Filename") or "").name
            path = debs / filename
            if not path.is_file():
                raise RealError(f"apt-get download left no {filename} in {debs}")
            sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
            if sha256 != stanza.get("SHA256"):
                raise RealError(f"{filename}: sha256 differs from Debian's index")
            fields, control_files, entries = read_deb(path)
            (skeletons / f"{name}.json").write_text(
                json.dumps(
                    {
                        "fields": list(fields),
                        "control_files": {
                            k: [base64.b64encode(v[0]).decode(), v[1]]
                            for k, v in control_files.items()
                        },
                        "entries": [e.to_json() for e in entries],
                    }
                )
            )
            packages[name] = {
                "version": version,
                "source": s.source,
                "archive": archive,
                "filename": filename,
                "sha256": sha256,
            }
    downloaded = {name for s in REAL_SOURCES for name in s.binaries}
    metadata = []
    for (name, version), (archive, stanza) in sorted(index.items()):
        src = source_name(stanza)
        if src in METADATA_SOURCES and version == chosen[src] and name not in downloaded:
            metadata.append([*stanza, ("X-Recorded-From", archive)])
    manifest = {
        "key": cache_key(),
        "sources_list": sources,
        "packages": packages,
        "metadata": metadata,
    }
    tmp = base / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(base / "manifest.json")
    found = load(base)
    if found is None:
        raise RealError(f"the real-package cache in {base} is incomplete after fetching it")
    return found


# --------------------------------------------------------------------------- apt simulation


def simulate(
    real: RealArchive,
    repos: Iterable[Path],
    command: list[str],
    preferences: str = "",
    status: str = "",
) -> subprocess.CompletedProcess[str]:
    """``apt-get -s COMMAND`` against Debian's index (the cache's) plus flat repositories
    (``deb [trusted=yes] file:REPO /``), in a private apt root: apt's real resolver, no box.
    ``status`` is a dpkg status file's content (installed packages), ``preferences`` a pin
    file's. Returns apt's result (not checked)."""
    with tempfile.TemporaryDirectory(prefix="gpubox-aptsim-") as tmp:
        root = Path(tmp)
        local = "".join(f"deb [trusted=yes] file:{Path(r).resolve()} /\n" for r in repos)
        sources_list = _prepare_apt_root(root, real.sources_list + local)
        (root / "status").write_text(status)
        (root / "preferences").write_text(preferences)
        shutil.copytree(real.lists, root / "lists", dirs_exist_ok=True)
        only_local = root / "local.list"
        only_local.write_text(local)
        options = _apt_options(root, sources_list)
        _run(
            ["apt-get", *options, "-o", f"Dir::Etc::sourcelist={only_local}", "-q", "update"],
            "apt-get update (the stand-in repositories)",
            timeout=300,
        )
        return subprocess.run(
            ["apt-get", *options, "-s", "-q", *command],
            capture_output=True,
            text=True,
            timeout=300,
        )


def simulated_installs(output: str) -> dict[str, str]:
    """Package -> version of each ``Inst`` line of ``apt-get -s`` output."""
    return {m[1]: m[2] for m in re.finditer(r"^Inst (\S+) (?:\[\S+\] )?\((\S+) ", output, re.M)}
