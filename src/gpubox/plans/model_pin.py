"""Which commit of the Hub the GGUF file is downloaded at (docs/models.md, "How the GGUF is
pinned"): the commit whose file has the plan's sha256, found on the box before the download.
Pure: what to ask the Hub (as shell commands the stage runs on the box, each a fact) and what
its answers mean; the stage (gpubox.stages.model) does the asking.

1. The cheap check, on the size query the deploy already makes (``HEAD
   .../resolve/REVISION/FILE``, main when the plan names no revision). The Hub answers it with
   ``X-Repo-Commit`` (the commit the revision points at) and, for a file kept in Git LFS,
   ``X-Linked-Etag`` (its sha256, quoted), the headers huggingface_hub's
   ``get_hf_file_metadata`` reads (file_download.py: ``HUGGINGFACE_HEADER_X_REPO_COMMIT``,
   ``HUGGINGFACE_HEADER_X_LINKED_ETAG``, the quotes taken off by ``_normalize_etag``). When
   the etag is the sha256, that commit is the one.
2. Otherwise, unpinned, the file's history: ``POST /api/models/REPO/paths-info/REV`` with the
   form ``paths=FILE&expand=true`` (huggingface_hub 1.33 ``HfApi.get_paths_info``: httpx
   posts ``data={"paths": [...], "expand": True}``, a bool as ``true``) answers a list of
   entries whose ``lfs.oid`` is the file's sha256 and ``lastCommit.id`` the commit that last
   changed it (``RepoFile.__init__``); ``GET /api/models/REPO/commits/REV`` lists the
   commits newest first (``HfApi.list_repo_commits``: each entry's ``id``; further pages
   behind the ``Link: <URL>; rel="next"`` header, utils/_pagination.py ``paginate``). The
   walk asks paths-info again at the commit listed just after each ``lastCommit`` (the one
   before it) and stops at the first whose ``lfs.oid`` is the sha256: the newest commit
   with those bytes.
3. No commit has it: the deploy stops before any transfer, naming the sha256 on main. An
   endpoint that does not answer the API (some mirrors), or strips the headers: the download
   goes as before (main, or the plan's revision), with a warning.

The requests carry no token, as the size query never did: the facts' commands are command
lines on the box (the token reaches only the download unit, as a credential)."""

from __future__ import annotations

import json
import re
import shlex
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpubox.plans.model_script import ModelPlan

COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# The walk's bounds: paths-info questions (versions of the file) and pages of commits.
MAX_VERSIONS = 32
MAX_PAGES = 20
TIMEOUT_S = 20


@dataclass(frozen=True)
class Request:
    """One HTTP request the box makes: ``form`` is a urlencoded POST body; ``follow``
    follows redirects (a plain URL's size), else the first response is the answer (the Hub
    answers an LFS file with a redirect whose headers carry what gpubox reads)."""

    method: str
    url: str
    form: tuple[tuple[str, str], ...] = ()
    follow: bool = False


@dataclass(frozen=True)
class Answer:
    """A server's answer as the box printed it: each response's status and headers (names
    in lower case; redirects first), then the body."""

    responses: tuple[tuple[int, dict[str, str]], ...] = ()
    body: str = ""

    @property
    def status(self) -> int | None:
        return self.responses[-1][0] if self.responses else None

    def header(self, name: str) -> str | None:
        return self.responses[-1][1].get(name.lower()) if self.responses else None

    def json(self) -> Any:
        """The body as JSON when the answer is a 200 (None otherwise)."""
        if self.status != 200:
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None


# ----------------------------------------------------------------------------- on the box

# python3 where curl is missing (a fresh box before the deploy installs it): the same
# output, the headers of the first response (no redirect followed unless asked) and the body.
_PY_FETCH = """import sys, urllib.request as u, urllib.error as e
m, url, data, follow = sys.argv[1:5]
class N(u.HTTPRedirectHandler):
    def redirect_request(self, *a):
        return None
o = u.build_opener(*(() if follow == "1" else (N(),)))
r = u.Request(url, data=data.encode() if data else None, method=m)
try:
    x = o.open(r, timeout=@TIMEOUT@)
except e.HTTPError as h:
    x = h
print("HTTP/1.1", x.getcode())
for k, v in x.headers.items():
    print(k + ": " + v)
print()
sys.stdout.write(x.read().decode("utf-8", "replace"))
""".replace("@TIMEOUT@", str(TIMEOUT_S))


