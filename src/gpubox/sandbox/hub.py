"""A Hugging Face Hub mirror for the sandbox box, on loopback: the Hub's download API as the
real ``hf`` client (huggingface_hub) uses it, so that the model stage's default path
(``model_source: "hf"`` with ``hf_endpoint``) runs for real, exactly as for a user behind a mirror.

What ``hf download REPO FILE --local-dir DIR`` asks of ``HF_ENDPOINT`` (huggingface_hub 1.x,
file_download.py ``_hf_hub_download_to_local_dir``), and what this server answers:

- ``HEAD /{repo}/resolve/{revision}/{file}`` (revision ``main`` unless asked otherwise): the
  file's metadata, from the headers alone. ``X-Repo-Commit`` (the 40-hex commit the revision
  points at; without it the client refuses the endpoint as "not a Hub"), ``ETag`` (for a file
  kept in Git LFS: its sha256; for a plain Git file: its git blob sha1), for LFS files also
  ``X-Linked-Etag`` and ``X-Linked-Size`` (which the client prefers, since the Hub answers LFS
  files with a redirect to a CDN), and ``Content-Length``. No ``X-Xet-Hash`` or other Xet
  header: the client then downloads over plain HTTP even with hf_xet installed.
- ``GET`` of the same URL: the bytes, with ``Range: bytes=N-`` answered 206 with
  ``Content-Range``. The client streams into ``DIR/.cache/huggingface/download/*.incomplete``
  and, when the connection breaks (a protocol error, a timeout), asks again from where it stopped
  with a Range request, up to five times in one run, then moves the file into ``DIR``. It does
  not check the bytes against the sha256: gpubox does.
- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{revision}``: the model's info
  (``sha``, ``siblings``), as ``HfApi.model_info`` reads it (``?blobs=true`` adds sizes and the
  LFS sha256s).
- ``POST /api/models/{repo}/paths-info/{revision}`` (a form ``paths=...&expand=true``, as
  ``HfApi.get_paths_info`` posts it with httpx, or the same as JSON, as huggingface.js's
  ``pathsInfo`` does): one entry per path that exists, with the fields huggingface_hub's
  ``RepoFile`` reads (type, path, size, oid, ``lfs.oid``/``size``/``pointerSize``, and with
  expand ``lastCommit.id``/``title``/``date``: the commit that last changed the file).
- ``GET /api/models/{repo}/commits/{revision}``: the commits newest first, with the fields
  ``HfApi.list_repo_commits`` reads (id, title, message, authors[].user, date), a page at a
  time (``p``; ``limit``, which huggingface.js's ``listCommits`` sends), the next page behind
  ``Link: <URL>; rel="next"`` as huggingface_hub's ``paginate`` follows it.
- A history: the Hub's "initial commit", the upload, and the re-uploads ``gpubox sandbox hub
  reupload`` adds (``add_reupload``: a file the server reads again when it changes). Every
  commit of it answers as a revision (``resolve``, model info, paths-info, commits); ``main``
  is the newest.
- Errors carry ``X-Error-Code`` as the Hub's do: an unknown repository ``RepoNotFound`` (401, as
  the Hub answers for a repository it will not reveal), an unknown revision ``RevisionNotFound``
  (404), an unknown file ``EntryNotFound`` (404).

The server answers ``/resolve`` itself (200 or 206) instead of redirecting to a CDN, as a mirror
that proxies the CDN does. It also serves a PEP 503 index of real wheels under ``/pypi/simple/``
(pypi.py), since the box reaches no PyPI.

For the tests, a control file (JSON, read at each download) slows the bytes down
(``{"rate": BYTES_PER_S}``), drops the connection once after N bytes (``{"drop_after": N}``,
removed from the file once done), or alters one byte of what is sent (``{"corrupt": true}``)
while the headers keep the real sha256. Every request is logged as one JSON line (method, path,
Range, status, body bytes sent).

The server binds 127.0.0.1 inside the box's network namespace and exits when the box's
supervisor is gone (or on SIGTERM), so it never outlives the box.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.sandbox.common import HUB_PORT
from gpubox.sandbox.pypi import SimpleIndex
from gpubox.sandbox.serve import (
    ControlFile,
    RequestLog,
    StderrLog,
    download_rate,
    file_arguments,
    paced_write,
    parse_range,
    read_log,  # noqa: F401  (the tests read this server's request log through it)
    serve_until_stopped,
)

REPO_ID = "gpubox/tiny-GGUF"  # where the sandbox's tiny model is published
REVISION = "main"
# The titles of the Hub's first commit and of huggingface_hub's upload_folder
INITIAL_TITLE = "initial commit"
UPLOAD_TITLE = "Upload folder using huggingface_hub"
# The commits list's page when the request names no ``limit`` (a guess: STANDINS.md);
# further pages behind ``Link: <URL>; rel="next"``
COMMITS_PAGE = 50
PYPI_PREFIX = "/pypi/"  # /pypi/simple/ (the index), /pypi/files/ (the wheels)
# What the Hub keeps in Git LFS: model weights; any file this large in any case.
LFS_SUFFIXES = (".gguf", ".bin", ".safetensors", ".pt", ".onnx")
LFS_MIN_SIZE = 10 * 2**20
CHUNK = 64 * 1024
MIN_RATE = 1024  # bytes/s: a throttled download still ends
# A large file beside the model, for the download tests: hf's client hands the bytes to disk
# in 10 MiB chunks (httpx buffers each whole chunk), so with a smaller file nothing shows on
# disk before the end, and a broken connection is fetched again from the start rather than
# resumed with a Range request (only bytes already on disk count).
LARGE_FILE = "gpubox-large-test.bin"
LARGE_FILE_SIZE = 32 * 2**20
LARGE_FILE_SEED = b"gpubox-hub-large-test-1"
# What the Hub answers for the harness registry huggingface_hub's CLI fetches (best effort).
AGENT_HARNESSES: dict[str, Any] = {"standardEnvVars": [], "harnesses": {}}


@dataclass(frozen=True)
class HubFile:
    name: str
    path: Path
    size: int
    sha256: str
    git_sha1: str
    lfs: bool

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1


@dataclass(frozen=True)
class HubRepo:
    """The repository at one commit (``parent``: the one before it; None for the first)."""

    repo_id: str
    files: dict[str, HubFile]
    commit: str
    last_modified: str
    title: str = UPLOAD_TITLE
    parent: HubRepo | None = None

    def history(self) -> list[HubRepo]:
        """This commit and every one before it, newest first."""
        out: list[HubRepo] = []
        at: HubRepo | None = self
        while at is not None:
            out.append(at)
            at = at.parent
        return out

    def at(self, revision: str) -> HubRepo | None:
        """The repository at ``revision`` (``main``: this commit; or any commit of its
        history), None when there is no such revision."""
        if revision == REVISION:
            return self
        return next((c for c in self.history() if c.commit == revision), None)

    def last_commit(self, name: str) -> HubRepo:
        """The commit that last changed ``name`` (which this commit has)."""
        at = self
        while at.parent is not None and _same(at.parent.files.get(name), at.files[name]):
            at = at.parent
        return at

    def commit_entry(self) -> dict[str, Any]:
        """The commit as the Hub's commits list gives it (what ``HfApi.list_repo_commits``
        reads: id, authors[].user, date, title, message; huggingface_hub 1.33 hf_api.py)."""
        author = self.repo_id.split("/", 1)[0]
        return {
            "id": self.commit,
            "title": self.title,
            "message": "",
            "authors": [{"user": author, "avatar": None}],
            "date": self.last_modified,
        }

    def path_info(self, name: str, expand: bool) -> dict[str, Any] | None:
        """A file's entry in the Hub's paths-info answer (what huggingface_hub's ``RepoFile``
        reads: path, size, oid, lfs.oid/size/pointerSize; with expand, lastCommit.id/title/
        date); None when this commit has no such file."""
        f = self.files.get(name)
        if f is None:
            return None
        entry: dict[str, Any] = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": name}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        if expand:
            last = self.last_commit(name)
            entry["lastCommit"] = {
                "id": last.commit,
                "title": last.title,
                "date": last.last_modified,
            }
        return entry

    def info(self, blobs: bool = False) -> dict[str, Any]:
        """The model info the Hub's /api/models answers (the fields huggingface_hub reads)."""
        siblings = []
        for f in sorted(self.files.values(), key=lambda f: f.name):
            sibling: dict[str, Any] = {"rfilename": f.name}
            if blobs:
                sibling.update(size=f.size, blobId=f.git_sha1)
                if f.lfs:
                    sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
            siblings.append(sibling)
        author = self.repo_id.split("/", 1)[0]
        return {
            "_id": self.commit[:24],
            "id": self.repo_id,
            "modelId": self.repo_id,
            "author": author,
            "sha": self.commit,
            "lastModified": self.last_modified,
            "createdAt": self.last_modified,
            "private": False,
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["gguf"],
            "library_name": "gguf",
            "siblings": siblings,
            "usedStorage": sum(f.size for f in self.files.values()),
        }


