"""The stand-in NVIDIA apt repository of the sandbox box, and its loopback HTTP server.

NVIDIA's CUDA repository cannot be reached from a test machine, so the sandbox serves a
stand-in with the same shape: a flat repository (``deb [signed-by=KEYRING] URL /``) at
``http://127.0.0.1:8765/nvidia/debian12/x86_64/``, a Release file with Origin "NVIDIA" and
Label "NVIDIA CUDA", signed by a throwaway key published as a *binary* keyring
``cuda-archive-keyring.gpg`` (as NVIDIA publishes theirs).

It carries NVIDIA's Debian driver packages at two driver versions side by side, the R570 the
deploy pins and a newer R580 the pin must resist, plus the ``cuda-drivers`` trap and two CUDA
toolkits (12.8, and 13.0 as a second temptation). The driver packages are derived from
Debian 12's real packages of the same names (debian_real.py fetches them once): their control
fields, maintainer scripts, conffiles, alternatives and users are Debian's, re-versioned;
only what touches hardware (libraries, nvidia-smi, the daemons, firmware, the kernel module
source) is a stand-in, and NVIDIA's ``nvidia-driver-cuda``, which Debian lacks, is a recorded
guess. STANDINS.md lists every difference. All packages are built here at run time with
dpkg-deb; the stand-in parts live in ``packages/`` (and ``standin/`` for nvidia-smi and lspci).
None of this is ever shipped to a real box.

The same repository also carries NVIDIA's DCGM packages (datacenter-gpu-manager-4-*), at the
catalog's version and a newer one, as NVIDIA's CUDA repository does.

Beside it, the same server publishes what else the deploy downloads from places a test machine
cannot reach:

- a stand-in of NVIDIA's container toolkit repository (nvidia.github.io/libnvidia-container),
  flat like the real one: ``deb [signed-by=KEYRING] URL/stable/deb/$(ARCH) /`` (apt expands
  ``$(ARCH)`` to amd64), signed by a second throwaway key of its own, published
  ASCII-armored as ``gpgkey`` like NVIDIA's; the four toolkit packages at the catalog's version
  and a newer one, with NVIDIA's dependency shape (docs.nvidia.com container-toolkit
  arch-overview: nvidia-container-toolkit Depends nvidia-container-toolkit-base (= version),
  libnvidia-container-tools (>= version); libnvidia-container-tools Depends
  libnvidia-container1 (>= version)), so installing one package alone drags in the newer ones;
- gpu-burn's source as GitHub's archive endpoint serves it
  (``github/wilicc/gpu-burn/archive/<commit>.tar.gz``, top directory ``gpu-burn-<commit>/``),
  built from the stand-in source tree in ``standin/gpu-burn`` with fixed modes and times and
  ``gzip -n``, so its sha256 is stable; the commit id is derived from the tree's content;
- files from caches of their own, given with ``--file URL_PATH=FILE``: the catalog's llama.cpp
  source, PyPI's sdist unchanged under ``pypi/packages/...`` (llamacpp.py), and the tiny GGUF
  model (tinymodel.py).

Single byte ranges are answered (206), as GitHub's and Hugging Face's servers do, so a resumed
download works against it.

The server binds 127.0.0.1 inside the box's network namespace, and exits when the box's
supervisor process is gone (or on SIGTERM), so it never outlives the box.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gzip
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubox import catalog
from gpubox.sandbox import debian_real, standin
from gpubox.sandbox.serve import (
    StderrLog,
    download_rate,
    file_arguments,
    paced_copy,
    parse_range,
    serve_until_stopped,
)

PACKAGES_DIR = Path(__file__).parent / "packages"
DISTRO = "debian12"
ARCH_DIR = "x86_64"
URL_PATH = "nvidia/{distro}/x86_64/"  # like developer.download.nvidia.com/compute/cuda/repos/
KEYRING_NAME = "cuda-archive-keyring.gpg"
ORIGIN = "NVIDIA"
LABEL = "NVIDIA CUDA"
MAINTAINER = "gpubox sandbox stand-in <sandbox@gpubox.invalid>"
KEY_UID = "gpubox sandbox stand-in NVIDIA CUDA repository (throwaway) <sandbox@gpubox.invalid>"
# Bump when the way packages are built changes: it is part of the cache key.
REPO_FORMAT_VERSION = 3

# The container toolkit repository, laid out as nvidia.github.io/libnvidia-container serves it.
TOOLKIT_URL_PATH = "libnvidia-container/stable/deb/"  # + "$(ARCH)", which apt expands
TOOLKIT_ARCH = "amd64"
TOOLKIT_KEY_PATH = "libnvidia-container/gpgkey"
TOOLKIT_KEY_UID = (
    "gpubox sandbox stand-in NVIDIA container toolkit repository (throwaway) "
    "<sandbox@gpubox.invalid>"
)
# Toolkit releases the stand-in knows, with the commit `nvidia-ctk --version` prints (git
# rev-parse of the tags v1.17.8 and v1.18.0 in NVIDIA/nvidia-container-toolkit); the catalog's
# version is served with a newer one beside it, as the temptation.
TOOLKIT_COMMITS = {
    "1.17.8": "f202b80a9b9d0db00d9b1d73c0128c8962c55f4d",
    "1.18.0": "f8daa5e26de9fd7eb79259040b6dd5a52060048c",
}
TOOLKIT_TEMPTATION = "1.18.0-1"
# DCGM: the catalog's version and a newer one (NVIDIA's CUDA repository carries both).
DCGM_TEMPTATION = "1:4.5.0-1"
# gpu-burn's source, where GitHub's archive endpoint has it.
GPU_BURN_URL_PATH = "github/wilicc/gpu-burn/archive/"
# The stand-in commit's time (the tar entries' mtime), fixed so the tarball is reproducible.
GPU_BURN_COMMIT_TIME = 1780185600  # 2026-05-31T00:00:00Z

# CUDA toolkit stand-ins: what `nvcc --version` prints, and the versions of the packages
# around the toolkit meta package (catalog.yml cuda.versions holds the meta package version).
#
# nvcc banners are verbatim transcripts of the real compilers, checked 2026-11 with the code
# search: CUDA 12.8 Update 1 (cuda-nvcc-12-8 12.8.93-1), e.g. gongyisheng/playground
# cuda/install.md and several other public install notes; CUDA 13.0 (cuda-nvcc-13-0
# 13.0.88-1, the nvcc that cuda-toolkit-13-0 13.0.2-1 installs: public Dockerfiles pin
# cuda-nvcc-13-0=13.0.88-1 beside cuda-cudart-dev-13-0=13.0.96-1), several public
# `nvcc --version` transcripts (WSL setup notes, llama.cpp benchmark logs).
CUDA_STANDINS: dict[str, dict[str, Any]] = {
    "12.8": {
        "nvcc_version": "12.8.93-1",
        "cudart_version": "12.8.90-1",
        "config_version": "12.8.90-1",
        "cudart_so": "12.8.90",
        "alternatives_priority": 128,
        "nvcc_banner": (
            "nvcc: NVIDIA (R) Cuda compiler driver\n"
            "Copyright (c) 2005-2025 NVIDIA Corporation\n"
            "Built on Fri_Feb_21_20:23:50_PST_2025\n"
            "Cuda compilation tools, release 12.8, V12.8.93\n"
            "Build cuda_12.8.r12.8/compiler.35583870_0\n"
        ),
    },
    "13.0": {
        "nvcc_version": "13.0.88-1",
        "cudart_version": "13.0.96-1",
        "config_version": "13.0.96-1",
        "cudart_so": "13.0.96",
        "alternatives_priority": 130,
        "nvcc_banner": (
            "nvcc: NVIDIA (R) Cuda compiler driver\n"
            "Copyright (c) 2005-2025 NVIDIA Corporation\n"
            "Built on Wed_Aug_20_01:58:59_PM_PDT_2025\n"
            "Cuda compilation tools, release 13.0, V13.0.88\n"
            "Build cuda_13.0.r13.0/compiler.36424714_0\n"
        ),
    },
}
# The driver branches served side by side: the pinned one and the temptation.
DRIVER_BRANCHES = ("570", "580")

LIBDIR = "usr/lib/x86_64-linux-gnu"
STANDIN_LIBDIR = "usr/lib/gpubox-standin"  # stand-in helpers shipped by the packages


class RepoError(RuntimeError):
    pass


Progress = Callable[[str], None]


# --------------------------------------------------------------------------- package model


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


# --------------------------------------------------------------------------- the packages


def runtime_contract() -> dict[str, str]:
    """Where the stand-in packages keep the box's "kernel" state (standin/STATE.md)."""
    return {
        "loaded_file": str(standin.RUN_DIR / standin.LOADED_DRIVER_FILE),
        "persistence_file": str(standin.RUN_DIR / standin.PERSISTENCE_FILE),
        "persistenced_file": str(standin.RUN_DIR / standin.PERSISTENCED_FILE),
    }