def request_command(r: Request) -> str:
    """A shell command that makes ``r`` and prints the answer (``parse_response``): curl
    where there is one, else python3; nothing when neither is there or nothing answered."""
    q = shlex.quote
    data = urllib.parse.urlencode(r.form) if r.form else ""
    if r.method == "HEAD":
        flags = "-sSI"
    elif data:
        flags = f"-sS -i --data-raw {q(data)}"
    else:
        flags = "-sS -i"
    if r.follow:
        flags += " -L"
    follow = "1" if r.follow else "0"
    return (
        f"if command -v curl >/dev/null 2>&1; then "
        f"curl {flags} --max-time {TIMEOUT_S} {q(r.url)} 2>/dev/null || true; "
        "elif command -v python3 >/dev/null 2>&1; then "
        f"python3 -c {q(_PY_FETCH)} {r.method} {q(r.url)} {q(data)} {follow} 2>/dev/null "
        "|| true; fi"
    )


def parse_response(text: str) -> Answer:
    """What ``request_command`` printed as an Answer (no response: an empty one)."""
    lines = text.replace("\r", "").split("\n")
    responses: list[tuple[int, dict[str, str]]] = []
    i = 0
    while i < len(lines) and lines[i].startswith("HTTP/"):
        words = lines[i].split()
        status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        headers: dict[str, str] = {}
        i += 1
        while i < len(lines) and lines[i].strip():
            name, _, value = lines[i].partition(":")
            headers[name.strip().lower()] = value.strip()
            i += 1
        responses.append((status, headers))
        i += 1
    return Answer(tuple(responses), "\n".join(lines[i:]))


def announced_size(a: Answer) -> int | None:
    """The file's size as its server announced it: the Hub's ``X-Linked-Size`` (on the
    redirect of an LFS file), else the ``Content-Length`` of a final 200."""
    linked = [h["x-linked-size"] for _, h in a.responses if "x-linked-size" in h]
    value = linked[-1] if linked else (a.header("content-length") if a.status == 200 else None)
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def normalize_etag(value: str | None) -> str | None:
    """An ETag without ``W/`` and quotes (huggingface_hub's ``_normalize_etag``)."""
    if not value:
        return None
    return value.strip().removeprefix("W/").strip('"').lower() or None


def paths_info_request(p: ModelPlan, endpoint: str, revision: str) -> Request:
    url = f"{endpoint.rstrip('/')}/api/models/{p.repo}/paths-info/{_quote(revision)}"
    return Request("POST", url, (("paths", p.file), ("expand", "true")))


def commits_request(p: ModelPlan, endpoint: str, revision: str) -> Request:
    return Request("GET", f"{endpoint.rstrip('/')}/api/models/{p.repo}/commits/{_quote(revision)}")


def _quote(revision: str) -> str:
    return urllib.parse.quote(revision, safe="")


# ----------------------------------------------------------------------------- the answers


@dataclass(frozen=True)
class Version:
    """The file at one commit, as paths-info says: its sha256 (``lfs.oid``; None for a file
    not in LFS) and the commit that last changed it (``lastCommit.id``)."""

    sha256: str | None
    last_commit: str | None


class NoAnswer(Exception):
    """The endpoint did not answer an API question as the Hub does."""


def file_version(a: Answer, name: str) -> Version | None:
    """paths-info's entry for ``name`` (None: no such file at that commit); NoAnswer unless
    the answer is the Hub's list."""
    entries = a.json()
    if not isinstance(entries, list):
        raise NoAnswer(f"paths-info answered {a.status or 'nothing'}")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("path") == name and entry.get("type") == "file":
            lfs = entry.get("lfs")
            oid = lfs.get("oid") if isinstance(lfs, dict) else None
            last = entry.get("lastCommit")
            commit = last.get("id") if isinstance(last, dict) else None
            return Version(
                oid.lower() if isinstance(oid, str) and SHA256.fullmatch(oid.lower()) else None,
                commit if isinstance(commit, str) and COMMIT.fullmatch(commit) else None,
            )
    return None


def commit_page(a: Answer, url: str) -> tuple[list[str], str | None]:
    """A page of the commits list: the commits' ids (newest first) and the next page's URL
    (the ``Link`` header's ``rel="next"``); NoAnswer unless the answer is the Hub's list."""
    entries = a.json()
    if not isinstance(entries, list):
        raise NoAnswer(f"commits answered {a.status or 'nothing'}")
    ids = []
    for entry in entries:
        commit = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(commit, str) or not COMMIT.fullmatch(commit):
            raise NoAnswer("commits listed an entry without a commit id")
        ids.append(commit)
    link = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', a.header("link") or "")
    return ids, urllib.parse.urljoin(url, link[1]) if link else None


