"""A ModelScope mirror for the sandbox box, on loopback, over HTTPS: the API that the real
``modelscope download --model REPO FILE [--revision R] --local_dir DIR`` asks of its endpoint,
so that ``model_source: "modelscope"`` runs the real client (installed on the box with pip
from the sandbox's PyPI mirror), as for a user behind a private ModelScope mirror.

No record of the real server's answers could be reached from here: the routes and fields
below are those the clients request and read, from their source; what they do not read
(``Message``, ``RequestId``, the model's other fields) is a guess, kept small.

modelscope 1.20 to 1.37 (1.20.1, 1.35.0 and 1.36.3 read: modelscope/hub/api.py ``HubApi``,
modelscope/hub/file_download.py ``_repo_file_download``, ``http_get_model_file``):

- ``GET /api/v1/models/{owner}/{name}``: ``repo_exists`` (1.3x, from
  ``get_endpoint_for_read`` when MODELSCOPE_DOMAIN is set): 200 the repository exists, 404
  it does not.
- ``GET /api/v1/models/{repo}/revisions`` (also ``?EndTime=T``):
  ``get_model_branches_and_tags_details``: ``Data.RevisionMap.Branches`` and ``.Tags``, each
  ``{"Revision", "CreatedAt"}`` (epoch seconds). Unpinned, ``get_valid_revision_detail``
  takes the newest tag created before the client's own release
  (``version.__release_datetime__``), else ``master``; a revision that is neither a branch
  nor a tag the client refuses itself.
- ``GET /api/v1/models/{repo}/repo/files?Revision=R&Recursive=True``: ``get_model_files``:
  ``Data.Files``, each ``Name``, ``Path``, ``Type`` (``blob``; ``tree`` is skipped), ``Size``,
  ``Sha256`` (the client checks the file against it: ``file_integrity_validation``) and
  ``Revision`` (the commit: the key of the client's ``.msc`` cache list in DIR).
- Every JSON answer: ``Code`` 200 (``raise_on_error``), ``Data``, ``Message``,
  ``RequestId``, ``Success``; an HTTP 404 means "does not exist" (``handle_http_response``).
- ``GET /api/v1/models/{repo}/repo?Revision=R&FilePath=F`` (``get_file_download_url``): the
  bytes, always asked with ``Range: bytes=N-(size-1)`` and appended to
  ``DIR/._____temp/F``, which the next run resumes from its size.

modelscope 1.38 and later (the CLI is modelscope-hub's; 0.5.1 read: modelscope_hub/_download.py
``DownloadManager``, _legacy_api.py ``LegacyClient``):

- ``GET /api/v1/repos/internalAccelerationInfo`` (``_detect_region_uncached``, 0.2 s
  timeout; 1.3x: ``_get_internal_acceleration_domain``): Aliyun's intra-cloud region. The
  stand-in answers 404, which the client takes as "no region" (a guess: what the real site
  answers outside Aliyun is not known).
- ``GET /api/v1/models/{repo}/repo?Revision=R&FilePath=F`` (``download_stream``), revision
  ``master`` unless ``--revision``, with no listing before it: ``Range: bytes=N-`` when
  ``DIR/F.incomplete`` holds N bytes (``_download_with_resume``); a 206 must carry
  ``Content-Range`` from N. ``X-Linked-ETag`` (the sha256 of a file kept in LFS: "the LFS CDN
  returns the object SHA-256", its comment) makes the client check the bytes itself.

The real site answers an LFS file with a redirect to its storage (OSS, a CDN); the stand-in
sends the bytes itself, as a mirror that proxies the storage would. It serves HTTPS (both
client generations put ``https://`` in front of the domain) with a certificate for
127.0.0.1 from a CA made for each box (``make_tls``, openssl); the box trusts that CA only
through the inventory's ``modelscope_ca_bundle`` (REQUESTS_CA_BUNDLE), as a user's private
mirror would be trusted.

For the tests, a control file (JSON, read at each download) slows the bytes down
(``{"rate": BYTES_PER_S}``) or stalls the next downloads (``{"stall_after": N, "stalls": K}``:
the first K send N bytes, then nothing, until the client goes or STALL_HOLD_S pass). Every
request is logged as one JSON line (method, path, Range, status, body bytes sent). The server
binds 127.0.0.1 and exits when the box's supervisor is gone (or on SIGTERM).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import shutil
import ssl
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.sandbox.common import MODELSCOPE_PORT, SandboxError
from gpubox.sandbox.serve import (
    ControlFile,
    RequestLog,
    StderrLog,
    download_rate,
    file_arguments,
    parse_range,
    read_log,  # noqa: F401  (the tests read this server's request log through it)
    serve_until_stopped,
)

REPO_ID = "gpubox/tiny-GGUF"  # the sandbox's tiny model, as on its Hugging Face mirror
BRANCH = "master"  # ModelScope's default branch (modelscope-hub: revision or "master")
# A tag on the same commit, so that a test can name a revision the default is not. Created
# before every release of the catalog's range (1.35.0's __release_datetime__ is 2026-03-15),
# so an unpinned modelscope 1.35 to 1.37 downloads it as its default revision (the newest tag
# made before its release), modelscope-hub ``master``: the same bytes.
TAG = "v1.0"
TAG_CREATED = 1_700_000_000  # 2023-11-14
LFS_SUFFIXES = (".gguf", ".bin", ".safetensors", ".pt", ".onnx")
CHUNK = 64 * 1024
MIN_RATE = 1024
STALL_HOLD_S = 20  # at most this long a stalled answer keeps its connection
# Where the sandbox puts its CA inside the box (modelscope_ca_bundle in its inventory).
BOX_CA_PATH = "/usr/local/share/gpubox-sandbox/modelscope-ca.pem"
TLS_DAYS = 30


@dataclass(frozen=True)
class MsFile:
    name: str
    path: Path
    size: int
    sha256: str

    @property
    def lfs(self) -> bool:
        return self.name.endswith(LFS_SUFFIXES)


@dataclass(frozen=True)
class MsRepo:
    repo_id: str
    files: dict[str, MsFile]
    commit: str
    created: int

    def revisions(self) -> dict[str, Any]:
        """``Data`` of /revisions (the fields ``get_model_branches_and_tags_details`` reads)."""
        branch = {"Revision": BRANCH, "CreatedAt": self.created, "CommitId": self.commit}
        tag = {"Revision": TAG, "CreatedAt": TAG_CREATED, "CommitId": self.commit}
        return {"RevisionMap": {"Branches": [branch], "Tags": [tag]}}

    def listing(self) -> dict[str, Any]:
        """``Data`` of /repo/files (what ``get_model_files`` and the cache read)."""
        files = [
            {
                "Name": f.name.rsplit("/", 1)[-1],
                "Path": f.name,
                "Type": "blob",
                "Size": f.size,
                "Sha256": f.sha256,
                "Revision": self.commit,
                "IsLFS": f.lfs,  # guess: not read by the clients
                "CommittedDate": self.created,  # guess: not read by the clients
            }
            for f in sorted(self.files.values(), key=lambda f: f.name)
        ]
        return {"Files": files}

    def knows(self, revision: str) -> bool:
        return revision in (BRANCH, TAG, self.commit)


def make_repo(repo_id: str, files: dict[str, Path]) -> MsRepo:
    """A repository of ``files`` (name in the repository -> file), its commit id derived from
    the content (stable while the files are)."""
    entries = {}
    for name, path in files.items():
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        entries[name] = MsFile(name, path, path.stat().st_size, digest.hexdigest())
    tree = json.dumps([repo_id, sorted((f.name, f.sha256) for f in entries.values())])
    commit = hashlib.sha1(tree.encode()).hexdigest()  # noqa: S324 (an id, as git's)
    created = int(max((p.stat().st_mtime for p in files.values()), default=0))
    return MsRepo(repo_id, entries, commit, created)


# --------------------------------------------------------------------------- TLS


def make_tls(directory: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1 and localhost signed by it, with their
    keys, made with the openssl command in ``directory`` (new each time: the box trusts this
    CA alone). Returns the paths: ``ca`` (the certificate the client trusts), ``cert``,
    ``key``."""
    if not shutil.which("openssl"):
        raise SandboxError("the ModelScope mirror needs openssl (apt-get install -y openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, csr = directory / "server.pem", directory / "server.key", directory / "server.csr"
    ext = directory / "server.ext"
    ext.write_text(
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature\n"
        "extendedKeyUsage = serverAuth\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    steps = [
        ["openssl", "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca)]
        + ["-days", str(TLS_DAYS), "-subj", "/CN=gpubox sandbox ModelScope mirror CA"]
        + ["-addext", "basicConstraints=critical,CA:TRUE"]
        + ["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["openssl", "req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1"],
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)]
        + ["-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", str(TLS_DAYS)]
        + ["-extfile", str(ext), "-out", str(cert)],
    ]
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise SandboxError(f"openssl failed making the mirror's certificate: {proc.stderr}")
    for private in (ca_key, key):
        private.chmod(0o600)
    return {"ca": ca, "cert": cert, "key": key}


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


# --------------------------------------------------------------------------- control, log


class Control(ControlFile):
    """The test controls, from a JSON file read at each download (absent: none)."""

    def take_stall(self) -> int | None:
        """The byte count after which this download stalls, while ``stalls`` is above 0
        (counted down in the file)."""
        with self._lock:
            data = self.read()
            after, left = data.get("stall_after"), data.get("stalls", 0)
            if not isinstance(after, int) or not isinstance(left, int) or left <= 0:
                return None
            data["stalls"] = left - 1
            self._write(data)
            return after


# --------------------------------------------------------------------------- the handler


class MirrorHandler(StderrLog):
    protocol_version = "HTTP/1.1"  # keep-alive, as requests' sessions expect
    server_version = "gpubox-sandbox-modelscope"
    timeout = 60  # seconds a connection (its TLS handshake included) may stall
    repos: dict[str, MsRepo] = {}
    control: Control = Control(None)
    requests: RequestLog = RequestLog(None)

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

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
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True
            self._entry["broken"] = True
        finally:
            self.requests.write(self._entry)

    def _dispatch(self, body: bool) -> None:
        split = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(split.path).rstrip("/")
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(split.query).items()}
        if path == "/api/v1/repos/internalAccelerationInfo":
            self._json(404, None, "Not Found", body)
            return
        parts = path.split("/")
        if len(parts) < 6 or parts[:4] != ["", "api", "v1", "models"]:
            self._json(404, None, "This route is not served by the sandbox's ModelScope", body)
            return
        repo = self.repos.get(f"{parts[4]}/{parts[5]}")
        rest = parts[6:]
        if repo is None:
            self._json(404, None, f"The model {parts[4]}/{parts[5]} does not exist", body)
        elif rest == []:
            info = {"Name": parts[5], "Path": parts[4], "Revision": BRANCH}
            self._json(200, info, "success", body)
        elif rest == ["revisions"]:
            self._json(200, repo.revisions(), "success", body)
        elif rest == ["repo", "files"]:
            if not repo.knows(query.get("Revision", BRANCH)):
                self._json(404, None, f"Revision {query.get('Revision')} not found", body)
            else:
                self._json(200, repo.listing(), "success", body)
        elif rest == ["repo"]:
            self._file(repo, query.get("Revision", BRANCH), query.get("FilePath", ""), body)
        else:
            self._json(404, None, "Not Found", body)

    def _file(self, repo: MsRepo, revision: str, name: str, body: bool) -> None:
        f = repo.files.get(name)
        if not repo.knows(revision) or f is None:
            self._json(404, None, f"{name} does not exist at revision {revision}", body)
            return
        headers = {
            "Accept-Ranges": "bytes",
            "Content-Disposition": f'attachment; filename="{f.name.rsplit("/", 1)[-1]}"',
        }
        if f.lfs:
            headers["X-Linked-ETag"] = f'"{f.sha256}"'
        span = parse_range(self.headers.get("Range"), f.size)
        if span == "unsatisfiable":
            headers["Content-Range"] = f"bytes */{f.size}"
            self._send(416, b"", "text/plain", body, headers)
            return
        start, end = span if isinstance(span, tuple) else (0, f.size - 1)
        status = 206 if isinstance(span, tuple) else 200
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
        self._entry["status"] = status
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        for header, value in headers.items():
            self.send_header(header, value)
        self.end_headers()
        if body:
            self._stream(f, start, end - start + 1)

    def _stream(self, f: MsFile, start: int, length: int) -> None:
        """The bytes of ``f`` from ``start``, under the controls (rate, stall)."""
        control = self.control.read()
        rate = control.get("rate")
        rate = max(MIN_RATE, int(rate)) if isinstance(rate, int | float) and rate > 0 else None
        rate = rate or download_rate()  # the test's rate, else the sandbox's (--download-rate)
        stall = self.control.take_stall() if "stall_after" in control else None
        self._entry.update(rate=rate, stall_after=stall)
        chunk = CHUNK if rate is None else max(1024, min(CHUNK, rate // 8))
        sent = 0
        began = time.monotonic()
        with open(f.path, "rb") as src:
            src.seek(start)
            while sent < length:
                want = min(chunk, length - sent)
                if stall is not None:
                    want = min(want, stall - sent)
                    if want <= 0:
                        self._hold()
                        return
                data = src.read(want)
                if not data:
                    break
                self.wfile.write(data)
                sent += len(data)
                self._entry["bytes"] = sent
                if rate is not None:
                    ahead = sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)

    def _hold(self) -> None:
        """A stalled answer: nothing more is sent until the client goes (its end of the
        connection closes) or STALL_HOLD_S pass; then the connection closes."""
        self.wfile.flush()
        self._entry["stalled"] = True
        self.close_connection = True
        deadline = time.monotonic() + STALL_HOLD_S
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.connection], [], [], 0.5)
            if readable:
                try:
                    if not self.connection.recv(1):
                        return
                except (OSError, ssl.SSLError):
                    return

    def _json(self, status: int, data: Any, message: str, body: bool) -> None:
        answer = {
            "Code": 200 if status == 200 else status,
            "Data": data,
            "Message": message,
            "RequestId": uuid.uuid4().hex,
            "Success": status == 200,
        }
        self._send(status, json.dumps(answer).encode(), "application/json", body)

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
            self.wfile.write(data)
            self._entry["bytes"] = len(data)


