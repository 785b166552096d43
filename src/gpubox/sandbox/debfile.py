"""A Debian binary package (``.deb``) read the way the real-package cache keeps it.

``read_deb`` asks ``dpkg-deb`` for the package's two archives and returns its control stanza
(``gpubox.parsers.apt``'s ``Stanza``), its other control files (maintainer scripts,
conffiles, triggers, ... with their modes; not ``md5sums``) and the entries of its data
archive. An entry keeps a small regular file whole (``KEEP_MAX_BYTES``), except the kernel
module's source (but its ``dkms.conf``) and firmware; an ELF file keeps only its kind and
soname (``elf_info``): the stand-ins replace what touches hardware. debian_real.py builds
the cache from these; repo.py derives the stand-in packages from it.
"""

from __future__ import annotations

import base64
import struct
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpubox.parsers import ParseError, Stanza, parse_stanzas

# Regular files up to this size are kept whole in the cache (larger ones are ELF libraries,
# firmware or module sources, which the stand-ins replace).
KEEP_MAX_BYTES = 1 << 20


class DebFileError(RuntimeError):
    """dpkg-deb could not read a package, or its control file is not one deb822 stanza."""


@dataclass
class Entry:
    """One member of a real package's data archive, as the cache keeps it."""

    path: str  # no leading "./" or "/"; directories without the trailing slash
    kind: str  # "dir", "file", "link"
    mode: int
    size: int = 0
    link: str = ""
    content: bytes | None = None  # kept for small non-ELF files
    elf: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "kind": self.kind, "mode": self.mode}
        if self.size:
            out["size"] = self.size
        if self.link:
            out["link"] = self.link
        if self.content is not None:
            out["content"] = base64.b64encode(self.content).decode()
        if self.elf is not None:
            out["elf"] = self.elf
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        content = data.get("content")
        return cls(
            path=data["path"],
            kind=data["kind"],
            mode=data["mode"],
            size=data.get("size", 0),
            link=data.get("link", ""),
            content=None if content is None else base64.b64decode(content),
            elf=data.get("elf"),
        )


def elf_info(data: bytes) -> dict[str, Any] | None:
    """ELF64 little-endian files: {"type": "library"|"executable", "soname": str|None};
    None for anything else."""
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        return None
    e_type = struct.unpack_from("<H", data, 16)[0]
    shoff = struct.unpack_from("<Q", data, 40)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    soname = None
    sections = []
    for i in range(shnum):
        off = shoff + i * shentsize
        if off + 64 > len(data):
            break
        sections.append(struct.unpack_from("<IIQQQQIIQQ", data, off))
    for _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type != 6 or not entsize or link >= len(sections):  # SHT_DYNAMIC
            continue
        str_off = sections[link][4]
        for pos in range(offset, offset + size, entsize):
            tag, val = struct.unpack_from("<qQ", data, pos)
            if tag == 0:
                break
            if tag == 14:  # DT_SONAME
                end = data.index(b"\0", str_off + val)
                soname = data[str_off + val : end].decode()
    kind = "library" if e_type == 3 and soname else "executable"
    return {"type": kind, "soname": soname}


def read_deb(path: Path) -> tuple[Stanza, dict[str, tuple[bytes, int]], list[Entry]]:
    """(the control stanza, the other control files by name with their modes, the data
    archive's entries) of a ``.deb``."""
    control_files: dict[str, tuple[bytes, int]] = {}
    with subprocess.Popen(["dpkg-deb", "--ctrl-tarfile", str(path)], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        with tarfile.open(fileobj=p.stdout, mode="r|*") as tar:
            for member in tar:
                name = member.name.lstrip("./")
                if member.isfile() and name and name != "md5sums":
                    handle = tar.extractfile(member)
                    assert handle is not None
                    control_files[name] = (handle.read(), member.mode & 0o7777)
    if p.returncode:
        raise DebFileError(f"dpkg-deb could not read the control archive of {path}")
    try:
        stanzas = parse_stanzas(control_files.pop("control")[0].decode())
    except ParseError as exc:
        raise DebFileError(f"the control file of {path}: {exc}") from None
    if len(stanzas) != 1:
        raise DebFileError(f"the control file of {path} holds {len(stanzas)} stanzas, not one")
    entries = []
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(path)], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        entries = list(_entries(p.stdout))
    if p.returncode:
        raise DebFileError(f"dpkg-deb could not read the data archive of {path}")
    return stanzas[0], control_files, entries


def _entries(stream: IO[bytes]) -> Iterator[Entry]:
    with tarfile.open(fileobj=stream, mode="r|*") as tar:
        for member in tar:
            path = member.name
            while path.startswith("./"):
                path = path[2:]
            path = path.strip("/")
            if not path or path == ".":
                continue
            mode = member.mode & 0o7777
            if member.isdir():
                yield Entry(path, "dir", mode)
            elif member.issym():
                yield Entry(path, "link", mode, link=member.linkname)
            elif member.islnk():  # a hard link: the same content under another name
                yield Entry(path, "link", mode, link="/" + member.linkname.lstrip("./"))
            elif member.isfile():
                handle = tar.extractfile(member)
                assert handle is not None
                head = handle.read(KEEP_MAX_BYTES + 1)
                elf = None
                content: bytes | None = None
                if head[:4] == b"\x7fELF":
                    # the section headers sit at the end: read the whole file for the soname
                    elf = elf_info(head + handle.read())
                elif len(head) <= KEEP_MAX_BYTES and _kept(path):
                    content = head
                yield Entry(path, "file", mode, size=member.size, content=content, elf=elf)


def _kept(path: str) -> bool:
    """Whether the cache keeps a (small, non-ELF) file's content: not the module source (but
    its dkms.conf) and not firmware."""
    if path.startswith("usr/src/"):
        return path.endswith("/dkms.conf")
    return not path.startswith("lib/firmware/")