# Control fields of a real package that the stand-in sets itself or drops: the maintainer is
# the stand-in's, the sizes and checksums of the index describe the real file.
_DROPPED_FIELDS = {
    "package",
    "version",
    "maintainer",
    "description",
    "installed-size",
    "filename",
    "size",
    "md5sum",
    "sha1",
    "sha256",
    "sha512",
    "description-md5",
    "tag",
    "x-recorded-from",
}
_SIMPLE_FIELDS = {
    "source": "source",
    "architecture": "architecture",
    "section": "section",
    "priority": "priority",
    "multi-arch": "multi_arch",
    "homepage": "homepage",
}
_RELATION_ATTRS = {
    "pre-depends": "pre_depends",
    "depends": "depends",
    "recommends": "recommends",
    "suggests": "suggests",
    "enhances": "enhances",
    "provides": "provides",
    "conflicts": "conflicts",
    "breaks": "breaks",
    "replaces": "replaces",
}
# CUDA releases after Debian's 535 build (whose libcuda1 provides libcuda-5.0-1 ...
# libcuda-12.2-1): the stand-in libcuda1 adds one per release its branch supports, as
# Debian's packaging does for the releases of its driver (STANDINS.md).
CUDA_RELEASES = ("12.3", "12.4", "12.5", "12.6", "12.8", "12.9", "13.0")
CUDA_BY_BRANCH = {"570": "12.8", "580": "13.0"}
# The stand-in binaries: basename of a real executable -> the stand-in script's source.
STANDIN_EXECUTABLES = ("nvidia-smi", "nvidia-persistenced", "nvidia-modprobe")
DKMS_STANDIN_DIR = "nvidia-dkms"  # packages/nvidia-dkms: the stand-in module source


def _standin_executable(name: str, values: dict[str, Any]) -> str:
    if name == "nvidia-smi":
        return standin.nvidia_smi_source(values["version"])
    return _template(name, **values)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _dkms_conf(text: str) -> tuple[str, list[str]]:
    """PACKAGE_NAME and the BUILT_MODULE_NAMEs of a dkms.conf."""
    name = re.search(r'^PACKAGE_NAME="?([^"\n]+)"?', text, re.M)
    modules = re.findall(r'^BUILT_MODULE_NAME\[\d+\]="?([^"\n]+)"?', text, re.M)
    if not name or not modules:
        raise RepoError("a real dkms.conf without PACKAGE_NAME or BUILT_MODULE_NAME")
    return name[1], modules


def _fields_to_deb(
    deb: Deb, fields: Iterable[tuple[str, str]], rewrite: debian_real.Rewrite
) -> None:
    """The real control fields on a stand-in: relations at the stand-in's version."""
    for key, value in fields:
        low = key.lower()
        if low in _DROPPED_FIELDS:
            continue
        if low in _RELATION_ATTRS:
            rewritten = rewrite.relations(value)
            setattr(deb, _RELATION_ATTRS[low], [r.strip() for r in rewritten.split(",")])
        elif low in _SIMPLE_FIELDS:
            setattr(deb, _SIMPLE_FIELDS[low], value)
        else:
            raise RepoError(
                f"{deb.name}: the real package has a control field {key!r} that the "
                "stand-in does not know how to carry"
            )


def _description(fields: Iterable[tuple[str, str]]) -> tuple[str, str]:
    """(synopsis, long description as continuation lines)."""
    text = debian_real.field_value(list(fields), "Description") or ""
    synopsis, _, rest = text.partition("\n")
    return synopsis.strip(), ("\n" + rest if rest else "")


def _versioned_description(
    fields: Iterable[tuple[str, str]], rewrite: debian_real.Rewrite
) -> tuple[str, str]:
    synopsis, long_description = _description(fields)
    return rewrite.text(synopsis), rewrite.text(long_description)


def _check_rewritten(deb: Deb, rewrite: debian_real.Rewrite) -> None:
    texts = [
        dataclasses.replace(deb, standin_of="").control(),
        *deb.raw_scripts.values(),
        "\n".join(deb.conffiles or []),
    ]
    texts += [c.decode(errors="replace") for c, _ in deb.control_files.values()]
    texts += list(deb.files) + list(deb.links) + list(deb.links.values()) + deb.dirs
    left = sorted({x for t in texts for x in rewrite.leftovers(t)})
    if left:
        raise RepoError(
            f"the stand-in {deb.name} {deb.version} still names the real build's version "
            f"{rewrite.real}: {left} (gpubox/sandbox/debian_real.py Rewrite)"
        )


