"""The stand-in NVIDIA repositories' package model: a Deb (control fields, files, links,
maintainer scripts) as the sandbox builds it with dpkg-deb (repo_build.py), the templates of
``packages/`` with their @KEY@ placeholders, and the empty ELF libraries that stand in for
NVIDIA's. The packages themselves: repo_driver.py (the driver, derived from Debian's real
packages) and repo_tools.py (CUDA toolkits, DCGM, the container toolkit). None of it is ever
shipped to a real box."""

from __future__ import annotations

import functools
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACKAGES_DIR = Path(__file__).parent / "packages"
MAINTAINER = "gpubox sandbox stand-in <sandbox@gpubox.invalid>"
LIBDIR = "usr/lib/x86_64-linux-gnu"
STANDIN_LIBDIR = "usr/lib/gpubox-standin"  # stand-in helpers shipped by the packages


class RepoError(RuntimeError):
    pass


@dataclass
class Deb:
    name: str
    version: str
    description: str
    depends: list[str] = field(default_factory=list)
    pre_depends: list[str] = field(default_factory=list)
    recommends: list[str] = field(default_factory=list)
    suggests: list[str] = field(default_factory=list)
    enhances: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)
    breaks: list[str] = field(default_factory=list)
    section: str = "non-free/libs"
    architecture: str = "amd64"
    priority: str = "optional"
    source: str = ""
    multi_arch: str = ""
    homepage: str = ""
    # the real package's long description (continuation lines, each beginning with a space)
    long_description: str = ""
    # what the stand-in stands in for (derived packages: "Debian's X Y (archive)")
    standin_of: str = ""
    # path in the package (no leading slash) -> (content, mode)
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)  # path -> target
    dirs: list[str] = field(default_factory=list)  # (empty) directories the package ships
    # Stand-in maintainer scripts: a body, wrapped in "#!/bin/sh ... set -e" when built.
    scripts: dict[str, str] = field(default_factory=dict)  # postinst, prerm, postrm, preinst
    # Real maintainer scripts (whole files, kept as they are); a name is in one dict only.
    raw_scripts: dict[str, str] = field(default_factory=dict)
    # Other control members kept from the real package (triggers, templates, shlibs, config).
    control_files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    # The conffiles (absolute paths); None: every file under etc/.
    conffiles: list[str] | None = None

    def add(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        self.files[path] = (content.encode() if isinstance(content, str) else content, mode)

    def control(self) -> str:
        if self.standin_of:
            note = (
                f"\n .\n gpubox sandbox stand-in derived from {self.standin_of},"
                "\n re-versioned; what is real and what is not: STANDINS.md. Never shipped to"
                " a real box."
            )
        else:
            note = (
                "\n gpubox sandbox stand-in: a few small files "
                "that behave like NVIDIA's package\n in the sandbox box. Never "
                "shipped to a real box."
            )
        fields = [
            ("Package", self.name),
            ("Source", self.source),
            ("Version", self.version),
            ("Architecture", self.architecture),
            ("Maintainer", MAINTAINER),
            ("Section", self.section),
            ("Priority", self.priority),
            ("Multi-Arch", self.multi_arch),
            ("Pre-Depends", ", ".join(self.pre_depends)),
            ("Depends", ", ".join(self.depends)),
            ("Recommends", ", ".join(self.recommends)),
            ("Suggests", ", ".join(self.suggests)),
            ("Enhances", ", ".join(self.enhances)),
            ("Provides", ", ".join(self.provides)),
            ("Conflicts", ", ".join(self.conflicts)),
            ("Breaks", ", ".join(self.breaks)),
            ("Replaces", ", ".join(self.replaces)),
            ("Homepage", self.homepage),
            ("X-Gpubox-Standin-Of", self.standin_of),
            ("Description", self.description + self.long_description + note),
        ]
        return "".join(f"{k}: {v}\n" for k, v in fields if v)

    def file_name(self) -> str:
        # pool file names leave the epoch out, as NVIDIA's (and dpkg-name's) do
        return f"{self.name}_{self.version.split(':')[-1]}_{self.architecture}.deb"


def _template(name: str, **values: Any) -> str:
    """A file from packages/ with @KEY@ placeholders filled in."""
    text = (PACKAGES_DIR / name).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key.upper()}@", str(value))
    if "@" in text:
        leftover = [w for w in text.split("@")[1::2] if w.isupper() and " " not in w]
        if leftover:
            raise RepoError(f"packages/{name}: unfilled placeholders {leftover}")
    return text


@functools.cache
def _dummy_library(soname: str, owner: str) -> bytes:
    """A real (empty) ELF shared object with the library's soname, so that ldconfig lists it
    and the host checks can prove the linker path, as with the real libraries."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "standin.c"
        src.write_text(
            f"/* gpubox sandbox stand-in for {soname} ({owner}), never shipped to a real box */\n"
            f'const char gpubox_sandbox_standin[] = "{soname}";\n'
        )
        out = Path(tmp) / "lib.so"
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-nostdlib",
                "-Wl,--build-id=none",
                f"-Wl,-soname,{soname}",
                "-o",
                str(out),
                str(src),
            ],
            check=True,
        )
        return out.read_bytes()


def _doc(deb: Deb) -> None:
    deb.add(
        f"usr/share/doc/{deb.name}/README.gpubox-sandbox",
        f"{deb.name} {deb.version}: gpubox sandbox stand-in for NVIDIA's package of the "
        "same name.\nNever shipped to a real box.\n",
    )
