"""llama.cpp's source for the sandbox box, as GitHub's tag archive would serve it.

GitHub cannot be reached from a test machine, but PyPI can, and PyPI's ``llama-cpp-python``
sdist vendors a whole llama.cpp tree (tools/server included) under
``llama_cpp_python-<version>/vendor/llama.cpp``: 0.3.36 carries commit 0c1e57098 (2026-10-01),
which third parties name b11312. This module
downloads that sdist with pip (so a user's PyPI mirror applies), checks its sha256, and packs the
vendored tree the way ``git archive --prefix=llama.cpp-b11312/ | gzip -n`` does for GitHub's
``/archive/refs/tags/b11312.tar.gz``: a pax global header with the commit, directories before
their contents, paths sorted, modes 0664/0775, owner root, one fixed mtime. The tarball is
cached under the gpubox cache dir per sdist version; the sandbox's loopback server publishes it.

The build number is not recorded in the sdist, so a build of this tree must be told
(``-DLLAMA_BUILD_NUMBER=11312 -DLLAMA_BUILD_COMMIT=0c1e570``), or ``--version`` says build 1:
box.json carries both (``llamacpp_tag``, ``llamacpp_commit``). Nothing here is ever committed
or shipped to a real box.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PYPI_PROJECT = "llama-cpp-python"
PYPI_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{PYPI_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_TREE = f"llama_cpp_python-{PYPI_VERSION}/vendor/llama.cpp/"
# What the vendored tree is upstream (its .git/modules/vendor/llama.cpp/HEAD in the sdist).
TAG = "b11312"
BUILD_NUMBER = 11312
COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
SHORT_COMMIT = COMMIT[:7]  # what llama.cpp's build-info records (git rev-parse --short)
COMMIT_TIME = 1790812800  # 2026-10-01T00:00:00Z: the commit's day (its exact time is unknown)
TOP = f"llama.cpp-{TAG}"
# Where GitHub's archive endpoint has it (catalog.yml llamacpp.url, "{tag}" kept for the deploy).
URL_PATH = "github/ggml-org/llama.cpp/archive/refs/tags/{tag}.tar.gz"
# Bump when the way the tarball is packed changes: the cached tarball is packed again.
TARBALL_FORMAT_VERSION = 1
# Not in GitHub's archive: the submodule's gitlink file (it points into the sdist's .git).
SKIP = {".git"}

Progress = Callable[[str], None]


class LlamaCppSourceError(RuntimeError):
    """The llama.cpp source could not be obtained; the message says what to do."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download_sdist(dest_dir: Path, progress: Progress) -> Path:
    """The verified sdist in ``dest_dir`` (downloaded with pip if it is not there yet)."""
    sdist = dest_dir / SDIST_NAME
    if sdist.exists():
        if _sha256(sdist) == SDIST_SHA256:
            return sdist
        progress(f"{sdist} has the wrong sha256: downloading it again")
        sdist.unlink()
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest_dir / f".download-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "-d",
        str(tmp),
        f"{PYPI_PROJECT}=={PYPI_VERSION}",
    ]
    progress(
        f"downloading PyPI's {PYPI_PROJECT} {PYPI_VERSION} sdist (76.6 MB; it vendors "
        f"llama.cpp {TAG}) with pip: about a minute, once"
    )
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        output: list[str] = []
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(15):
                progress(f"  pip is still at it ({time.monotonic() - started:.0f} s)")

        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        try:
            for line in proc.stdout:
                output.append(line)
                if line.strip() and not line.startswith(" "):
                    progress("  pip: " + line.strip())
            rc = proc.wait()
        finally:
            done.set()
        if rc != 0:
            raise LlamaCppSourceError(
                f"pip could not download {PYPI_PROJECT}=={PYPI_VERSION} (exit {rc}; is PyPI or "
                "your pip index reachable?):\n" + "".join(output[-15:])
            )
        got = tmp / SDIST_NAME
        if not got.exists():
            raise LlamaCppSourceError(
                f"pip downloaded {sorted(p.name for p in tmp.iterdir())}, not {SDIST_NAME}"
            )
        digest = _sha256(got)
        if digest != SDIST_SHA256:
            raise LlamaCppSourceError(
                f"{SDIST_NAME} from your pip index has sha256 {digest}, expected {SDIST_SHA256}: "
                "refused"
            )
        os.replace(got, sdist)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress(f"sdist downloaded and verified in {time.monotonic() - started:.0f} s")
    return sdist


