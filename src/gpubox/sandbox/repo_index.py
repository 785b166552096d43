"""The indexes of the sandbox's stand-in NVIDIA repositories: Release written by apt-ftparchive
and signed with a throwaway key (InRelease, Release.gpg), and the driver builds the stand-in
CUDA repository stops and starts offering (``withdraw``, ``restore``), as NVIDIA's repository
drops old builds: a withdrawn build's packages stay on disk but leave the index, so a box's
next ``apt-get update`` no longer sees them.

What withdrawing needs is kept beside the built repository, in its root's ``.withdraw/`` (the
server serves no path with a dot component): the CUDA repository's throwaway signing key, its
whole Packages index as built, and the withdrawn versions (``withdrawn.json``; absent when
none). repo_build.py builds the repository; a fresh sandbox (box 1's ``up`` and ``down``)
starts with nothing withdrawn."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpubox.sandbox.common import SandboxError

KEEP_DIR = ".withdraw"
SIGNING_KEY = "signing-key.asc"  # the CUDA repository's secret key, ASCII-armored
ALL_PACKAGES = "Packages.all"  # the Packages index as built, every driver build in it
STATE_FILE = "withdrawn.json"
INDEX_FILES = ("Packages", "Packages.gz", "Release", "Release.gpg", "InRelease")


def gpg(home: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--quiet", *args],
        check=True,
        capture_output=True,
        **kw,
    )


@contextlib.contextmanager
def gpg_home() -> Iterator[Path]:
    """A private GNUPGHOME, removed afterwards (its agent stopped). A short path under /tmp:
    gpg-agent's socket path must fit in sun_path."""
    home = Path(tempfile.mkdtemp(prefix="gpg-", dir="/tmp"))
    try:
        home.chmod(0o700)
        yield home
    finally:
        subprocess.run(
            ["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(home, ignore_errors=True)


def release_and_sign(
    indexes: Path, repo: Path, home: Path, origin: str | None = None, label: str | None = None
) -> None:
    """Release for the flat repository ``repo`` from its Packages files in ``indexes`` (the
    repository itself, or a directory with just the new ones), InRelease and Release.gpg
    signed with the key in ``home``. Written outside ``repo`` first (Release must not hash
    itself), then moved in, each file atomically."""
    options = ["-o", "APT::FTPArchive::Release::Architectures=amd64"]
    if origin:
        options += ["-o", f"APT::FTPArchive::Release::Origin={origin}"]
    if label:
        options += ["-o", f"APT::FTPArchive::Release::Label={label}"]
    release = subprocess.run(
        ["apt-ftparchive", *options, "release", "."], cwd=indexes, check=True, capture_output=True
    ).stdout
    with tempfile.TemporaryDirectory(prefix="gpubox-release-") as tmp:
        work = Path(tmp)
        (work / "Release").write_bytes(release)
        gpg(home, "--clearsign", "-o", str(work / "InRelease"), str(work / "Release"))
        gpg(home, "-abs", "-o", str(work / "Release.gpg"), str(work / "Release"))
        for name in ("Release", "Release.gpg", "InRelease"):
            _replace(work / name, repo / name)


def _replace(source: Path, dest: Path) -> None:
    """Move ``source`` over ``dest`` atomically, with an mtime later than the old file's: the
    server answers If-Modified-Since at one-second resolution, so a change within the same
    second as the last one must still read as newer (or apt would keep its old index)."""
    old = dest.stat().st_mtime if dest.exists() else 0.0
    tmp = dest.with_name(f".{dest.name}.new")
    shutil.copyfile(source, tmp)
    stamp = max(time.time(), int(old) + 1.0)
    os.utime(tmp, (stamp, stamp))
    os.replace(tmp, dest)


def keep_for_withdrawal(root: Path, cuda_repo: str, home: Path, fpr: str) -> None:
    """At build time: what ``withdraw`` needs later, in ``root``/.withdraw: the signing key of
    the CUDA repository at ``root``/``cuda_repo`` (in ``home``), its whole Packages index. The
    served driver builds (upstream version -> package version) are in meta.json."""
    keep = root / KEEP_DIR
    keep.mkdir(mode=0o700)
    secret = gpg(
        home, "--pinentry-mode", "loopback", "--passphrase", "", "--armor",
        "--export-secret-keys", fpr,
    ).stdout  # fmt: skip
    (keep / SIGNING_KEY).write_bytes(secret)
    (keep / SIGNING_KEY).chmod(0o600)
    shutil.copyfile(root / cuda_repo / "Packages", keep / ALL_PACKAGES)


def served_builds(root: Path) -> dict[str, str]:
    """The driver builds the built repository at ``root`` carries: upstream version ->
    Debian package version (withdrawn or not)."""
    builds: dict[str, str] = _meta(root).get("driver_builds", {})
    return builds


def withdrawn(root: Path) -> list[str]:
    """The driver builds (upstream versions) withdrawn from the repository at ``root``."""
    try:
        versions: list[str] = json.loads((root / KEEP_DIR / STATE_FILE).read_text())["withdrawn"]
    except FileNotFoundError:
        return []
    return versions


def _meta(root: Path) -> dict[str, Any]:
    try:
        meta: dict[str, Any] = json.loads((root / "meta.json").read_text())
    except FileNotFoundError as exc:
        raise SandboxError(f"{root} is not a built stand-in repository (no meta.json)") from exc
    return meta


def current_root() -> Path:
    """The stand-in repository the running sandbox serves (box.json's repo_root)."""
    from gpubox.sandbox.processes import box_info  # the box's state, not needed at build

    return Path(box_info()["repo_root"])


def withdraw(version: str, root: Path | None = None) -> list[str]:
    """The stand-in CUDA repository stops offering driver build ``version`` (an upstream
    version, e.g. 570.211.01): every package at that build's version leaves its index at the
    next ``apt-get update`` in a box. Returns the withdrawn versions."""
    root = root or current_root()
    builds = served_builds(root)
    if version not in builds:
        raise SandboxError(
            f"the stand-in repository serves no driver build {version!r}; it serves "
            f"{', '.join(builds) or 'none'} (gpubox sandbox repo withdraw VERSION)"
        )
    versions = [v for v in builds if v in {*withdrawn(root), version}]
    _publish(root, versions)
    return versions


def restore(root: Path | None = None) -> list[str]:
    """The stand-in CUDA repository offers every driver build again; returns the versions
    that were withdrawn (nothing is rewritten when none was)."""
    root = root or current_root()
    was = withdrawn(root)
    if was:
        _publish(root, [])
    return was


def _publish(root: Path, versions: list[str]) -> None:
    """Rewrite the CUDA repository's indexes without the packages of the builds ``versions``
    (the .deb files stay), and record them; an empty list restores the index as built."""
    meta = _meta(root)
    keep = root / KEEP_DIR
    if not (keep / SIGNING_KEY).exists():
        raise SandboxError(f"{root} keeps no signing key: rebuild it (gpubox sandbox up --rebuild)")
    repo = root / meta["cuda_repo"]
    gone = {served_builds(root)[v] for v in versions}
    stanzas = (keep / ALL_PACKAGES).read_text().split("\n\n")
    kept = [s for s in stanzas if s.strip() and _version(s) not in gone]
    packages = "\n\n".join(s.strip("\n") for s in kept) + "\n"
    with tempfile.TemporaryDirectory(prefix="gpubox-withdraw-") as tmp:
        work = Path(tmp)
        (work / "Packages").write_text(packages)
        (work / "Packages.gz").write_bytes(gzip.compress(packages.encode(), 9, mtime=0))
        with gpg_home() as home:
            gpg(home, "--import", str(keep / SIGNING_KEY))
            _replace(work / "Packages", repo / "Packages")
            _replace(work / "Packages.gz", repo / "Packages.gz")
            release_and_sign(work, repo, home, meta.get("origin"), meta.get("label"))
    state = keep / STATE_FILE
    if versions:
        tmp_state = keep / f".{STATE_FILE}.new"
        tmp_state.write_text(json.dumps({"withdrawn": versions}) + "\n")
        os.replace(tmp_state, state)
    else:
        state.unlink(missing_ok=True)


def _version(stanza: str) -> str | None:
    for line in stanza.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return None
