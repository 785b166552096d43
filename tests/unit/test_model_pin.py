"""Issue 29 B5: which commit the GGUF is downloaded at (gpubox.plans.model_pin), decided from
the Hub's answers: the size query's headers when they settle it (the cheap check), else the
file's history through paths-info and the commits list; a refusal before any transfer when no
commit has the sha256; main as before, with a warning, where the endpoint answers no API.

The answers are written as the Hub gives them to huggingface_hub 1.33 (no record of a real
answer is kept here; the shapes are those its parsers read): ``get_hf_file_metadata``'s
headers (X-Repo-Commit, X-Linked-Etag quoted, X-Linked-Size on a 302 to the CDN),
``RepoFile``'s entry (type, oid, size, lfs.oid/size/pointerSize, lastCommit.id/title/date),
``list_repo_commits``' entries (id, title, message, authors[].user, date) with pages behind
``Link: <URL>; rel="next"``."""

from __future__ import annotations

import json

import pytest
from helpers import model_plan

from gpubox.plans import model_pin
from gpubox.plans.model_pin import Answer, Request

ENDPOINT = "https://huggingface.co"
REPO = "gpubox/tiny-GGUF"
FILE = "tiny.gguf"
# The repository's commits, newest first: C4 changed only the README, C3 re-uploaded the
# GGUF (sha256 B), C1 uploaded it (sha256 A), C0 is the Hub's initial commit.
C4, C3, C2, C1, C0 = (f"{n}" * 40 for n in "43210")
A, B = "a" * 64, "b" * 64
FILE_AT = {C4: (B, C3), C3: (B, C3), C2: (A, C1), C1: (A, C1)}  # commit -> (sha256, lastCommit)


def plan(sha256: str = A, revision: str | None = None):
    return model_plan("/srv/models", sha256=sha256, revision=revision)


def head(commit: str | None = C4, etag: str | None = B) -> Answer:
    """The size query's answer: the Hub's 302 to its CDN for an LFS file."""
    text = "HTTP/2 302\r\ncontent-type: text/plain; charset=utf-8\r\nx-linked-size: 1000\r\n"
    if commit:
        text += f"x-repo-commit: {commit}\r\n"
    if etag:
        text += f'x-linked-etag: "{etag}"\r\netag: "{etag}"\r\n'
    text += "location: https://cas-bridge.xethub.hf.co/xet-bridge-us/x\r\n\r\n"
    return model_pin.parse_response(text)


def answer(status: int, body: object, headers: str = "") -> Answer:
    text = f"HTTP/2 {status}\r\ncontent-type: application/json; charset=utf-8\r\n{headers}\r\n"
    return model_pin.parse_response(text + json.dumps(body))


class Hub:
    """The Hub's API for REPO, as a function of the request; pages of two commits."""

    def __init__(self, api: bool = True) -> None:
        self.api = api
        self.asked: list[Request] = []

    def __call__(self, r: Request) -> Answer:
        self.asked.append(r)
        if not self.api:  # a mirror that serves only /resolve
            return model_pin.parse_response("HTTP/1.1 404 Not Found\r\n\r\n<html>404</html>")
        base = f"{ENDPOINT}/api/models/{REPO}"
        if r.method == "POST" and r.url.startswith(f"{base}/paths-info/"):
            rev = r.url.rsplit("/", 1)[1]
            assert r.form == (("paths", FILE), ("expand", "true"))
            sha, last = FILE_AT.get(C4 if rev == "main" else rev, (None, None))
            if sha is None:
                return answer(200, [])
            return answer(
                200,
                [
                    {
                        "type": "file",
                        "oid": "0" * 40,
                        "size": 1000,
                        "lfs": {"oid": sha, "size": 1000, "pointerSize": 132},
                        "path": FILE,
                        "lastCommit": {
                            "id": last,
                            "title": "Upload",
                            "date": "2026-01-12T10:00:00.000Z",
                        },
                    }
                ],
            )
        if r.method == "GET" and r.url.startswith(f"{base}/commits/"):
            page = int(r.url.split("?p=")[1]) if "?p=" in r.url else 0
            ids = [C4, C3, C2, C1, C0][2 * page : 2 * page + 2]
            entries = [
                {"id": c, "title": "t", "message": "", "authors": [{"user": "u", "avatar": None}],
                 "date": "2026-01-12T10:00:00.000Z"}
                for c in ids
            ]  # fmt: skip
            more = f'Link: <{base}/commits/{C4}?p={page + 1}>; rel="next"\r\n' if page < 2 else ""
            return answer(200, entries, more)
        return answer(404, {"error": "Not Found"})


def test_the_cheap_check_pins_the_commit_whose_etag_is_the_sha256():
    hub = Hub()
    pin = model_pin.resolve(plan(sha256=B), ENDPOINT, head(), hub)
    assert (pin.commit, pin.refusal, pin.warn) == (C4, None, False)
    assert hub.asked == []  # no API question: the size query said it all
    assert "X-Linked-Etag" in pin.message