@dataclass
class _Commits:
    """The commits list, fetched a page at a time as the walk needs it."""

    ask: Callable[[Request], Answer]
    next_url: str | None
    ids: list[str] = field(default_factory=list)
    pages: int = 0

    @property
    def complete(self) -> bool:
        return self.next_url is None

    def _more(self) -> bool:
        if self.next_url is None or self.pages >= MAX_PAGES:
            return False
        url = self.next_url
        ids, self.next_url = commit_page(self.ask(Request("GET", url)), url)
        self.pages += 1
        self.ids += ids
        return True

    def first(self) -> str | None:
        while not self.ids and self._more():
            pass
        return self.ids[0] if self.ids else None

    def before(self, commit: str) -> str | None:
        """The commit listed just after ``commit`` (its predecessor); None at the end."""
        while True:
            if commit in self.ids:
                i = self.ids.index(commit)
                if i + 1 < len(self.ids):
                    return self.ids[i + 1]
            if not self._more():
                return None


# ----------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class Pin:
    """What the deploy does: download ``commit`` (None: the plan's revision, or main, as
    without this module); ``message`` says why (a warning when ``warn``); ``refusal``: stop
    before any transfer, with this reason."""

    commit: str | None = None
    message: str = ""
    warn: bool = False
    refusal: str | None = None


def resolve(p: ModelPlan, endpoint: str, head: Answer, ask: Callable[[Request], Answer]) -> Pin:
    """The commit to download ``p`` at (a Hugging Face file with a sha256), from ``head``
    (the answer to the size query, ``HEAD`` of ``hf_resolve_url(p)``) and, when that does
    not settle it, the Hub's API (``ask`` makes one request on the box)."""
    assert p.source == "hf" and p.sha256
    want = p.sha256.lower()
    commit = head.header("x-repo-commit")
    commit = commit if commit and COMMIT.fullmatch(commit) else None
    etag = normalize_etag(head.header("x-linked-etag"))
    etag = etag if etag and SHA256.fullmatch(etag) else None
    at = p.revision or "main"
    if etag == want and commit:
        return Pin(
            commit, f"{p.file} pinned to commit {commit} ({at}'s X-Linked-Etag is its sha256)"
        )
    if p.revision:
        # the owner's (or the catalog's) revision: no other commit is looked for
        if etag:
            return Pin(
                refusal=f"{p.file} at revision {p.revision} of {p.repo} has sha256 {etag}, "
                f"not {want}; nothing was downloaded. To deploy, set model_revision to a "
                f"commit whose file has sha256 {want}, or model_sha256 to {etag} if you "
                "trust those bytes"
            )
        return Pin()
    main_sha = etag
    commits = _Commits(ask, commits_request(p, endpoint, commit or "main").url)
    versions = 0
    limited = False
    try:
        rev = commit or "main"
        version = file_version(ask(paths_info_request(p, endpoint, rev)), p.file)
        if version is None:
            return Pin(refusal=f"{p.file} is not in {p.repo} at main; nothing was downloaded")
        if version.sha256 is None:
            raise NoAnswer("paths-info gave the file no lfs.oid")
        main_sha = version.sha256
        while version is not None and version.sha256 != want:
            if not version.last_commit:
                raise NoAnswer("paths-info gave the file no lastCommit")
            before = commits.before(version.last_commit)
            if before is None or versions >= MAX_VERSIONS:
                limited = versions >= MAX_VERSIONS or not commits.complete
                break
            rev, versions = before, versions + 1
            version = file_version(ask(paths_info_request(p, endpoint, rev)), p.file)
        if version is not None and version.sha256 == want:
            pinned = rev if COMMIT.fullmatch(rev) else commits.first()
            if not pinned:
                raise NoAnswer("commits listed no commit")
            back = f", {versions} version(s) back from main" if versions else ""
            return Pin(pinned, f"{p.file} pinned to commit {pinned} (its sha256{back})")
    except NoAnswer as exc:
        if main_sha and main_sha != want:
            why = f" (the endpoint's API did not answer: {exc}; no earlier commit was searched)"
            return Pin(refusal=_no_commit(p, want, main_sha, why))
        return Pin(
            warn=True,
            message=(
                f"{p.file} is not pinned to a revision: {endpoint} did not answer the Hub's "
                f"API ({exc}), so no commit was found for its sha256; downloading main as it "
                "is (the sha256 still refuses other bytes; model_revision pins one)"
            ),
        )
    why = f" (among its newest {versions + 1} versions; the search stops there)" if limited else ""
    return Pin(refusal=_no_commit(p, want, main_sha or "unknown", why))


def _no_commit(p: ModelPlan, want: str, found: str, why: str) -> str:
    return (
        f"no commit of {p.repo} has {p.file} with sha256 {want}{why}; main has sha256 "
        f"{found}; nothing was downloaded. To deploy, set model_revision to a commit whose "
        f"file has sha256 {want}, or model_sha256 to {found} if you trust those bytes"
    )
