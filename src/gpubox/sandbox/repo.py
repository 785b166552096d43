"""The loopback HTTP server of the sandbox box's stand-in NVIDIA apt repositories, and what
the stand-in repositories hold.

The parts: the package model (repo_debs.py), the driver packages (repo_driver.py), the CUDA
toolkits, DCGM and the container toolkit (repo_tools.py), gpu-burn's source tarball
(repo_gpu_burn.py), building, signing and caching it all (repo_build.py); this module serves
the result (``serve``) and is the server's entry point (``main``).

NVIDIA's CUDA repository cannot be reached from a test machine, so the sandbox serves a
stand-in with the same shape: a flat repository (``deb [signed-by=KEYRING] URL /``) at
``http://127.0.0.1:8765/nvidia/debian12/x86_64/``, a Release file with Origin "NVIDIA" and
Label "NVIDIA CUDA", signed by a throwaway key published as a *binary* keyring
``cuda-archive-keyring.gpg`` (as NVIDIA publishes theirs).

It carries NVIDIA's Debian driver packages at three driver versions side by side, the R570 the
deploy pins, the catalog's R580 the pin must resist and a newer R580 build whose version is
invented for the tests (repo_driver.NEWER_580), plus the ``cuda-drivers`` trap and two CUDA
toolkits (12.8, and 13.0 as a second temptation). The driver packages are derived from
Debian 12's real packages of the same names (debian_real.py fetches them once): their control
fields, maintainer scripts, conffiles, alternatives and users are Debian's, re-versioned;
only what touches hardware (libraries, nvidia-smi, the daemons, firmware, the kernel module
source) is a stand-in, and NVIDIA's ``nvidia-driver-cuda``, which Debian lacks, is a recorded
guess. STANDINS.md lists every difference. All packages are built at run time with
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
  built from the stand-in source tree in ``standin/gpu-burn`` with fixed modes and times
  and ``gzip -n`` (tarball.py), so its sha256 is stable; the commit id is derived from the
  tree's content;
- files from caches of their own, given with ``--file URL_PATH=FILE``: the catalog's llama.cpp
  source, PyPI's sdist unchanged under ``pypi/packages/...`` (llamacpp.py), and the tiny GGUF
  model (tinymodel.py).

Single byte ranges are answered (206), as GitHub's and Hugging Face's servers do, so a resumed
download works against it.

``withdraw(VERSION)`` and ``restore()`` (repo_index.py; ``gpubox sandbox repo withdraw|restore``)
make the CUDA repository stop and start offering a driver build, as NVIDIA's repository drops
old builds: its indexes are rewritten and signed again, and a box sees the change at its next
``apt-get update``. The server serves no path with a component that begins with a dot (the
root's ``.withdraw/`` keeps the throwaway signing key that needs).

The server binds 127.0.0.1 inside the box's network namespace, and exits when the box's
supervisor process is gone (or on SIGTERM), so it never outlives the box.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from gpubox.sandbox.repo_build import ensure_repo, repo_facts
from gpubox.sandbox.repo_index import restore, served_builds, withdraw, withdrawn
from gpubox.sandbox.serve import (
    StderrLog,
    download_rate,
    file_arguments,
    paced_copy,
    parse_range,
    serve_until_stopped,
)


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
        """No dot paths (the root's .withdraw/ is not published). Single byte ranges
        (``Range: bytes=N-``, ``N-M``, ``-N``), as GitHub's and Hugging Face's servers answer
        them, so that a resumed download (curl -C -) works here too."""
        url_path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        # "." itself is no dot path: apt asks for the flat index's "Filename: ./NAME.deb"
        if any(part.startswith(".") and part != "." for part in url_path.split("/")):
            self.send_error(404, "File not found")
            return None
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


__all__ = [
    "ensure_repo",
    "main",
    "repo_facts",
    "restore",
    "serve",
    "served_builds",
    "withdraw",
    "withdrawn",
]

if __name__ == "__main__":
    sys.exit(main())