def derived_package(real: debian_real.RealPackage, branch: str, cat: dict[str, Any]) -> Deb:
    """A stand-in of NVIDIA's package at the branch's version, derived from Debian's real
    package: its control fields (relations re-versioned), maintainer scripts, conffiles,
    triggers, directories, links and small files are the real ones; what touches hardware
    (libraries, executables, firmware, the kernel module source) is a stand-in. STANDINS.md."""
    info = cat["driver"]["branches"][branch]
    ver = info["version"]  # 570.211.01
    pv = info["package_version"]["debian"]  # 570.211.01-1
    rewrite = debian_real.Rewrite(real.version, pv, branch)
    name = debian_real.RENAMES.get(real.name, real.name)
    synopsis, long_description = _versioned_description(real.fields, rewrite)
    deb = Deb(
        name,
        pv,
        synopsis,
        long_description=long_description,
        standin_of=f"Debian's {real.name} {real.version} ({real.archive})",
    )
    _fields_to_deb(deb, real.fields, rewrite)
    if name == "libcuda1":
        top = _version_tuple(CUDA_BY_BRANCH[branch])
        deb.provides += [
            f"libcuda-{c}-1"
            for c in CUDA_RELEASES
            if _version_tuple(c) <= top and f"libcuda-{c}-1" not in deb.provides
        ]
    values = {"version": ver, "package_version": pv, "branch": branch, **runtime_contract()}

    def path_of(path: str) -> str:
        path = rewrite.text(path)
        if name != real.name:  # /usr/share/doc/<package>/ and the like follow the name
            path = "/".join(name if part == real.name else part for part in path.split("/"))
        return path

    dkms_dirs: list[tuple[str, str]] = []  # (source directory, dkms.conf text)
    for entry in real.entries:
        if entry.path in ("", "."):
            continue
        path = path_of(entry.path)
        if path.startswith(f"usr/share/doc/{name}/") and not path.endswith("/copyright"):
            continue  # Debian's changelogs and READMEs describe the 535 build
        if entry.kind == "dir":
            if not (path.startswith("usr/src/") and path.count("/") > 2):
                deb.dirs.append(path)
            continue
        if entry.kind == "link":
            deb.links[path] = rewrite.text(entry.link)
            continue
        if path.startswith("lib/firmware/"):
            deb.add(
                path,
                f"gpubox sandbox stand-in for NVIDIA's firmware {Path(path).name} ({ver}); "
                "not firmware.\n",
                entry.mode,
            )
            continue
        if path.startswith("usr/src/"):
            if path.endswith("/dkms.conf") and path.count("/") == 3 and entry.content:
                text = rewrite.text(entry.content.decode())
                deb.add(path, text, entry.mode)
                dkms_dirs.append((str(Path(path).parent), text))
            continue  # the module's real source: replaced by the stand-in source below
        if entry.elf is not None:
            base = Path(path).name
            if entry.elf["type"] == "library":
                deb.add(path, _dummy_library(entry.elf["soname"], name), entry.mode)
            elif base in STANDIN_EXECUTABLES:
                deb.add(path, _standin_executable(base, values), entry.mode)
            else:
                raise RepoError(
                    f"Debian's {real.name} ships the executable /{entry.path}, for which the "
                    "sandbox has no stand-in (gpubox/sandbox/repo.py STANDIN_EXECUTABLES)"
                )
            continue
        if entry.content is None:
            raise RepoError(
                f"Debian's {real.name} ships /{entry.path} ({entry.size} bytes), which the "
                "real-package cache did not keep: the stand-in cannot carry it"
            )
        content = entry.content
        with contextlib.suppress(UnicodeDecodeError):  # binary (a .gz man page): as it is
            content = rewrite.text(content.decode()).encode()
        deb.add(path, content, entry.mode)
    deb.dirs = sorted(set(deb.dirs))
    _doc(deb)

    for member, (content, mode) in real.control_files.items():
        if member == "symbols":
            continue  # the stand-in libraries export no symbols
        if member == "conffiles":
            deb.conffiles = [path_of(c.strip()) for c in content.decode().splitlines() if c.strip()]
        elif member in ("preinst", "postinst", "prerm", "postrm", "config"):
            deb.raw_scripts[member] = rewrite.script(content.decode())
        else:  # triggers, templates, shlibs
            deb.control_files[member] = (rewrite.text(content.decode()).encode(), mode)

    for source_dir, conf in dkms_dirs:
        _dkms_standin(deb, source_dir, conf, values)
    _check_rewritten(deb, rewrite)
    return deb


def _dkms_standin(deb: Deb, source_dir: str, conf: str, values: dict[str, Any]) -> None:
    """The stand-in module source beside Debian's real dkms.conf (whose MAKE runs `make
    modules`): a Makefile that writes placeholder modules, so that Debian's real dkms adds,
    builds and installs them; and the stand-in unit that "loads" the module at boot."""
    dkms_name, modules = _dkms_conf(conf)
    flavour = "open" if dkms_name.endswith("-open") else "proprietary"
    kvalues = dict(values, flavour=flavour, package=deb.name, dkms_name=dkms_name)
    kvalues["modules"] = " ".join(modules)
    here = f"{DKMS_STANDIN_DIR}/"
    deb.add(f"{source_dir}/Makefile", _template(here + "Makefile", **kvalues))
    deb.add(
        f"{source_dir}/gpubox-standin-ko", (PACKAGES_DIR / here / "gpubox-standin-ko").read_text()
    )
    deb.add(f"{source_dir}/README.gpubox-sandbox", _template(here + "README", **kvalues))
    unit = f"gpubox-standin-{dkms_name}.service"
    deb.add(
        f"{STANDIN_LIBDIR}/{dkms_name}/load-module",
        _template("nvidia-module-load", **kvalues),
        0o755,
    )
    deb.add(
        f"lib/systemd/system/{unit}", _template("gpubox-standin-nvidia-module.service", **kvalues)
    )
    header = "\n# gpubox sandbox stand-in addition (STANDINS.md): the module-load stand-in unit\n"
    post = _template("maintscripts/systemd-postinst", unit=unit)
    postrm = _template("maintscripts/systemd-postrm", unit=unit)
    deb.raw_scripts["postinst"] = (
        deb.raw_scripts.get("postinst", "#!/bin/sh\nset -e\n") + header + post
    )
    deb.raw_scripts["postrm"] = (
        deb.raw_scripts.get("postrm", "#!/bin/sh\nset -e\n") + header + postrm
    )


