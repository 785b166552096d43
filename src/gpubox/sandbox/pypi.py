"""A PyPI mirror for the sandbox box: a PEP 503 simple index of real wheels, served on loopback.

The box reaches Debian's mirror through a bridge but no PyPI, as a box behind a company mirror
reaches only that mirror. What the box installs with pip (the model stage's tools:
huggingface_hub, catalog ``hf.hub_requirement``, and modelscope, ``modelscope.requirement``)
is downloaded here once, with the host's own pip (so the host's PyPI settings apply), as
wheels for the box: CPython 3.11 (Debian 12's python3) on x86_64 with glibc 2.36, every
dependency included. The wheels are cached under the gpubox cache dir, one directory per set
of requirements (each tool's under a base directory of its own, since a new set replaces the
others of its base); the hub server (hub.py) publishes them all as one simple index, and the
sandbox's inventory points ``pypi.index_url`` at it, through ``catalog_overrides`` like any
mirror.

PEP 503 in short: ``<index>/`` lists one link per project; ``<index>/<project>/`` lists one
link per file, whose URL may end in ``#sha256=<hex>`` (pip checks it); project names are
normalised (runs of ``-``, ``_`` and ``.`` become ``-``, lower case). A wheel's file name starts
with its distribution name, with ``-`` written as ``_`` (PEP 427).
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# The box: Debian 12's CPython 3.11 on x86_64, glibc 2.36 (manylinux tags up to 2_36 fit).
PYTHON_VERSION = "3.11"
ABIS = ("cp311", "abi3", "none")
PLATFORMS = (
    "manylinux_2_36_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
# Bump when the way the wheel set is fetched changes: it is part of the cache key.
FORMAT_VERSION = 1
DOWNLOAD_TIMEOUT_S = 600

Progress = Callable[[str], None]


class PyPIMirrorError(RuntimeError):
    """The wheels could not be fetched; the message says what to do."""


def normalize(name: str) -> str:
    """A project name as PEP 503 writes it in URLs."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(filename: str) -> str:
    """The normalised project name of a wheel (or sdist) file name."""
    if filename.endswith(".whl"):
        return normalize(filename.split("-", 1)[0])
    stem = re.sub(r"\.(tar\.gz|zip)$", "", filename)
    return normalize(stem.rsplit("-", 1)[0])


def _key(requirements: list[str]) -> str:
    recipe = {
        "requirements": sorted(requirements),
        "python": PYTHON_VERSION,
        "abis": ABIS,
        "platforms": PLATFORMS,
        "format": FORMAT_VERSION,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def download_argv(requirements: list[str], dest: Path) -> list[str]:
    """pip download, for the box's interpreter and platform (binary wheels only)."""
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--only-binary=:all:",
        "--python-version",
        PYTHON_VERSION,
        "--implementation",
        "cp",
    ]
    for abi in ABIS:
        argv += ["--abi", abi]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    return [*argv, "-d", str(dest), *requirements]


def ensure_wheels(base: Path, requirements: list[str], progress: Progress) -> Path:
    """The directory of wheels for ``requirements`` and their dependencies (fetched once)."""
    dest = base / _key(requirements)
    if (dest / ".complete").exists():
        return dest
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".download-{dest.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    progress(f"downloading wheels for the box's PyPI mirror with pip: {' '.join(requirements)}")
    started = time.monotonic()
    try:
        proc = subprocess.run(
            download_argv(requirements, tmp),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DOWNLOAD_TIMEOUT_S,
        )
        if proc.returncode != 0:
            raise PyPIMirrorError(
                f"pip could not download {' '.join(requirements)} for the box (exit "
                f"{proc.returncode}; is PyPI or your pip index reachable?):\n"
                + (proc.stdout + proc.stderr)[-3000:]
            )
        if not any(tmp.glob("*.whl")):
            raise PyPIMirrorError(f"pip downloaded no wheel for {' '.join(requirements)}")
        (tmp / ".complete").write_text(json.dumps({"requirements": requirements}) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    except subprocess.TimeoutExpired as exc:
        raise PyPIMirrorError(f"pip download took over {DOWNLOAD_TIMEOUT_S} s") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in base.iterdir():  # wheel sets of other requirements
        if old != dest and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    progress(
        f"{len(list(dest.glob('*.whl')))} wheels downloaded in {time.monotonic() - started:.1f} s"
    )
    return dest


class SimpleIndex:
    """The pages of a PEP 503 index over one or more directories of distribution files (the
    wheel sets of several tools: a file name in two of them is the same file, from PyPI).
    The links are relative to the project page."""

    def __init__(self, directory: Path | Sequence[Path]) -> None:
        directories = [directory] if isinstance(directory, Path) else list(directory)
        self.projects: dict[str, dict[str, str]] = {}  # project -> file name -> sha256
        self.paths: dict[str, Path] = {}  # file name -> file
        for path in sorted(p for d in directories for p in d.iterdir()):
            if path.name in self.paths:
                continue
            if path.suffix == ".whl" or path.name.endswith((".tar.gz", ".zip")):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                self.projects.setdefault(project_of(path.name), {})[path.name] = digest
                self.paths[path.name] = path

    def root_page(self) -> str:
        links = "\n".join(
            f'    <a href="{html.escape(p)}/">{html.escape(p)}</a><br/>'
            for p in sorted(self.projects)
        )
        return _page("Simple index", links)

    def project_page(self, project: str) -> str | None:
        files = self.projects.get(normalize(project))
        if files is None:
            return None
        links = "\n".join(
            f'    <a href="../../files/{html.escape(name)}#sha256={digest}">'
            f"{html.escape(name)}</a><br/>"
            for name, digest in sorted(files.items())
        )
        return _page(f"Links for {html.escape(normalize(project))}", links)

    def file(self, name: str) -> Path | None:
        if "/" in name or name.startswith("."):
            return None
        return self.paths.get(name)


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>{title}</title>\n  </head>\n  <body>\n    <h1>{title}</h1>\n"
        f"{body}\n  </body>\n</html>\n"
    )
