"""The sandbox's one deterministic tarball writer: a ``.tar.gz`` whose bytes depend only on
its members, for the stand-in release archives the sandbox serves (gpu-burn's source,
repo_gpu_burn.py; 1Panel's release package, onepanel.py), so that their sha256 is stable.

One top directory; each member's parent directories as entries of their own, before the
first member in them; one fixed mtime, owner root (0/0); gzip without a file name and with
time 0 (``gzip -n``)."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Member:
    name: str  # relative to the top directory, "/"-separated
    data: bytes
    mode: int


def tar_gz(
    top: str,
    members: Iterable[Member],
    mtime: int,
    dir_mode: int,
    tar_format: int = tarfile.GNU_FORMAT,
    pax_headers: dict[str, str] | None = None,
) -> bytes:
    """The archive of ``members`` under ``top/``, in the order given. ``pax_headers``: a pax
    global header (with ``tar_format=tarfile.PAX_FORMAT``), as ``git archive`` writes the
    commit id."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tar_format, pax_headers=pax_headers) as tar:

        def entry(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.size = kind, mode, size
            info.mtime = mtime
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            return info

        tar.addfile(entry(top + "/", tarfile.DIRTYPE, dir_mode))
        dirs: set[str] = set()
        for member in members:
            for parent in list(PurePosixPath(member.name).parents)[::-1][1:]:
                if parent.as_posix() not in dirs:
                    dirs.add(parent.as_posix())
                    tar.addfile(entry(f"{top}/{parent.as_posix()}/", tarfile.DIRTYPE, dir_mode))
            info = entry(f"{top}/{member.name}", tarfile.REGTYPE, member.mode, len(member.data))
            tar.addfile(info, io.BytesIO(member.data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()