# --------------------------------------------------------------------------- serving


def handler_class(
    repos: dict[str, MsRepo], control: Path | None = None, request_log: Path | None = None
) -> type[MirrorHandler]:
    return type(
        "Handler",
        (MirrorHandler,),
        {"repos": repos, "control": Control(control), "requests": RequestLog(request_log)},
    )


def serve(
    handler: type[MirrorHandler],
    bind: str,
    port: int,
    tls: ssl.SSLContext,
    watch: tuple[int, int] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    ready: Callable[[int], None] = lambda port: None,
) -> int:
    """Serve HTTPS until SIGTERM (in the main thread), ``should_stop()``, or until the
    watched process (the box's supervisor) is gone; ``ready`` gets the bound port."""

    def describe(bound: int) -> str:
        return f"ModelScope mirror on https://{bind}:{bound}/: " + ", ".join(sorted(handler.repos))

    return serve_until_stopped(handler, bind, port, describe, watch, should_stop, ready, tls)


def prepare(
    cache: Path, sdir: Path, model_path: Path, progress: Callable[[str], None]
) -> tuple[list[str], dict[str, Any]]:
    """What the sandbox's ModelScope mirror serves, made ready: the tiny model in ``REPO_ID``,
    a new CA and certificate under ``sdir``, and the wheels of catalog
    ``modelscope.requirement`` (which the Hub's PyPI index serves beside hf's: box.py). Returns
    the server's arguments (after ``serve``) and the box.json facts."""
    from gpubox import catalog
    from gpubox.sandbox import pypi

    requirement = catalog.load()["modelscope"]["requirement"]
    wheels = pypi.ensure_wheels(cache / "pypi-modelscope", [requirement], progress)
    tls = make_tls(sdir / "modelscope-tls")
    repo = make_repo(REPO_ID, {model_path.name: model_path})
    control = sdir / "modelscope-control.json"
    request_log = sdir / "logs" / "modelscope-requests.jsonl"
    control.unlink(missing_ok=True)
    request_log.parent.mkdir(parents=True, exist_ok=True)
    request_log.unlink(missing_ok=True)
    args = [
        "--bind",
        "127.0.0.1",
        "--port",
        str(MODELSCOPE_PORT),
        "--repo",
        REPO_ID,
        f"--file={model_path.name}={model_path}",
        f"--cert={tls['cert']}",
        f"--key={tls['key']}",
        f"--control={control}",
        f"--request-log={request_log}",
    ]
    facts = {
        # the catalog's modelscope.endpoint for the sandbox (an https URL: the client's)
        "modelscope_url": f"https://127.0.0.1:{MODELSCOPE_PORT}",
        "modelscope_repo": REPO_ID,
        "modelscope_commit": repo.commit,
        "modelscope_ca": str(tls["ca"]),  # on the host
        "modelscope_ca_bundle": BOX_CA_PATH,  # the same CA, in the box
        "modelscope_control": str(control),
        "modelscope_request_log": str(request_log),
        "modelscope_pypi_wheels": str(wheels),
    }
    return args, facts