def test_the_walk_finds_the_newest_commit_that_has_the_sha256():
    hub = Hub()
    pin = model_pin.resolve(plan(sha256=A), ENDPOINT, head(), hub)
    # main's file (B) was last changed by C3; the commit before C3 is C2, whose file is A
    assert (pin.commit, pin.refusal, pin.warn) == (C2, None, False)
    asked = [(r.method, r.url.removeprefix(f"{ENDPOINT}/api/models/{REPO}/")) for r in hub.asked]
    assert asked == [
        ("POST", f"paths-info/{C4}"),
        ("GET", f"commits/{C4}"),
        ("GET", f"commits/{C4}?p=1"),  # C3's predecessor is on the second page
        ("POST", f"paths-info/{C2}"),
    ]


def test_no_commit_with_the_sha256_refuses_naming_the_sha256_on_main():
    other = "c" * 64
    pin = model_pin.resolve(plan(sha256=other), ENDPOINT, head(), Hub())
    assert pin.commit is None and pin.refusal
    assert f"no commit of {REPO} has {FILE} with sha256 {other}" in pin.refusal
    assert f"main has sha256 {B}" in pin.refusal and "nothing was downloaded" in pin.refusal
    assert "the search stops" not in pin.refusal  # the whole history was searched


def test_a_mirror_without_the_api_or_the_headers_downloads_main_as_before_and_warns():
    hub = Hub(api=False)
    bare = model_pin.parse_response("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    pin = model_pin.resolve(plan(sha256=A), ENDPOINT, bare, hub)
    assert (pin.commit, pin.refusal, pin.warn) == (None, None, True)
    assert "is not pinned to a revision" in pin.message and "paths-info answered 404" in pin.message
    # and so when nothing answered at all (the size query empty too)
    pin = model_pin.resolve(plan(sha256=A), ENDPOINT, model_pin.parse_response(""), Hub(False))
    assert (pin.commit, pin.refusal, pin.warn) == (None, None, True)


def test_a_mirror_without_the_api_whose_headers_show_other_bytes_refuses_before_the_transfer():
    """The sha256 would refuse main's bytes after the whole transfer: refused before it."""
    pin = model_pin.resolve(plan(sha256=A), ENDPOINT, head(), Hub(api=False))
    assert pin.refusal and f"main has sha256 {B}" in pin.refusal
    assert "no earlier commit was searched" in pin.refusal


def test_the_owners_revision_is_kept_checked_and_never_walked():
    hub = Hub()
    pin = model_pin.resolve(plan(sha256=B, revision="main"), ENDPOINT, head(), hub)
    assert pin.commit == C4  # the branch resolved to its commit
    pin = model_pin.resolve(plan(sha256=A, revision=C4), ENDPOINT, head(), hub)
    assert pin.commit is None and pin.refusal
    assert f"{FILE} at revision {C4} of {REPO} has sha256 {B}, not {A}" in pin.refusal
    pin = model_pin.resolve(plan(sha256=A, revision=C4), ENDPOINT, head(etag=None), hub)
    assert pin == model_pin.Pin()  # no etag: the revision as before, no warning
    assert hub.asked == []


def test_the_commit_found_is_downloaded_and_recorded_in_the_marker():
    from dataclasses import replace

    from gpubox.plans import model_script

    p = replace(plan(sha256=A), commit=C2)
    assert model_script.hf_resolve_url(p, ENDPOINT) == f"{ENDPOINT}/{REPO}/resolve/{C2}/{FILE}"
    commands = model_script.download_commands(p, ENDPOINT, "")
    assert f"/resolve/{C2}/{FILE}" in commands[1]
    assert commands[2].endswith(f"; echo commit={C2} >> /srv/models/{FILE}.gpubox-verified")
    # the size query asks for the revision (main), never for a commit not yet known
    from gpubox.plans import model as plan_model

    assert f"/resolve/main/{FILE}" in (plan_model.remote_size_command(plan(), ENDPOINT) or "")


@pytest.mark.parametrize(
    "text, size",
    [
        ("HTTP/2 302\r\nx-linked-size: 49000000000\r\ncontent-length: 1234\r\n\r\n", 49000000000),
        ("HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n", 42),
        (
            "HTTP/1.1 302 Found\r\nLocation: /x\r\n\r\n"
            "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n",
            7,
        ),
        ("HTTP/1.1 404 Not Found\r\nContent-Length: 15\r\n\r\n", None),
        ("", None),
    ],
)
def test_the_size_query_is_read_as_before(text, size):
    assert model_pin.announced_size(model_pin.parse_response(text)) == size


def test_etags_are_normalized_as_huggingface_hub_does():
    assert model_pin.normalize_etag(f'"{A}"') == A
    assert model_pin.normalize_etag(f'W/"{A.upper()}"') == A
    assert model_pin.normalize_etag(None) is None