def _same(a: HubFile | None, b: HubFile) -> bool:
    return a is not None and a.sha256 == b.sha256


def _digests(path: Path) -> tuple[int, str, str]:
    """(size, sha256, git blob sha1) of a file."""
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(f"blob {size}\0".encode())  # noqa: S324 (git's object id)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha256.update(block)
            sha1.update(block)
    return size, sha256.hexdigest(), sha1.hexdigest()


def _file(name: str, path: Path) -> HubFile:
    size, sha256, git_sha1 = _digests(path)
    lfs = name.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE
    return HubFile(name, path, size, sha256, git_sha1, lfs)


def _date(seconds: float) -> str:
    stamp = datetime.datetime.fromtimestamp(int(seconds), datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def make_repo(repo_id: str, files: dict[str, Path]) -> HubRepo:
    """A repository of ``files`` (name in the repository -> file) in one commit after the
    repository's "initial commit" (which the Hub makes when a repository is created; it holds
    no file here, the Hub's a ``.gitattributes``); the commit id is derived from the
    repository's content, so it is stable while the files are."""
    entries = {name: _file(name, path) for name, path in files.items()}
    tree = json.dumps([repo_id, sorted((f.name, f.sha256) for f in entries.values())])
    commit = hashlib.sha1(tree.encode()).hexdigest()  # noqa: S324 (an id, as git's)
    mtime = max((p.stat().st_mtime for p in files.values()), default=0)
    initial = hashlib.sha1(json.dumps([repo_id, INITIAL_TITLE]).encode()).hexdigest()  # noqa: S324
    first = HubRepo(repo_id, {}, initial, _date(mtime), INITIAL_TITLE)
    return HubRepo(repo_id, entries, commit, _date(mtime), parent=first)


def reupload(repo: HubRepo, name: str, path: Path, title: str, date: str) -> HubRepo:
    """``repo`` with one more commit on main: ``name`` now holds the bytes of ``path`` (as a
    re-upload of a model's file makes one); the commits before it stay in the history."""
    files = {**repo.files, name: _file(name, path)}
    change = json.dumps([repo.commit, name, files[name].sha256])
    commit = hashlib.sha1(change.encode()).hexdigest()  # noqa: S324 (an id, as git's)
    return HubRepo(repo.repo_id, files, commit, date, title, repo)


def ensure_large_file(directory: Path) -> Path:
    """The large test file (pseudo-random, the same bytes every time), written once."""
    path = directory / LARGE_FILE
    if path.exists() and path.stat().st_size == LARGE_FILE_SIZE:
        return path
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{LARGE_FILE}.{os.getpid()}"
    with open(tmp, "wb") as f:
        for i in range(LARGE_FILE_SIZE // 2**20):
            f.write(hashlib.shake_256(LARGE_FILE_SEED + i.to_bytes(4, "big")).digest(2**20))
    tmp.rename(path)
    return path


# --------------------------------------------------------------------------- control


class Control(ControlFile):
    """The test controls, from a JSON file read at each download (absent: none)."""

    def take_drop(self) -> int | None:
        """The byte count after which to drop this download's connection, at most once: the
        key is removed from the file as it is taken."""
        with self._lock:
            data = self.read()
            drop = data.pop("drop_after", None)
            if not isinstance(drop, int) or isinstance(drop, bool) or drop < 0:
                return None
            self._write(data)
            return drop


class Reuploads:
    """The commits ``gpubox sandbox hub reupload`` added (``add_reupload``): a JSON list in a
    file, each ``{"repo", "file", "path", "title", "date"}``, applied in order on top of the
    repositories the server started with; read again whenever the file changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._repos: dict[str, HubRepo] = {}

    def apply(self, base: dict[str, HubRepo]) -> dict[str, HubRepo]:
        try:
            stat = self.path.stat() if self.path else None
        except FileNotFoundError:
            stat = None
        if stat is None:
            return base
        with self._lock:
            if self._seen != (stat.st_mtime_ns, stat.st_size):
                self._repos = apply_reuploads(base, read_reuploads(self.path))
                self._seen = (stat.st_mtime_ns, stat.st_size)
            return self._repos


def read_reuploads(path: Path | None) -> list[dict[str, str]]:
    try:
        entries = json.loads(path.read_text()) if path else []
    except (OSError, ValueError):
        return []
    return entries if isinstance(entries, list) else []


def apply_reuploads(base: dict[str, HubRepo], entries: list[dict[str, str]]) -> dict[str, HubRepo]:
    repos = dict(base)
    for e in entries:
        if e.get("repo") in repos:
            repo = repos[e["repo"]]
            repos[e["repo"]] = reupload(repo, e["file"], Path(e["path"]), e["title"], e["date"])
    return repos


# --------------------------------------------------------------------------- the handler


class HubHandler(StderrLog):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects of the Hub
    server_version = "gpubox-sandbox-hub"
    timeout = 120  # seconds a connection may stall (an idle keep-alive one ends too)
    repos: dict[str, HubRepo] = {}
    pypi: SimpleIndex | None = None
    control: Control = Control(None)
    requests: RequestLog = RequestLog(None)
    reuploads: Reuploads = Reuploads(None)
    commits_page = COMMITS_PAGE

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def do_POST(self) -> None:
        self.close_connection = True  # a body this server may not read ends the connection
        self._route(body=True)

    # ----------------------------------------------------------------- routing

    def _route(self, body: bool) -> None:
        self._entry: dict[str, Any] = {
            "time": time.time(),
            "method": self.command,
            "path": self.path,
            "range": self.headers.get("Range"),
            "bytes": 0,
        }
        try:
            self._dispatch(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            self._entry["broken"] = True
        finally:
            self.requests.write(self._entry)

    def _dispatch(self, body: bool) -> None:
        split = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(split.path)
        query = urllib.parse.parse_qs(split.query)
        if path.startswith(PYPI_PREFIX):
            self._pypi(path[len(PYPI_PREFIX) :], body)
            return
        if path == "/api/agent-harnesses":
            data = json.dumps(AGENT_HARNESSES).encode()
            self._send(200, data, "application/json; charset=utf-8", body)
            return
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/") :].strip("/").split("/")
            if len(rest) >= 4 and rest[2] in ("paths-info", "commits"):
                repo_id, revision = "/".join(rest[:2]), "/".join(rest[3:])
                if rest[2] == "paths-info" and self.command == "POST":
                    self._paths_info(repo_id, revision)
                elif rest[2] == "commits" and self.command == "GET":
                    self._commits(repo_id, revision, query)
                else:
                    self._error(405, None, "Method Not Allowed", "Method Not Allowed", body)
                return
            self._model_info(path[len("/api/models/") :], query, body)
            return
        parts = path.lstrip("/").split("/", 4)
        if len(parts) == 5 and parts[2] == "resolve":
            self._resolve(f"{parts[0]}/{parts[1]}", parts[3], parts[4], body)
            return
        self._error(404, None, "Not Found", "This route is not served by the sandbox's hub", body)

    def _repo(self, repo_id: str, revision: str, body: bool) -> HubRepo | None:
        """The repository at ``revision`` (main or one of its commits), else the Hub's error."""
        repo = self.reuploads.apply(self.repos).get(repo_id)
        if repo is None:
            self._error(
                401,
                "RepoNotFound",
                f"Repository Not Found for url: {self.path}.",
                "Repository not found",
                body,
            )
            return None
        at = repo.at(revision)
        if at is None:
            self._error(
                404,
                "RevisionNotFound",
                f"Invalid rev id: {revision}",
                f"Revision Not Found for url: {self.path}.",
                body,
                commit=None,
            )
            return None
        return at

    def _paths_info(self, repo_id: str, revision: str) -> None:
        """``POST /api/models/{repo}/paths-info/{revision}``: the entries of the paths asked
        for that exist (``RepoFile`` fields), as ``HfApi.get_paths_info`` asks (a form,
        ``paths`` repeated and ``expand=true``; huggingface.js sends the same as JSON)."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(min(length, 1 << 20)).decode("utf-8", "replace")
        if self.headers.get("Content-Type", "").startswith("application/json"):
            try:
                data = json.loads(raw)
            except ValueError:
                data = {}
            data = data if isinstance(data, dict) else {}
            paths = data.get("paths") or []
            expand = data.get("expand") is True
        else:
            form = urllib.parse.parse_qs(raw)
            paths = form.get("paths", [])
            expand = form.get("expand", ["false"])[-1].lower() in ("1", "true")
        repo = self._repo(repo_id, revision, True)
        if repo is None:
            return
        entries = [e for e in (repo.path_info(str(n), expand) for n in paths) if e is not None]
        self._send(200, json.dumps(entries).encode(), "application/json; charset=utf-8", True)

    def _commits(self, repo_id: str, revision: str, query: dict[str, list[str]]) -> None:
        """``GET /api/models/{repo}/commits/{revision}``: the commits newest first, a page at
        a time (``p``, from 0; ``limit``), the next page behind a ``Link`` header."""
        repo = self._repo(repo_id, revision, True)
        if repo is None:
            return
        page = _number(query.get("p"), 0)
        limit = min(max(_number(query.get("limit"), self.commits_page), 1), 1000)
        history = repo.history()
        entries = [c.commit_entry() for c in history[page * limit : (page + 1) * limit]]
        headers = {}
        if (page + 1) * limit < len(history):
            host = self.headers.get("Host") or "127.0.0.1"
            split = urllib.parse.urlsplit(self.path)
            params = {"p": str(page + 1), **({"limit": str(limit)} if "limit" in query else {})}
            url = f"http://{host}{split.path}?{urllib.parse.urlencode(params)}"
            headers["Link"] = f'<{url}>; rel="next"'
        data = json.dumps(entries).encode()
        self._send(200, data, "application/json; charset=utf-8", True, headers)

    def _model_info(self, rest: str, query: dict[str, list[str]], body: bool) -> None:
        parts = rest.strip("/").split("/")
        if len(parts) == 2:
            repo_id, revision = "/".join(parts), REVISION
        elif len(parts) >= 4 and parts[2] == "revision":
            repo_id, revision = "/".join(parts[:2]), "/".join(parts[3:])
        else:
            self._error(404, None, "Not Found", "Not Found", body)
            return
        repo = self._repo(repo_id, revision, body)
        if repo is None:
            return
        blobs = query.get("blobs", ["false"])[-1].lower() in ("1", "true")
        data = json.dumps(repo.info(blobs=blobs)).encode()
        self._send(
            200, data, "application/json; charset=utf-8", body, {"X-Repo-Commit": repo.commit}
        )

    def _resolve(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
        repo = self._repo(repo_id, revision, body)
        if repo is None:
            return
        f = repo.files.get(filename)
        if f is None:
            self._error(
                404,
                "EntryNotFound",
                f'{filename} does not exist on "{revision}"',
                f"Entry Not Found for url: {self.path}.",
                body,
                commit=repo.commit,
            )
            return
        headers = {
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{f.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": (
                f"inline; filename*=UTF-8''{urllib.parse.quote(f.name.rsplit('/', 1)[-1])}; "
                f'filename="{f.name.rsplit("/", 1)[-1]}";'
            ),
        }
        if f.lfs:
            headers.update({"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.size)})
        content_type = "application/octet-stream" if f.lfs else "text/plain; charset=utf-8"
        span = parse_range(self.headers.get("Range"), f.size)
        if span == "unsatisfiable":
            headers["Content-Range"] = f"bytes */{f.size}"
            self._send(416, b"", content_type, body, headers)
            return
        start, end = span if isinstance(span, tuple) else (0, f.size - 1)
        status = 206 if isinstance(span, tuple) else 200
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
        self._entry["status"] = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(end - start + 1))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self._stream(f, start, end - start + 1)

    def _stream(self, f: HubFile, start: int, length: int) -> None:
        """The bytes of ``f`` from ``start``, under the controls (rate, drop, corrupt)."""
        control = self.control.read()
        rate = control.get("rate")
        rate = max(MIN_RATE, int(rate)) if isinstance(rate, int | float) and rate > 0 else None
        rate = rate or download_rate()  # the test's rate, else the sandbox's (--download-rate)
        corrupt = control.get("corrupt") is True
        drop = self.control.take_drop() if "drop_after" in control else None
        flip = f.size // 2  # the one byte a corrupt download alters
        self._entry.update(rate=rate, corrupt=corrupt, drop_after=drop)
        chunk = CHUNK if rate is None else max(1024, min(CHUNK, rate // 8))
        sent = 0
        began = time.monotonic()
        with open(f.path, "rb") as src:
            src.seek(start)
            while sent < length:
                want = min(chunk, length - sent)
                if drop is not None:
                    want = min(want, drop - sent)
                    if want <= 0:
                        # the connection breaks mid-body, as a network fault would break it
                        self.wfile.flush()
                        with contextlib.suppress(OSError):
                            self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        self._entry["dropped"] = True
                        return
                data = src.read(want)
                if not data:
                    break
                offset = start + sent
                if corrupt and offset <= flip < offset + len(data):
                    i = flip - offset
                    data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
                self.wfile.write(data)
                sent += len(data)
                self._entry["bytes"] = sent
                if rate is not None:
                    ahead = sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)

    def _pypi(self, rest: str, body: bool) -> None:
        index = self.pypi
        if index is None:
            self._send(404, b"no PyPI index here\n", "text/plain", body)
            return
        if rest in ("simple", "simple/"):
            self._send(200, index.root_page().encode(), "text/html; charset=utf-8", body)
            return
        if rest.startswith("simple/"):
            page = index.project_page(rest[len("simple/") :].strip("/"))
            if page is not None:
                self._send(200, page.encode(), "text/html; charset=utf-8", body)
                return
        if rest.startswith("files/"):
            path = index.file(rest[len("files/") :])
            if path is not None:
                self._send(200, path.read_bytes(), "application/octet-stream", body)
                return
        self._send(404, b"Not Found\n", "text/plain", body)

    # ----------------------------------------------------------------- responses

    def _send(
        self,
        status: int,
        data: bytes,
        content_type: str,
        body: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._entry["status"] = status
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if body and data:
            paced_write(self.wfile.write, data, download_rate())
            self._entry["bytes"] = len(data)

    def _error(
        self,
        status: int,
        code: str | None,
        message: str,
        error: str,
        body: bool,
        commit: str | None = None,
    ) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        if commit:
            headers["X-Repo-Commit"] = commit
        data = json.dumps({"error": error}).encode()
        self._send(status, data, "application/json; charset=utf-8", body, headers)


# --------------------------------------------------------------------------- serving


def handler_class(
    repos: dict[str, HubRepo],
    pypi_dir: Path | list[Path] | None = None,
    control: Path | None = None,
    request_log: Path | None = None,
    reuploads: Path | None = None,
) -> type[HubHandler]:
    return type(
        "Handler",
        (HubHandler,),
        {
            "repos": repos,
            "pypi": SimpleIndex(pypi_dir) if pypi_dir else None,
            "control": Control(control),
            "requests": RequestLog(request_log),
            "reuploads": Reuploads(reuploads),
        },
    )


def _number(values: list[str] | None, default: int) -> int:
    value = (values or [""])[-1]
    return int(value) if value.isdigit() else default


def serve(
    handler: type[HubHandler],
    bind: str,
    port: int,
    watch: tuple[int, int] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    ready: Callable[[int], None] = lambda port: None,
) -> int:
    """Serve until SIGTERM (in the main thread), ``should_stop()``, or until the watched
    process (the box's supervisor) is gone; polls every second, so the loop always ends.
    ``ready`` gets the bound port (``port`` 0: one the kernel picks)."""

    def describe(bound: int) -> str:
        return (
            f"hub on http://{bind}:{bound}/: "
            + ", ".join(sorted(handler.repos))
            + (" and a PyPI index at /pypi/simple/" if handler.pypi else "")
        )

    return serve_until_stopped(handler, bind, port, describe, watch, should_stop, ready)


def prepare(
    cache: Path, sdir: Path, model_path: Path, progress: Callable[[str], None]
) -> tuple[list[str], dict[str, Any]]:
    """What the sandbox's hub serves, made ready: the tiny model (``model_path``) and the large
    test file in the repository ``REPO_ID``, the wheels of catalog ``hf.hub_requirement`` for
    the PyPI index. Returns the server's arguments (after ``serve``) and the box.json facts.
    The control file and the request log start empty with each box."""
    from gpubox import catalog
    from gpubox.sandbox import pypi

    wheels = pypi.ensure_wheels(cache / "pypi", [catalog.load()["hf"]["hub_requirement"]], progress)
    large = ensure_large_file(cache / "hub")
    files = {model_path.name: model_path, LARGE_FILE: large}
    repo = make_repo(REPO_ID, files)
    control = sdir / "hub-control.json"
    request_log = sdir / "logs" / "hub-requests.jsonl"
    reuploads = sdir / "hub-reuploads.json"
    control.unlink(missing_ok=True)
    reuploads.unlink(missing_ok=True)
    request_log.parent.mkdir(parents=True, exist_ok=True)
    request_log.unlink(missing_ok=True)
    args = [
        "--bind",
        "127.0.0.1",
        "--port",
        str(HUB_PORT),
        "--repo",
        REPO_ID,
        *(f"--file={name}={path}" for name, path in files.items()),
        f"--pypi={wheels}",
        f"--control={control}",
        f"--request-log={request_log}",
        f"--reuploads={reuploads}",
    ]
    server = f"http://127.0.0.1:{HUB_PORT}"
    facts = {
        "hub_url": server,
        "hub_repo": REPO_ID,
        "hub_commit": repo.commit,
        "hub_files": {
            f.name: {"sha256": f.sha256, "size": f.size, "path": str(f.path)}
            for f in repo.files.values()
        },
        "hub_large_file": LARGE_FILE,
        "hub_control": str(control),
        "hub_request_log": str(request_log),
        # the commits `gpubox sandbox hub reupload` added (hub_commit and hub_files stay the
        # first upload's)
        "hub_reuploads": str(reuploads),
        # gpubox sandbox up --download-rate (0: unthrottled); every server the sandbox runs
        # itself caps its response bodies at it
        "download_rate": download_rate() or 0,
        "pypi_index_url": f"{server}{PYPI_PREFIX}simple",
        "pypi_wheels": str(wheels),
    }
    return args, facts


def add_reupload(info: dict[str, Any]) -> dict[str, str]:
    """``gpubox sandbox hub reupload``: a commit on main of the box's hub with other bytes for
    the model's file, as Unsloth's re-upload of its GGUFs made one: the tiny model written
    again with other weights where they do not change its answers (tinymodel.write's seed),
    so the file still loads and serves. The commits before it stay in the history; box.json
    (hub_commit, hub_files, model_sha256) keeps the first upload's. Returns the file, the new
    commit, the one before it and the new sha256."""
    from gpubox.sandbox import tinymodel

    path = Path(info["hub_reuploads"])
    entries = read_reuploads(path)
    name = info["model_file"]
    n = len(entries) + 1
    target = path.parent / "hub-reuploads" / str(n) / name
    tinymodel.write(target, seed=tinymodel.SEED + f"-reupload-{n}".encode())
    entries.append(
        {
            "repo": info["hub_repo"],
            "file": name,
            "path": str(target),
            "title": f"Upload {name} (re-upload {n})",
            "date": _date(time.time()),
        }
    )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(entries, indent=1))
    os.replace(tmp, path)
    files = {f: Path(v["path"]) for f, v in info["hub_files"].items()}
    repo = apply_reuploads({info["hub_repo"]: make_repo(info["hub_repo"], files)}, entries)
    head = repo[info["hub_repo"]]
    assert head.parent is not None
    return {
        "file": name,
        "commit": head.commit,
        "parent": head.parent.commit,
        "sha256": head.files[name].sha256,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpubox.sandbox.hub")
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve", help="serve the hub (in the box's namespace)")
    srv.add_argument("--bind", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=HUB_PORT)
    srv.add_argument("--repo", default=REPO_ID)
    srv.add_argument(
        "--file", action="append", default=[], metavar="NAME=FILE", help="a file of the repo"
    )
    srv.add_argument(
        "--pypi", type=Path, action="append", help="a directory of wheels to index under /pypi/"
    )
    srv.add_argument("--control", type=Path)
    srv.add_argument("--request-log", type=Path)
    srv.add_argument("--reuploads", type=Path, help="the re-uploads file (add_reupload)")
    srv.add_argument("--watch-pid", type=int)
    srv.add_argument("--watch-start-time", type=int)
    args = parser.parse_args(argv)
    if args.bind not in ("127.0.0.1", "::1", "localhost"):
        parser.error("the hub binds loopback only")
    repos = {args.repo: make_repo(args.repo, file_arguments(parser, args.file, "NAME=FILE"))}
    handler = handler_class(repos, args.pypi, args.control, args.request_log, args.reuploads)
    watch = (args.watch_pid, args.watch_start_time) if args.watch_pid else None
    return serve(handler, args.bind, args.port, watch)


if __name__ == "__main__":
    sys.exit(main())