def install_ca(rootfs: Path, ca: Path) -> None:
    """The mirror's CA into a box's root filesystem, at BOX_CA_PATH (not into the system's
    trust store: the box's modelscope trusts it through modelscope_ca_bundle alone)."""
    target = rootfs / BOX_CA_PATH.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ca, target)
    target.chmod(0o644)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpubox.sandbox.modelscope_mirror")
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve", help="serve the ModelScope mirror (in the box's namespace)")
    srv.add_argument("--bind", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=MODELSCOPE_PORT)
    srv.add_argument("--repo", default=REPO_ID)
    srv.add_argument(
        "--file", action="append", default=[], metavar="NAME=FILE", help="a file of the repo"
    )
    srv.add_argument("--cert", type=Path, required=True)
    srv.add_argument("--key", type=Path, required=True)
    srv.add_argument("--control", type=Path)
    srv.add_argument("--request-log", type=Path)
    srv.add_argument("--watch-pid", type=int)
    srv.add_argument("--watch-start-time", type=int)
    args = parser.parse_args(argv)
    if args.bind not in ("127.0.0.1", "::1", "localhost"):
        parser.error("the ModelScope mirror binds loopback only")
    repos = {args.repo: make_repo(args.repo, file_arguments(parser, args.file, "NAME=FILE"))}
    handler = handler_class(repos, args.control, args.request_log)
    watch = (args.watch_pid, args.watch_start_time) if args.watch_pid else None
    return serve(handler, args.bind, args.port, server_context(args.cert, args.key), watch)


if __name__ == "__main__":
    sys.exit(main())
