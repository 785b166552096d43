"""llama.cpp's source for the sandbox box: the catalog's own archive, byte for byte.

The catalog pins PyPI's llama-cpp-python sdist (it vendors a whole llama.cpp tree) by URL and
sha256. A test machine reaches PyPI, so this module downloads that sdist with pip (a user's
PyPI mirror or pip configuration applies), refuses it unless its sha256 is the catalog's, and
caches it under the gpubox cache dir. The sandbox's loopback server publishes the unchanged
file at a path that mirrors files.pythonhosted.org ("pypi" + the URL's path), and the sandbox
inventory overrides only ``llamacpp.url``: the box downloads, verifies and builds exactly what
a real box would, through the same override a user sets for a PyPI mirror.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from gpubox import catalog

Progress = Callable[[str], None]

# The loopback server's stand-in for files.pythonhosted.org.
SERVED_PREFIX = "pypi"
# An sdist's file name: <normalized project>-<version>.tar.gz
_SDIST_NAME = re.compile(r"^(?P<project>[A-Za-z0-9_.]+)-(?P<version>[^-/]+)\.tar\.gz$")


class LlamaCppSourceError(RuntimeError):
    """The llama.cpp source could not be obtained; the message says what to do."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pinned(host_catalog: dict[str, Any] | None = None) -> dict[str, str]:
    """The catalog's llama.cpp source: url, sha256, the sdist's file name, project, version."""
    llama = (host_catalog or catalog.load())["llamacpp"]
    url, sha256 = str(llama["url"]), str(llama["sha256"])
    name = urlparse(url).path.rsplit("/", 1)[-1]
    match = _SDIST_NAME.match(name)
    if not match:
        raise LlamaCppSourceError(
            f"catalog llamacpp.url ends in {name!r}, not an sdist's <project>-<version>.tar.gz"
        )
    return {
        "url": url,
        "sha256": sha256,
        "name": name,
        "project": match["project"].replace("_", "-"),
        "version": match["version"],
    }


def served_path(url: str) -> str:
    """Where the loopback server publishes the file of ``url`` (a files.pythonhosted.org URL):
    "pypi/packages/ec/e9/<hash>/<file>"."""
    return f"{SERVED_PREFIX}/{urlparse(url).path.lstrip('/')}"


def _pip_download(source: dict[str, str], tmp: Path, progress: Progress) -> Path:
    requirement = f"{source['project']}=={source['version']}"
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        # the sdist of this project only: its build backend, which pip installs to read the
        # sdist's metadata, may come as wheels (":all:" built them from source too: 4 minutes
        # on a 2-core machine, against 10 s)
        "--no-binary",
        source["project"],
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "-d",
        str(tmp),
        requirement,
    ]
    progress(f"downloading {source['name']} (the catalog's llama.cpp source) with pip, once")
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    output: list[str] = []
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(15):
            progress(f"  pip is still at it ({time.monotonic() - started:.0f} s)")

    threading.Thread(target=heartbeat, daemon=True).start()
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
            f"pip could not download {requirement} (exit {rc}; is PyPI or your pip index "
            "reachable?):\n" + "".join(output[-15:])
        )
    got = tmp / source["name"]
    if not got.exists():
        raise LlamaCppSourceError(
            f"pip downloaded {sorted(p.name for p in tmp.iterdir())}, not {source['name']}"
        )
    progress(f"downloaded in {time.monotonic() - started:.0f} s")
    return got


def ensure_sdist(base: Path, progress: Progress = lambda message: None) -> dict[str, Any]:
    """The catalog's sdist, verified against the catalog's sha256 and cached under
    ``base/<version>/``; returns its facts (path, served_path, sha256, size). Anything else
    in the cache (other versions, older files) is removed."""
    source = pinned()
    cache = base / source["version"]
    sdist = cache / source["name"]
    if sdist.exists() and _sha256(sdist) != source["sha256"]:
        progress(f"{sdist} is not the catalog's file (sha256 differs): downloading it again")
        sdist.unlink()
    if not sdist.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".download-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            got = _pip_download(source, tmp, progress)
            digest = _sha256(got)
            if digest != source["sha256"]:
                raise LlamaCppSourceError(
                    f"{source['name']} from your pip index has sha256 {digest}; the catalog "
                    f"pins {source['sha256']}: refused"
                )
            os.replace(got, sdist)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for old in [*base.iterdir(), *cache.iterdir()]:
        if old not in (cache, sdist):
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
    return {
        "path": str(sdist),
        "served_path": served_path(source["url"]),
        "sha256": source["sha256"],
        "size": sdist.stat().st_size,
    }


def main(argv: list[str] | None = None) -> int:
    """python -m gpubox.sandbox.llamacpp CACHE_DIR: fetch the sdist, print its facts."""
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m gpubox.sandbox.llamacpp CACHE_DIR", file=sys.stderr)
        return 2
    try:
        facts = ensure_sdist(Path(args[0]), lambda m: print(m, file=sys.stderr, flush=True))
    except LlamaCppSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(facts, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