def metadata_package(stanza: list[tuple[str, str]], branch: str, cat: dict[str, Any]) -> Deb:
    """A package of the driver's source that the driver install does not touch: its control
    fields from Debian's index (relations re-versioned), no payload and no scripts."""
    pv = cat["driver"]["branches"][branch]["package_version"]["debian"]
    name = debian_real.field_value(stanza, "Package") or ""
    version = debian_real.field_value(stanza, "Version") or ""
    archive = debian_real.field_value(stanza, "X-Recorded-From") or "Debian's index"
    rewrite = debian_real.Rewrite(version, pv, branch)
    synopsis, long_description = _versioned_description(stanza, rewrite)
    deb = Deb(
        debian_real.RENAMES.get(name, name),
        pv,
        synopsis,
        long_description=long_description,
        standin_of=f"Debian's {name} {version} ({archive}; control fields only)",
    )
    _fields_to_deb(deb, stanza, rewrite)
    _doc(deb)
    _check_rewritten(deb, rewrite)
    return deb


def driver_cuda_package(branch: str, cat: dict[str, Any]) -> Deb:
    """NVIDIA's `nvidia-driver-cuda`, which Debian does not have: its control fields are a
    RECORDED GUESS (STANDINS.md): the compute userspace at exactly the same version."""
    pv = cat["driver"]["branches"][branch]["package_version"]["debian"]
    same = f"(= {pv})"
    deb = Deb(
        "nvidia-driver-cuda",
        pv,
        "NVIDIA driver CUDA integration components",
        depends=[
            f"nvidia-smi {same}",
            f"libcuda1 {same}",
            f"libnvidia-ml1 {same}",
            f"libnvidia-cfg1 {same}",
            f"libnvidia-ptxjitcompiler1 {same}",
            f"nvidia-persistenced {same}",
            f"nvidia-modprobe {same}",
        ],
        recommends=[f"nvidia-kernel-dkms {same} | nvidia-kernel-open-dkms {same}"],
        section="non-free/libs",
        standin_of="NVIDIA's nvidia-driver-cuda (control fields guessed: Debian has none)",
    )
    _doc(deb)
    return deb


def driver_packages(
    branch: str, cat: dict[str, Any], real: debian_real.RealArchive | None = None
) -> list[Deb]:
    """Every Debian driver package of NVIDIA's repository for one branch, as stand-ins:
    derived from Debian's real packages (those the driver install touches), metadata-only
    (the other binaries of the same sources), NVIDIA's nvidia-driver-cuda (guessed) and the
    cuda-drivers trap."""
    real = real or debian_real.ensure()
    pv = cat["driver"]["branches"][branch]["package_version"]["debian"]
    debs: dict[str, Deb] = {}
    for package in real.packages.values():
        deb = derived_package(package, branch, cat)
        debs[deb.name] = deb
    for stanza in real.metadata:
        deb = metadata_package(stanza, branch, cat)
        debs.setdefault(deb.name, deb)
    cuda = driver_cuda_package(branch, cat)
    debs[cuda.name] = cuda

    wanted = [n for group in cat["driver"]["packages"]["debian"].values() for n in group]
    unknown = [n for n in wanted if n not in debs]
    if unknown:
        raise RepoError(
            f"catalog.yml driver.packages.debian names {unknown}, which the sandbox's stand-in "
            "repository has no stand-in for: add one in gpubox/sandbox/repo.py driver_packages"
        )
    # the trap: a meta package that follows the newest driver
    trap = Deb(
        "cuda-drivers",
        pv,
        "CUDA Driver meta-package, branch-agnostic",
        depends=[f"nvidia-driver-cuda (>= {pv})", f"nvidia-kernel-dkms (>= {pv})"],
        section="multiverse/metapackages",
    )
    _doc(trap)
    return [*debs.values(), trap]


def cuda_packages(cuda: str, cat: dict[str, Any]) -> list[Deb]:
    """A CUDA toolkit as stand-ins: meta package, nvcc, cudart and the config packages."""
    info = cat["cuda"]["versions"][cuda]
    extra = CUDA_STANDINS[cuda]
    dash = cuda.replace(".", "-")
    major = cuda.split(".")[0]
    prefix = info["prefix"].strip("/")  # usr/local/cuda-12.8
    values = {
        "cuda": cuda,
        "prefix": "/" + prefix,
        "major": major,
        "priority": extra["alternatives_priority"],
    }
    cfg = extra["config_version"]

    common = Deb(
        "cuda-toolkit-config-common",
        cfg,
        "Common config package for CUDA Toolkit",
        section="multiverse/devel",
    )
    common.add("etc/ld.so.conf.d/000_cuda.conf", _template("cuda/000_cuda.conf", **values))
    major_cfg = Deb(
        f"cuda-toolkit-{major}-config-common",
        cfg,
        f"Common config package for CUDA Toolkit {major}",
        section="multiverse/devel",
    )
    major_cfg.add(
        f"etc/ld.so.conf.d/988_cuda-{major}.conf", _template("cuda/988_cuda-major.conf", **values)
    )
    ver_cfg = Deb(
        f"cuda-toolkit-{dash}-config-common",
        cfg,
        f"Common config package for CUDA Toolkit {cuda}",
        section="multiverse/devel",
    )
    ver_cfg.scripts["postinst"] = _template("cuda/config-common-postinst", **values)
    ver_cfg.scripts["prerm"] = _template("cuda/config-common-prerm", **values)

    cudart = Deb(
        f"cuda-cudart-{dash}",
        extra["cudart_version"],
        "CUDA Runtime native Libraries",
        depends=[
            f"cuda-toolkit-{dash}-config-common",
            f"cuda-toolkit-{major}-config-common",
            "cuda-toolkit-config-common",
        ],
        section="multiverse/devel",
    )
    lib = f"{prefix}/targets/x86_64-linux/lib"
    cudart.add(
        f"{lib}/libcudart.so.{extra['cudart_so']}",
        _dummy_library(f"libcudart.so.{extra['cudart_so']}", cudart.name),
    )
    cudart.links[f"{lib}/libcudart.so.{major}"] = f"libcudart.so.{extra['cudart_so']}"
    cudart.links[f"{prefix}/lib64"] = "targets/x86_64-linux/lib"

    nvcc = Deb(
        f"cuda-nvcc-{dash}",
        extra["nvcc_version"],
        "CUDA nvcc",
        depends=[f"cuda-cudart-{dash}"],
        section="multiverse/devel",
    )
    nvcc.add(
        f"{prefix}/bin/nvcc",
        _template("cuda/nvcc", banner=extra["nvcc_banner"].rstrip("\n"), **values),
        0o755,
    )

    meta = Deb(
        info["package"],
        info["package_version"],
        f"CUDA Toolkit {cuda} meta-package (does not include the driver)",
        depends=[
            f"{nvcc.name} (>= {nvcc.version.split('-')[0]})",
            f"{cudart.name} (>= {cudart.version.split('-')[0]})",
            f"{ver_cfg.name} (>= {cfg.split('-')[0]})",
        ],
        section="multiverse/metapackages",
    )
    debs = [common, major_cfg, ver_cfg, cudart, nvcc, meta]
    for d in debs:
        _doc(d)
    return debs


