"""gpu-burn's source as the sandbox serves it, where GitHub's archive endpoint has it
(``github/wilicc/gpu-burn/archive/<commit>.tar.gz``, top directory ``gpu-burn-<commit>/``):
built from the stand-in source tree in ``standin/gpu-burn`` with fixed modes and times and
``gzip -n`` (tarball.py), so its sha256 is stable; the commit id is derived from the tree's
content."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

from gpubox.sandbox import standin, tarball
from gpubox.sandbox.repo_debs import RepoError

# gpu-burn's source, where GitHub's archive endpoint has it.
GPU_BURN_URL_PATH = "github/wilicc/gpu-burn/archive/"
# The stand-in commit's time (the tar entries' mtime), fixed so the tarball is reproducible.
GPU_BURN_COMMIT_TIME = 1780185600  # 2026-05-31T00:00:00Z


def gpu_burn_files(tree: Path | None = None) -> list[Path]:
    """The files of the stand-in gpu-burn source tree the tarball holds (standin/STATE.md:
    ``standin.GPU_BURN_FILES``; build outputs left in the tree are not part of it)."""
    tree = tree or standin.GPU_BURN_TREE
    files = [tree / name for name in standin.GPU_BURN_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise RepoError(f"the stand-in gpu-burn source tree lacks {missing}")
    return sorted(files)


def gpu_burn_commit(tree: Path | None = None) -> str:
    """A stand-in commit id (40 hex digits) derived from the tree's content: the same tree
    gives the same id, a changed tree a new one, as with git."""
    tree = tree or standin.GPU_BURN_TREE
    h = hashlib.sha1(b"gpubox sandbox stand-in gpu-burn\n")
    for path in gpu_burn_files(tree):
        mode = "755" if os.access(path, os.X_OK) else "644"
        h.update(f"{mode} {path.relative_to(tree).as_posix()}\0".encode() + path.read_bytes())
    return h.hexdigest()


def gpu_burn_tarball(tree: Path | None = None) -> tuple[str, bytes]:
    """(commit, tar.gz bytes) laid out like `git archive --prefix=gpu-burn-<commit>/ | gzip -n`:
    a pax global header with the commit, modes 0664/0775, owner root, one fixed mtime."""
    tree = tree or standin.GPU_BURN_TREE
    commit = gpu_burn_commit(tree)
    members = [
        tarball.Member(
            path.relative_to(tree).as_posix(),
            path.read_bytes(),
            0o775 if os.access(path, os.X_OK) else 0o664,
        )
        for path in gpu_burn_files(tree)
    ]
    data = tarball.tar_gz(
        f"gpu-burn-{commit}",
        members,
        mtime=GPU_BURN_COMMIT_TIME,
        dir_mode=0o775,
        tar_format=tarfile.PAX_FORMAT,
        pax_headers={"comment": commit},
    )
    return commit, data