def _entry(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, size
    info.mtime = COMMIT_TIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _sdist_tree(src: tarfile.TarFile, name: str) -> dict[str, tarfile.TarInfo]:
    """The vendored tree's files and links, by path relative to the tree."""
    members = {}
    for member in src.getmembers():
        if not member.name.startswith(SDIST_TREE):
            continue
        rel = member.name[len(SDIST_TREE) :].rstrip("/")
        if not rel or rel.split("/")[0] in SKIP:
            continue
        if member.isfile() or member.issym():
            members[rel] = member
        elif not member.isdir():
            raise LlamaCppSourceError(f"unexpected entry in {name}: {member.name}")
    if not any(rel.startswith("tools/server/") for rel in members):
        raise LlamaCppSourceError(f"{name} has no {SDIST_TREE}tools/server tree")
    return members


def _write_archive(
    src: tarfile.TarFile,
    members: dict[str, tarfile.TarInfo],
    tar: tarfile.TarFile,
    progress: Progress,
) -> None:
    tar.addfile(_entry(TOP + "/", tarfile.DIRTYPE, 0o775))
    dirs: set[str] = set()
    last = time.monotonic()
    for count, rel in enumerate(sorted(members), 1):
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent not in dirs:
                dirs.add(parent)
                tar.addfile(_entry(f"{TOP}/{parent}/", tarfile.DIRTYPE, 0o775))
        member = members[rel]
        if member.issym():
            link = _entry(f"{TOP}/{rel}", tarfile.SYMTYPE, 0o777)
            link.linkname = member.linkname
            tar.addfile(link)
            continue
        mode = 0o775 if member.mode & 0o111 else 0o664  # what git archive writes
        tar.addfile(
            _entry(f"{TOP}/{rel}", tarfile.REGTYPE, mode, member.size), src.extractfile(member)
        )
        if time.monotonic() - last > 5:
            last = time.monotonic()
            progress(f"  packed {count}/{len(members)} files")


def pack(sdist: Path, out: Path, progress: Progress) -> None:
    """Pack the sdist's vendored llama.cpp tree into ``out`` as GitHub's tag archive."""
    started = time.monotonic()
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    try:
        with tarfile.open(sdist, "r:gz") as src:
            members = _sdist_tree(src, sdist.name)
            progress(f"packing {len(members)} files of llama.cpp {TAG} into {out}")
            # gzip -n (no name, mtime 0) at gzip's default level
            with (
                open(tmp, "wb") as raw,
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
                tarfile.open(
                    fileobj=gz, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": COMMIT}
                ) as tar,
            ):
                _write_archive(src, members, tar, progress)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    progress(f"packed in {time.monotonic() - started:.0f} s")


def ensure_tarball(base: Path, progress: Progress = lambda message: None) -> dict[str, Any]:
    """GitHub's tag archive of llama.cpp ``TAG``, packed from the sdist and cached under
    ``base/<sdist version>/``; returns its facts (path, sha256, size, tag, commit, ...)."""
    cache = base / PYPI_VERSION
    tarball = cache / f"{TAG}.tar.gz"
    meta_path = cache / "meta.json"
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        if (
            meta.get("format") == TARBALL_FORMAT_VERSION
            and tarball.exists()
            and tarball.stat().st_size == meta["size"]
        ):
            return dict(meta, path=str(tarball))
    cache.mkdir(parents=True, exist_ok=True)
    sdist = download_sdist(cache, progress)
    pack(sdist, tarball, progress)
    meta = {
        "format": TARBALL_FORMAT_VERSION,
        "sha256": _sha256(tarball),
        "size": tarball.stat().st_size,
        "tag": TAG,
        "build_number": BUILD_NUMBER,
        "commit": SHORT_COMMIT,
        "full_commit": COMMIT,
        "top": TOP,
        "sdist": f"{PYPI_PROJECT}=={PYPI_VERSION}",
        "sdist_sha256": SDIST_SHA256,
    }
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    for old in base.iterdir():  # the trees of other sdist versions
        if old.is_dir() and old != cache:
            shutil.rmtree(old, ignore_errors=True)
    return dict(meta, path=str(tarball))


def main(argv: list[str] | None = None) -> int:
    """python -m gpubox.sandbox.llamacpp CACHE_DIR: make the tarball, print its facts."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m gpubox.sandbox.llamacpp CACHE_DIR", file=sys.stderr)
        return 2

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        print(json.dumps(ensure_tarball(Path(args[0]), progress), indent=1))
    except LlamaCppSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