def dcgm_packages(version: str) -> list[Deb]:
    """DCGM 4 as NVIDIA's CUDA repository ships it (DCGM cmake/packaging.cmake, scripts/deb), as
    stand-ins: -core carries nv-hostengine, dcgmi and nvidia-dcgm.service; -proprietary the
    profiling module that the NVLink fields 1011/1012 need (the dcgmi stand-in looks for it)."""
    upstream = version.split(":")[-1].split("-")[0]  # 4.4.1
    major = upstream.split(".")[0]
    same = f"(= {version})"
    values = {"version": version, "upstream": upstream}
    prefix = f"datacenter-gpu-manager-{major}"

    core = Deb(
        f"{prefix}-core",
        version,
        "NVIDIA Datacenter GPU Management Tools - core",
        depends=["libc6 (>= 2.27)", "lshw"],
        pre_depends=["passwd", "login"],
        conflicts=["datacenter-gpu-manager"],
        section="multiverse/devel",
    )
    # the other stand-ins' home: standin/STATE.md
    core.add("usr/bin/nv-hostengine", standin.dcgm_source(standin.NV_HOSTENGINE, upstream), 0o755)
    core.add("usr/bin/dcgmi", standin.dcgm_source(standin.DCGMI, upstream), 0o755)
    core.add(
        "usr/lib/systemd/system/nvidia-dcgm.service",
        _template("dcgm/nvidia-dcgm.service", **values),
    )
    core.add(f"{LIBDIR}/libdcgm.so.{upstream}", _dummy_library(f"libdcgm.so.{major}", core.name))
    core.links[f"{LIBDIR}/libdcgm.so.{major}"] = f"libdcgm.so.{upstream}"
    core.scripts["postinst"] = _template("dcgm/core-postinst", **values)

    cuda12 = Deb(
        f"{prefix}-cuda12",
        version,
        "NVIDIA Datacenter GPU Management Tools - CUDA 12 support",
        depends=[f"{core.name} {same}"],
        provides=[f"{prefix} {same}"],
        recommends=["libnuma1"],
        section="multiverse/devel",
    )
    plugins = f"usr/libexec/{prefix}/plugins/cuda12"
    cuda12.add(
        f"{plugins}/libpluginr.so.{major}", _dummy_library(f"libpluginr.so.{major}", cuda12.name)
    )

    proprietary = Deb(
        f"{prefix}-proprietary",
        version,
        "NVIDIA Datacenter GPU Management Tools - proprietary modules",
        depends=[f"{core.name} {same}"],
        section="multiverse/devel",
    )
    profiling = f"libdcgmmoduleprofiling.so.{major}"
    proprietary.add(
        f"{LIBDIR}/libdcgmmoduleprofiling.so.{upstream}",
        _dummy_library(profiling, proprietary.name),
    )
    proprietary.links[f"{LIBDIR}/{profiling}"] = f"libdcgmmoduleprofiling.so.{upstream}"

    proprietary_cuda12 = Deb(
        f"{prefix}-proprietary-cuda12",
        version,
        "NVIDIA Datacenter GPU Management Tools - proprietary CUDA 12 modules",
        depends=[f"{proprietary.name} {same}", f"{cuda12.name} {same}"],
        section="multiverse/devel",
    )
    proprietary_cuda12.add(
        f"{plugins}/libpluginprofiling.so.{major}",
        _dummy_library(f"libpluginprofiling.so.{major}", proprietary_cuda12.name),
    )
    debs = [core, cuda12, proprietary, proprietary_cuda12]
    for d in debs:
        _doc(d)
    return debs


def toolkit_packages(version: str) -> list[Deb]:
    """The NVIDIA Container Toolkit's four packages at one version, as stand-ins, with the
    files where NVIDIA's packaging puts them (packaging/debian/*.install)."""
    upstream = version.split("-")[0]  # 1.17.8
    values = {"version": upstream, "commit": TOOLKIT_COMMITS.get(upstream, "")}

    lib = Deb(
        "libnvidia-container1",
        version,
        "NVIDIA container runtime library",
        section="libs",
    )
    lib.add(
        f"{LIBDIR}/libnvidia-container.so.{upstream}",
        _dummy_library("libnvidia-container.so.1", lib.name),
    )
    lib.links[f"{LIBDIR}/libnvidia-container.so.1"] = f"libnvidia-container.so.{upstream}"

    tools = Deb(
        "libnvidia-container-tools",
        version,
        "NVIDIA container runtime library (command-line tools)",
        depends=[f"libnvidia-container1 (>= {version})"],
        section="utils",
    )
    tools.add(
        "usr/bin/nvidia-container-cli",
        _template("container-toolkit/nvidia-container-cli", **values),
        0o755,
    )

    base = Deb(
        "nvidia-container-toolkit-base",
        version,
        "NVIDIA Container Toolkit Base",
        breaks=[
            "nvidia-container-runtime (<= 3.5.0-1)",
            "nvidia-container-runtime-hook",
            "nvidia-container-toolkit (<= 1.10.0-1)",
        ],
        replaces=["nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook"],
        section="utils",
    )
    for name in ("nvidia-ctk", "nvidia-container-runtime"):
        base.add(f"usr/bin/{name}", _template(f"container-toolkit/{name}", **values), 0o755)

    toolkit = Deb(
        "nvidia-container-toolkit",
        version,
        "NVIDIA Container toolkit",
        depends=[
            f"nvidia-container-toolkit-base (= {version})",
            f"libnvidia-container-tools (>= {version})",
            "libnvidia-container-tools (<< 2.0.0)",
        ],
        breaks=["nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook"],
        replaces=["nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook"],
        section="utils",
    )
    toolkit.add(
        "usr/bin/nvidia-container-runtime-hook",
        _template("container-toolkit/nvidia-container-runtime-hook", **values),
        0o755,
    )
    # as NVIDIA's postinst/postrm: nvidia-container-toolkit is a link to the hook
    toolkit.scripts["postinst"] = (
        'if [ "$1" = configure ] && [ -f /usr/bin/nvidia-container-runtime-hook ] '
        "&& [ ! -e /usr/bin/nvidia-container-toolkit ]; then\n"
        "    ln -s /usr/bin/nvidia-container-runtime-hook /usr/bin/nvidia-container-toolkit\n"
        "fi\n"
    )
    toolkit.scripts["postrm"] = (
        'if [ "$1" = purge ] && [ -L /usr/bin/nvidia-container-toolkit ]; then\n'
        "    rm /usr/bin/nvidia-container-toolkit\n"
        "fi\n"
    )
    debs = [lib, tools, base, toolkit]
    for d in debs:
        _doc(d)
    return debs


def all_packages(
    cat: dict[str, Any] | None = None, real: debian_real.RealArchive | None = None
) -> list[Deb]:
    """The stand-in NVIDIA CUDA repository's packages (drivers, CUDA toolkits, DCGM); the
    drivers are derived from Debian's real packages (``real``: the cache, fetched if missing)."""
    cat = cat or catalog.load()
    real = real or debian_real.ensure()
    debs = [d for branch in DRIVER_BRANCHES for d in driver_packages(branch, cat, real)]
    seen: set[tuple[str, str]] = set()
    for cuda in CUDA_STANDINS:
        for d in cuda_packages(cuda, cat):
            if (d.name, d.version) not in seen:  # config-common is shared between toolkits
                seen.add((d.name, d.version))
                debs.append(d)
    for version in dict.fromkeys([cat["dcgm"]["version"], DCGM_TEMPTATION]):
        debs.extend(dcgm_packages(version))
    return debs


def all_toolkit_packages(cat: dict[str, Any] | None = None) -> list[Deb]:
    """The stand-in container toolkit repository's packages: the catalog's version and newer."""
    cat = cat or catalog.load()
    versions = dict.fromkeys([cat["container_toolkit"]["version"], TOOLKIT_TEMPTATION])
    return [d for version in versions for d in toolkit_packages(version)]


# --------------------------------------------------------------------------- gpu-burn source


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
    top = f"gpu-burn-{commit}"
    raw = io.BytesIO()
    with tarfile.open(
        fileobj=raw, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": commit}
    ) as tar:

        def entry(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.size = kind, mode, size
            info.mtime = GPU_BURN_COMMIT_TIME
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            return info

        tar.addfile(entry(top + "/", tarfile.DIRTYPE, 0o775))
        dirs: set[str] = set()
        for path in gpu_burn_files(tree):
            rel = path.relative_to(tree).as_posix()
            for parent in list(Path(rel).parents)[::-1][1:]:
                if parent.as_posix() not in dirs:
                    dirs.add(parent.as_posix())
                    tar.addfile(entry(f"{top}/{parent.as_posix()}/", tarfile.DIRTYPE, 0o775))
            data = path.read_bytes()
            mode = 0o775 if os.access(path, os.X_OK) else 0o664
            tar.addfile(entry(f"{top}/{rel}", tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(raw.getvalue())
    return commit, out.getvalue()


# --------------------------------------------------------------------------- building


def _build_deb(deb: Deb, workdir: Path, outdir: Path) -> None:
    root = workdir / f"{deb.name}_{deb.version}"
    control_dir = root / "DEBIAN"
    control_dir.mkdir(parents=True)
    (control_dir / "control").write_text(deb.control())
    if deb.conffiles is None:
        conffiles = sorted("/" + p for p in deb.files if p.startswith("etc/"))
    else:
        conffiles = list(deb.conffiles)
    if conffiles:
        (control_dir / "conffiles").write_text("".join(c + "\n" for c in conffiles))
    for script, body in deb.scripts.items():
        path = control_dir / script
        path.write_text(
            "#!/bin/sh\n# gpubox sandbox stand-in maintainer script "
            "(never shipped to a real box)\nset -e\n" + body
        )
        path.chmod(0o755)
    for script, text in deb.raw_scripts.items():
        path = control_dir / script
        path.write_text(text)
        path.chmod(0o755)
    for name, (content, mode) in deb.control_files.items():
        path = control_dir / name
        path.write_bytes(content)
        path.chmod(mode)
    for rel in deb.dirs:
        (root / rel).mkdir(parents=True, exist_ok=True)
    for rel, (content, mode) in deb.files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    for rel, target in deb.links.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    subprocess.run(
        [
            "dpkg-deb",
            "--root-owner-group",
            "-Zgzip",
            "--build",
            str(root),
            str(outdir / deb.file_name()),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _input_digest(debs: Iterable[Deb], extra: Iterable[bytes] = ()) -> str:
    h = hashlib.sha256()
    h.update(f"format {REPO_FORMAT_VERSION} origin {ORIGIN} label {LABEL}\n".encode())
    for deb in debs:
        h.update(deb.name.encode() + deb.control().encode())
        for key in sorted(deb.files):
            h.update(key.encode() + b"\0" + deb.files[key][0] + str(deb.files[key][1]).encode())
        for key in sorted(deb.links):
            h.update(f"{key}->{deb.links[key]}".encode())
        for key in sorted(deb.scripts):
            h.update(f"{key}\0{deb.scripts[key]}".encode())
        for key in sorted(deb.raw_scripts):
            h.update(f"raw {key}\0{deb.raw_scripts[key]}".encode())
        for key in sorted(deb.control_files):
            content, mode = deb.control_files[key]
            h.update(f"control {key} {mode}\0".encode() + content)
        h.update(f"dirs {sorted(deb.dirs)} conffiles {deb.conffiles}\n".encode())
    for blob in extra:
        h.update(blob)
    return h.hexdigest()[:16]


def _gpg(home: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--quiet", *args],
        check=True,
        capture_output=True,
        **kw,
    )


def build_packages(debs: Iterable[Deb], repo: Path) -> Path:
    """Build the packages into the directory ``repo`` and index it (Packages, Packages.gz):
    a flat repository, unsigned (``deb [trusted=yes] file:REPO /``); returns ``repo``."""
    repo.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpubox-debs-") as tmp:
        for deb in debs:
            _build_deb(deb, Path(tmp), repo)
    # without --multiversion dpkg-scanpackages keeps only the newest version
    packages = subprocess.run(
        ["dpkg-scanpackages", "--arch", "amd64", "--multiversion", "."],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout
    (repo / "Packages").write_bytes(packages)
    subprocess.run(["gzip", "-9kfn", "Packages"], cwd=repo, check=True)
    return repo


def _flat_repo(
    repo: Path,
    debs: list[Deb],
    key_uid: str,
    armor: bool,
    origin: str | None = None,
    label: str | None = None,
) -> tuple[str, bytes]:
    """Build the packages into ``repo`` and index and sign it as a flat repository with a new
    throwaway key; returns (fingerprint, public key: binary, or ASCII-armored with ``armor``)."""
    repo.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpubox-repo-") as tmp:
        work = Path(tmp)
        build_packages(debs, repo)
        options = ["-o", "APT::FTPArchive::Release::Architectures=amd64"]
        if origin:
            options += ["-o", f"APT::FTPArchive::Release::Origin={origin}"]
        if label:
            options += ["-o", f"APT::FTPArchive::Release::Label={label}"]
        # Release is written outside the scanned directory, or it would hash itself
        release = subprocess.run(
            ["apt-ftparchive", *options, "release", "."],
            cwd=repo,
            check=True,
            capture_output=True,
        ).stdout
        (work / "Release").write_bytes(release)
        # a short GNUPGHOME path: gpg-agent's socket path must fit in sun_path
        home = Path(tempfile.mkdtemp(prefix="gpg-", dir="/tmp"))
        try:
            home.chmod(0o700)
            _gpg(
                home,
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                "--quick-gen-key",
                key_uid,
                "ed25519",
                "sign",
                "never",
            )
            listing = _gpg(home, "--with-colons", "--list-keys").stdout.decode()
            fpr = next(
                line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")
            )
            _gpg(home, "--clearsign", "-o", str(work / "InRelease"), str(work / "Release"))
            _gpg(home, "-abs", "-o", str(work / "Release.gpg"), str(work / "Release"))
            key = _gpg(home, *(["--armor"] if armor else []), "--export", fpr).stdout
        finally:
            subprocess.run(
                ["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                check=False,
                capture_output=True,
            )
            shutil.rmtree(home, ignore_errors=True)
        for name in ("Release", "InRelease", "Release.gpg"):
            shutil.copy(work / name, repo / name)
    return fpr, key


def build_repo(
    dest: Path,
    debs: list[Deb],
    toolkit_debs: list[Deb] | None = None,
    gpu_burn_tree: Path | None = None,
) -> dict[str, Any]:
    """Build and sign everything the server publishes under ``dest`` (which must not exist):
    the NVIDIA CUDA repository, the container toolkit repository, the gpu-burn tarball."""
    dest.mkdir(parents=True)
    fpr, keyring = _flat_repo(
        dest / "nvidia" / DISTRO / ARCH_DIR, debs, KEY_UID, armor=False, origin=ORIGIN, label=LABEL
    )
    # binary, like NVIDIA's cuda-archive-keyring.gpg
    (dest / "nvidia" / DISTRO / ARCH_DIR / KEYRING_NAME).write_bytes(keyring)
    meta: dict[str, Any] = {"key_fingerprint": fpr, "packages": len(debs), "distro": DISTRO}
    if toolkit_debs:
        tk_fpr, tk_key = _flat_repo(
            dest / TOOLKIT_URL_PATH / TOOLKIT_ARCH, toolkit_debs, TOOLKIT_KEY_UID, armor=True
        )
        (dest / TOOLKIT_KEY_PATH).write_bytes(tk_key)  # ASCII-armored, like NVIDIA's gpgkey
        meta.update(toolkit_key_fingerprint=tk_fpr, toolkit_packages=len(toolkit_debs))
    if gpu_burn_tree is not None:
        commit, tarball = gpu_burn_tarball(gpu_burn_tree)
        archive = dest / GPU_BURN_URL_PATH / f"{commit}.tar.gz"
        archive.parent.mkdir(parents=True)
        archive.write_bytes(tarball)
        meta.update(gpu_burn_commit=commit, gpu_burn_sha256=hashlib.sha256(tarball).hexdigest())
    (dest / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def driver_pin(debs: Iterable[Deb], package_version: str) -> str:
    """An apt pin like the deploy's: every package the repository builds at
    ``package_version``, at exactly that version (1001) and no other version (-1)."""
    names = " ".join(sorted({d.name for d in debs if d.version == package_version}))
    return (
        f"Package: {names}\nPin: version {package_version}\nPin-Priority: 1001\n\n"
        f"Package: {names}\nPin: version *\nPin-Priority: -1\n"
    )


def check_driver_install(
    real: debian_real.RealArchive,
    repo: Path,
    debs: Iterable[Deb],
    cat: dict[str, Any] | None = None,
    branch: str = DRIVER_BRANCHES[0],
) -> list[str]:
    """Problems with installing the branch's driver from the built repository ``repo`` next
    to Debian's own archive, as NVIDIA documents it (``apt-get install nvidia-driver-cuda
    nvidia-kernel-dkms``, or -open-dkms; exact versions, no Recommends) under a pin like the
    deploy's (``driver_pin``), asked of apt's real resolver in a private apt root: it must
    resolve, install from the stand-in repository only packages derived from Debian's real
    ones (never a metadata-only one) and no other driver build."""
    cat = cat or catalog.load()
    debs = list(debs)
    pv = cat["driver"]["branches"][branch]["package_version"]["debian"]
    by_name = {d.name: d for d in debs if d.version == pv}
    problems = []
    for dkms in ("nvidia-kernel-dkms", "nvidia-kernel-open-dkms"):
        command = ["install", "--no-install-recommends", f"nvidia-driver-cuda={pv}", f"{dkms}={pv}"]
        what = "apt-get -s " + " ".join(command)
        result = debian_real.simulate(real, [repo], command, preferences=driver_pin(debs, pv))
        if result.returncode != 0:
            problems.append(f"{what} does not resolve:\n" + (result.stdout + result.stderr)[-3000:])
            continue
        installs = debian_real.simulated_installs(result.stdout)
        for name, version in sorted(installs.items()):
            deb = by_name.get(name)
            if version == pv and (deb is None or "control fields only" in deb.standin_of):
                problems.append(
                    f"{what} installs {name} {version}, a stand-in without Debian's real "
                    "packaging behind it"
                )
            driver_build = re.match(r"^\d{3}\.\d+\.\d+$", debian_real.upstream(version))
            if version != pv and driver_build:
                problems.append(f"{what} installs {name} {version}, another driver build")
        if dkms not in installs:
            problems.append(f"{what} does not install {dkms}")
    return problems


def ensure_repo(
    base: Path,
    rebuild: bool = False,
    progress: Progress = lambda message: None,
    real_base: Path | None = None,
) -> Path:
    """Everything the server publishes, for the current inputs (cached under ``base``); its
    root directory. The driver packages derive from Debian's real ones, cached in
    ``real_base`` (default: ``debian-real`` beside ``base``) and fetched once when missing."""
    real = debian_real.ensure(real_base or base.parent / "debian-real", progress)
    debs = all_packages(real=real)
    toolkit_debs = all_toolkit_packages()
    tree = standin.GPU_BURN_TREE
    _, tarball = gpu_burn_tarball(tree)
    digest = _input_digest([*debs, *toolkit_debs], [tarball])
    dest = base / digest
    if (dest / "meta.json").exists() and not rebuild:
        return dest
    base.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    progress(
        f"building the stand-in NVIDIA repositories ({len(debs)} + {len(toolkit_debs)} "
        "packages) and the gpu-burn tarball"
    )
    tmp = base / f".building-{digest}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build_repo(tmp, debs, toolkit_debs, tree)
        problems = check_driver_install(real, tmp / "nvidia" / DISTRO / ARCH_DIR, debs)
        if problems:
            raise RepoError(
                "the stand-in driver packages do not install as NVIDIA documents it:\n"
                + "\n".join(problems)
            )
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in base.iterdir():  # repositories of older inputs (small: delete now)
        if old != dest and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    progress(f"stand-in repositories built in {time.monotonic() - started:.1f} s")
    return dest


def repo_facts(root: Path, port: int) -> dict[str, Any]:
    """The box.json facts of a built repository served on 127.0.0.1:``port``."""
    meta = json.loads((root / "meta.json").read_text())
    server = f"http://127.0.0.1:{port}/"
    base = server + URL_PATH
    facts: dict[str, Any] = {
        "repo_root": str(root),
        "repo_url": base,
        "repo_distro": meta["distro"],
        "repo_suite": "/",
        "repo_origin": ORIGIN,
        "repo_label": LABEL,
        "key_url": base + KEYRING_NAME,
        "key_fingerprint": meta["key_fingerprint"],
    }
    if "toolkit_key_fingerprint" in meta:
        facts.update(
            # "$(ARCH)" is kept for apt to expand, as in NVIDIA's own list file
            toolkit_repo_url=server + TOOLKIT_URL_PATH + "$(ARCH)",
            toolkit_repo_suite="/",
            toolkit_key_url=server + TOOLKIT_KEY_PATH,
            toolkit_key_fingerprint=meta["toolkit_key_fingerprint"],
        )
    if "gpu_burn_commit" in meta:
        facts.update(
            # "{commit}" is kept, as in catalog.yml gpu_burn.url
            gpu_burn_url=server + GPU_BURN_URL_PATH + "{commit}.tar.gz",
            gpu_burn_commit=meta["gpu_burn_commit"],
            gpu_burn_sha256=meta["gpu_burn_sha256"],
        )
    return facts


# --------------------------------------------------------------------------- serving


class _Range:
    """A file object that reads ``length`` bytes from ``start`` (a 206 response's body)."""

    def __init__(self, f: Any, start: int, length: int) -> None:
        self._f = f
        self._left = length
        f.seek(start)

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        size = self._left if size < 0 else min(size, self._left)
        data: bytes = self._f.read(size)
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._f.close()


class _Handler(StderrLog, http.server.SimpleHTTPRequestHandler):
    # URL path (no leading slash) -> a file served there from outside the root (the llama.cpp
    # tarball and the tiny model live in caches of their own)
    files: dict[str, str] = {}

    def copyfile(self, source: Any, outputfile: Any) -> None:
        """The body, at the sandbox's --download-rate when it has one (gpubox.sandbox.serve)."""
        paced_copy(source, outputfile.write, download_rate())

    def translate_path(self, path: str) -> str:
        url_path = urllib.parse.unquote(urllib.parse.urlsplit(path).path).lstrip("/")
        if url_path in self.files:
            return self.files[url_path]
        return super().translate_path(path)

    def send_head(self) -> Any:
        """Single byte ranges (``Range: bytes=N-``, ``N-M``, ``-N``), as GitHub's and Hugging
        Face's servers answer them, so that a resumed download (curl -C -) works here too."""
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        span = parse_range(self.headers.get("Range"), size)
        if span is None:
            return super().send_head()
        if not isinstance(span, tuple):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        start, end = span
        f = open(path, "rb")  # noqa: SIM115 (the caller closes it)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Last-Modified", self.date_time_string(int(os.fstat(f.fileno()).st_mtime)))
        self.end_headers()
        return _Range(f, start, end - start + 1)


def serve(
    root: Path,
    bind: str,
    port: int,
    watch: tuple[int, int] | None = None,
    files: dict[str, Path] | None = None,
) -> int:
    """Serve ``root`` (and ``files``: URL path -> file) until SIGTERM, or until the watched
    process (the box's supervisor) is gone. Requests are handled one at a time with a 1 s poll,
    so the loop always ends."""
    handler_class = type(
        "Handler", (_Handler,), {"files": {k.lstrip("/"): str(v) for k, v in (files or {}).items()}}
    )
    handler = functools.partial(handler_class, directory=str(root))
    return serve_until_stopped(
        handler, bind, port, lambda bound: f"serving {root} on http://{bind}:{bound}/", watch
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpubox.sandbox.repo")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build (or reuse) the stand-in repository")
    build.add_argument("--cache", type=Path, required=True)
    build.add_argument("--rebuild", action="store_true")
    srv = sub.add_parser("serve", help="serve a built repository (in the box's namespace)")
    srv.add_argument("--root", type=Path, required=True)
    srv.add_argument("--bind", default="127.0.0.1")
    srv.add_argument("--port", type=int, required=True)
    srv.add_argument("--watch-pid", type=int)
    srv.add_argument("--watch-start-time", type=int)
    srv.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="URL_PATH=FILE",
        help="also serve FILE at URL_PATH (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.command == "build":
        root = ensure_repo(args.cache, args.rebuild, lambda m: print(m, file=sys.stderr))
        print(json.dumps(repo_facts(root, 8765), indent=1))
        return 0
    watch = (args.watch_pid, args.watch_start_time) if args.watch_pid else None
    files = file_arguments(parser, args.file, "URL_PATH=FILE")
    return serve(args.root, args.bind, args.port, watch, files)


if __name__ == "__main__":
    sys.exit(main())
