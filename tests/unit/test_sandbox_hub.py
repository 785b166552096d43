"""The sandbox's Hugging Face Hub mirror (gpubox.sandbox.hub), served for real on loopback in
this process: the headers huggingface_hub's `hf download` reads, byte ranges, the Hub's error
codes, the model info, the test controls (rate, a dropped connection, altered bytes) and the
PEP 503 index that pip installs from."""

from __future__ import annotations

import hashlib
import http.client
import json
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import serving

from gpubox.sandbox import hub, pypi

MODEL = bytes(range(256)) * 1000  # 256,000 bytes, a ".gguf": kept in LFS
README = b"# tiny\n\nA test repository.\n"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict]:
    """A hub with one repository (a model and a README) and a wheel index, on a free port;
    stopped after the test (and in any case within 60 s)."""
    (tmp_path / "repo").mkdir()
    model = tmp_path / "repo" / "tiny.gguf"
    model.write_bytes(MODEL)
    readme = tmp_path / "repo" / "README.md"
    readme.write_bytes(README)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = make_wheel(wheels, "gpubox_index_probe", "0.1")
    repo = hub.make_repo("gpubox/tiny-GGUF", {"tiny.gguf": model, "README.md": readme})
    control = tmp_path / "control.json"
    log = tmp_path / "requests.jsonl"
    with serving(hub.handler_class({repo.repo_id: repo}, wheels, control, log)) as port:
        yield {
            "port": port,
            "repo": repo,
            "control": control,
            "log": log,
            "wheel": wheel,
            "tmp": tmp_path,
        }


def make_wheel(directory: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel (PEP 427) that pip accepts."""
    path = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
        z.writestr(f"{info}/RECORD", record)
    return path


def request(port: int, method: str, path: str, headers: dict | None = None):
    """(status, headers, body); a connection the server breaks gives the bytes that came."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        try:
            body = response.read()
        except http.client.IncompleteRead as exc:
            body = exc.partial
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        conn.close()


RESOLVE = "/gpubox/tiny-GGUF/resolve/main/tiny.gguf"


def log_of(served: dict, count: int) -> list[dict]:
    """The request log once it has ``count`` entries (the server writes an entry after the
    response went out, so the client may read the log first)."""
    deadline = time.monotonic() + 10
    while len(log := hub.read_log(served["log"])) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return log


def test_head_resolve_has_the_headers_hf_download_reads(served):
    status, headers, body = request(served["port"], "HEAD", RESOLVE)
    sha256 = hashlib.sha256(MODEL).hexdigest()
    assert status == 200 and body == b""
    assert headers["x-repo-commit"] == served["repo"].commit
    assert len(headers["x-repo-commit"]) == 40
    assert headers["etag"] == f'"{sha256}"'
    assert headers["x-linked-etag"] == f'"{sha256}"'
    assert headers["x-linked-size"] == str(len(MODEL))
    assert headers["content-length"] == str(len(MODEL))
    assert headers["accept-ranges"] == "bytes"
    # no Xet headers: huggingface_hub downloads over plain HTTP
    assert not [h for h in headers if h.startswith("x-xet")]


def test_a_plain_git_file_has_its_blob_sha1_as_etag_and_no_linked_headers(served):
    status, headers, body = request(
        served["port"], "GET", "/gpubox/tiny-GGUF/resolve/main/README.md"
    )
    git = subprocess.run(
        ["git", "hash-object", "--stdin"], input=README, capture_output=True, check=True
    )
    assert status == 200 and body == README
    assert headers["etag"] == f'"{git.stdout.decode().strip()}"'
    assert "x-linked-etag" not in headers and "x-linked-size" not in headers


def test_get_serves_the_bytes_and_single_ranges(served):
    port = served["port"]
    status, headers, body = request(port, "GET", RESOLVE)
    assert status == 200 and body == MODEL
    status, headers, body = request(port, "GET", RESOLVE, {"Range": "bytes=100000-"})
    assert status == 206 and body == MODEL[100000:]
    assert headers["content-range"] == f"bytes 100000-{len(MODEL) - 1}/{len(MODEL)}"
    assert headers["content-length"] == str(len(MODEL) - 100000)
    status, headers, body = request(port, "GET", RESOLVE, {"Range": "bytes=10-19"})
    assert status == 206 and body == MODEL[10:20]
    status, headers, body = request(port, "GET", RESOLVE, {"Range": "bytes=-5"})
    assert status == 206 and body == MODEL[-5:]
    status, headers, body = request(port, "GET", RESOLVE, {"Range": f"bytes={len(MODEL)}-"})
    assert status == 416 and headers["content-range"] == f"bytes */{len(MODEL)}"
    # several ranges at once are not taken: the whole file, as the RFC allows
    status, headers, body = request(port, "GET", RESOLVE, {"Range": "bytes=0-1,5-6"})
    assert status == 200 and body == MODEL


def test_the_revision_may_be_the_commit_and_errors_carry_the_hubs_codes(served):
    port, commit = served["port"], served["repo"].commit
    status, headers, _ = request(port, "HEAD", f"/gpubox/tiny-GGUF/resolve/{commit}/tiny.gguf")
    assert status == 200 and headers["x-repo-commit"] == commit
    status, headers, body = request(port, "GET", "/gpubox/other/resolve/main/tiny.gguf")
    assert status == 401 and headers["x-error-code"] == "RepoNotFound"
    assert "error" in json.loads(body)
    status, headers, _ = request(port, "HEAD", "/gpubox/tiny-GGUF/resolve/v9/tiny.gguf")
    assert status == 404 and headers["x-error-code"] == "RevisionNotFound"
    status, headers, _ = request(port, "HEAD", "/gpubox/tiny-GGUF/resolve/main/nope.gguf")
    assert status == 404 and headers["x-error-code"] == "EntryNotFound"
    assert headers["x-repo-commit"] == commit


def test_model_info_lists_the_files_at_the_commit(served):
    port, repo = served["port"], served["repo"]
    for path in ("/api/models/gpubox/tiny-GGUF", "/api/models/gpubox/tiny-GGUF/revision/main"):
        status, _, body = request(port, "GET", path)
        info = json.loads(body)
        assert status == 200 and info["id"] == "gpubox/tiny-GGUF" and info["sha"] == repo.commit
        assert sorted(s["rfilename"] for s in info["siblings"]) == ["README.md", "tiny.gguf"]
    status, _, body = request(port, "GET", "/api/models/gpubox/tiny-GGUF/revision/main?blobs=true")
    siblings = {s["rfilename"]: s for s in json.loads(body)["siblings"]}
    assert siblings["tiny.gguf"]["lfs"]["sha256"] == hashlib.sha256(MODEL).hexdigest()
    assert siblings["tiny.gguf"]["size"] == len(MODEL) and "lfs" not in siblings["README.md"]


def test_a_dropped_connection_happens_once_then_ranges_resume(served):
    port, control = served["port"], served["control"]
    control.write_text(json.dumps({"drop_after": 100000, "rate": 0}))
    status, headers, body = request(port, "GET", RESOLVE)
    assert status == 200 and headers["content-length"] == str(len(MODEL))
    assert body == MODEL[:100000]  # the connection broke there
    assert json.loads(control.read_text()) == {"rate": 0}  # taken: once only
    status, _, rest = request(port, "GET", RESOLVE, {"Range": f"bytes={len(body)}-"})
    assert status == 206 and body + rest == MODEL
    log = log_of(served, 2)
    assert [e.get("dropped", False) for e in log] == [True, False]
    assert [e["bytes"] for e in log] == [100000, len(MODEL) - 100000]
    assert log[1]["range"] == "bytes=100000-" and log[1]["status"] == 206


def test_corrupt_alters_one_byte_and_keeps_the_real_checksum_in_the_headers(served):
    served["control"].write_text(json.dumps({"corrupt": True}))
    status, headers, body = request(served["port"], "GET", RESOLVE)
    assert status == 200 and len(body) == len(MODEL) and body != MODEL
    assert sum(a != b for a, b in zip(body, MODEL, strict=True)) == 1
    assert headers["x-linked-etag"] == f'"{hashlib.sha256(MODEL).hexdigest()}"'
    served["control"].write_text("{}")
    assert request(served["port"], "GET", RESOLVE)[2] == MODEL


def test_rate_slows_the_bytes_down(served):
    served["control"].write_text(json.dumps({"rate": 40000}))
    started = time.monotonic()
    status, _, body = request(served["port"], "GET", RESOLVE, {"Range": "bytes=0-79999"})
    took = time.monotonic() - started
    assert status == 206 and body == MODEL[:80000]
    assert 1.7 < took < 10, took  # 80,000 bytes at 40,000 bytes/s
    assert log_of(served, 1)[-1]["rate"] == 40000


def test_the_simple_index_serves_wheels_pip_installs(served):
    port, wheel = served["port"], served["wheel"]
    status, _, root = request(port, "GET", "/pypi/simple/")
    assert status == 200 and b'href="gpubox-index-probe/"' in root
    status, _, page = request(port, "GET", "/pypi/simple/GPUBOX_Index.Probe/")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert status == 200 and f"../../files/{wheel.name}#sha256={digest}".encode() in page
    assert request(port, "GET", f"/pypi/files/{wheel.name}")[2] == wheel.read_bytes()
    assert request(port, "GET", "/pypi/files/../control.json")[0] == 404
    assert request(port, "GET", "/pypi/simple/nothing/")[0] == 404
    # pip itself, from this index only (--isolated: no pip.conf, no extra index)
    dest = served["tmp"] / "got"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--isolated",
            "--no-deps",
            "--disable-pip-version-check",
            "--index-url",
            f"http://127.0.0.1:{port}/pypi/simple",
            "-d",
            str(dest),
            "gpubox-index-probe==0.1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (dest / wheel.name).read_bytes() == wheel.read_bytes()


def test_every_request_is_logged(served):
    request(served["port"], "HEAD", RESOLVE)
    request(served["port"], "GET", "/api/agent-harnesses")
    log = log_of(served, 2)
    assert [(e["method"], e["path"], e["status"]) for e in log] == [
        ("HEAD", RESOLVE, 200),
        ("GET", "/api/agent-harnesses", 200),
    ]


def test_wheel_names_map_to_pep503_projects():
    assert pypi.project_of("huggingface_hub-1.33.0-py3-none-any.whl") == "huggingface-hub"
    assert pypi.project_of("typing_extensions-4.16.0-py3-none-any.whl") == "typing-extensions"
    assert pypi.project_of("PyYAML-6.0.tar.gz") == "pyyaml"
    assert pypi.normalize("Foo.Bar__baz") == "foo-bar-baz"


def test_the_wheels_are_fetched_for_the_box_not_for_this_host():
    argv = pypi.download_argv(["huggingface_hub[hf_xet]>=1.0,<2"], Path("/tmp/x"))
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert "--only-binary=:all:" in argv and "manylinux_2_17_x86_64" in argv
    assert argv[-1] == "huggingface_hub[hf_xet]>=1.0,<2"


def test_the_large_test_file_is_the_same_every_time(tmp_path):
    a = hub.ensure_large_file(tmp_path / "a")
    b = hub.ensure_large_file(tmp_path / "b")
    assert a.stat().st_size == hub.LARGE_FILE_SIZE > 10 * 2**20  # over hf's 10 MiB write chunk
    assert a.read_bytes() == b.read_bytes()
    assert hub.ensure_large_file(tmp_path / "a") == a


def test_the_box_and_the_sandbox_mirror_ask_for_huggingface_hub_1_18_or_later_below_2():
    """Issue 29 B4: one requirement, the catalog's, for the box's pip and the sandbox's wheels;
    before 1.18 hf named its partial files differently and resumed them by appending."""
    from packaging.requirements import Requirement

    from gpubox import catalog

    text = catalog.load()["hf"]["hub_requirement"]
    req = Requirement(text)
    assert req.name == "huggingface_hub" and "hf_xet" in req.extras
    assert not req.specifier.contains("1.17.9") and req.specifier.contains("1.18.0")
    assert not req.specifier.contains("2.0.0")
    source = Path(hub.__file__).read_text()
    assert 'pypi.ensure_wheels(cache / "pypi", [catalog.load()["hf"]["hub_requirement"]]' in source


# ----------------------------------------------------------------- the history (issue 29 B5)

REAL_CLIENT = """
import json, sys
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
endpoint, repo, name, old, out = sys.argv[1:6]
api = HfApi(endpoint=endpoint, token=False)
meta = get_hf_file_metadata(hf_hub_url(repo, name, endpoint=endpoint), token=False)
(main,) = api.get_paths_info(repo, [name], expand=True)
(before,) = api.get_paths_info(repo, [name], expand=True, revision=old)
commits = api.list_repo_commits(repo)
path = hf_hub_download(repo, name, revision=old, local_dir=out, token=False, endpoint=endpoint)
print(json.dumps({
    "commit": meta.commit_hash, "etag": meta.etag, "size": meta.size,
    "main": [main.lfs.sha256, main.last_commit.oid],
    "before": [before.lfs.sha256, before.last_commit.oid],
    "commits": [[c.commit_id, c.title, c.authors] for c in commits],
    "old_bytes": open(path, "rb").read().hex(),
}))
"""


def test_a_reupload_is_a_new_commit_that_the_real_client_reads_with_the_history(tmp_path):
    """After a re-upload (two here), main is a new commit whose file has the new sha256, in
    the headers huggingface_hub's get_hf_file_metadata reads (X-Repo-Commit, X-Linked-Etag)
    and in get_paths_info's lfs and last_commit; list_repo_commits lists every commit, newest
    first, across pages (Link); the first upload's commit still serves the first bytes."""
    import helpers

    model = tmp_path / "tiny.gguf"
    model.write_bytes(MODEL)
    repo = hub.make_repo("gpubox/tiny-GGUF", {"tiny.gguf": model})
    reuploads = tmp_path / "reuploads.json"
    contents = [MODEL[::-1], MODEL[1:] + b"!"]
    entries = []
    for n, data in enumerate(contents, 1):
        path = tmp_path / f"re{n}.gguf"
        path.write_bytes(data)
        entries.append(
            {"repo": repo.repo_id, "file": "tiny.gguf", "path": str(path), "title": f"re {n}",
             "date": f"2026-01-1{n}T00:00:00.000Z"}
        )  # fmt: skip
    handler = hub.handler_class({repo.repo_id: repo}, reuploads=reuploads)
    handler.commits_page = 2  # the four commits on two pages
    with serving(handler) as port:
        endpoint = f"http://127.0.0.1:{port}"
        status, headers, _ = request(port, "HEAD", RESOLVE)
        assert headers["x-repo-commit"] == repo.commit  # nothing re-uploaded yet
        reuploads.write_text(json.dumps(entries))
        venv = helpers.hf_venv()
        result = subprocess.run(
            [str(venv / "bin" / "python"), "-c", REAL_CLIENT, endpoint, repo.repo_id,
             "tiny.gguf", repo.commit, str(tmp_path / "out")],
            capture_output=True, text=True, timeout=120,
            env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout)
    new = hashlib.sha256(contents[-1]).hexdigest()
    ids = [c[0] for c in got["commits"]]
    assert len(ids) == 4 and ids[2] == repo.commit  # re 2, re 1, the first upload, initial
    assert [c[1] for c in got["commits"]] == ["re 2", "re 1", hub.UPLOAD_TITLE, "initial commit"]
    assert got["commits"][0][2] == ["gpubox"]
    assert (got["commit"], got["etag"], got["size"]) == (ids[0], new, len(contents[-1]))
    assert got["main"] == [new, ids[0]]  # main's file, last changed by the newest commit
    assert got["before"] == [hashlib.sha256(MODEL).hexdigest(), repo.commit]
    assert bytes.fromhex(got["old_bytes"]) == MODEL


def test_paths_info_answers_forms_and_json_and_leaves_out_missing_paths(served):
    port = served["port"]
    repo = served["repo"]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    url = f"/api/models/{repo.repo_id}/paths-info/main"
    conn.request(
        "POST", url, body=json.dumps({"paths": ["tiny.gguf", "nope"], "expand": False}),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    (entry,) = json.loads(conn.getresponse().read())
    assert entry["lfs"]["oid"] == hashlib.sha256(MODEL).hexdigest() and "lastCommit" not in entry
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(
        "POST", url.replace("/main", f"/{repo.parent.commit}"), body="paths=tiny.gguf&expand=true",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )  # fmt: skip
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read()) == []  # the initial commit
    status, headers, _ = request(port, "GET", f"/api/models/{repo.repo_id}/commits/nope")
    assert status == 404 and headers["x-error-code"] == "RevisionNotFound"


def test_the_reupload_command_writes_a_tiny_model_with_other_weights(tmp_path):
    """`gpubox sandbox hub reupload`'s bytes: the tiny model again (it loads and answers
    alike: only weights that do not shape the answers differ), with another sha256; box.json's
    facts are left as they were."""
    gguf = pytest.importorskip("gguf")
    from gpubox.sandbox import tinymodel

    model = tmp_path / tinymodel.FILE_NAME
    tinymodel.write(model)
    info = {
        "hub_repo": hub.REPO_ID,
        "model_file": model.name,
        "hub_files": {model.name: {"path": str(model)}},
        "hub_reuploads": str(tmp_path / "hub-reuploads.json"),
    }
    before = json.dumps(info)
    done = hub.add_reupload(info)
    assert json.dumps(info) == before
    first = hub.make_repo(hub.REPO_ID, {model.name: model})
    assert done["parent"] == first.commit and done["commit"] != first.commit
    (entry,) = json.loads(Path(info["hub_reuploads"]).read_text())
    new = Path(entry["path"])
    assert done["sha256"] == hashlib.sha256(new.read_bytes()).hexdigest()
    assert done["sha256"] != hashlib.sha256(model.read_bytes()).hexdigest()
    a, b = gguf.GGUFReader(str(model)), gguf.GGUFReader(str(new))
    changed = {
        t.name for t, u in zip(a.tensors, b.tensors, strict=True) if bytes(t.data) != bytes(u.data)
    }
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    assert changed == {
        "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.1.ffn_gate.weight",
        "blk.1.ffn_up.weight", "blk.1.attn_q.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight",
    }  # fmt: skip
    assert hub.add_reupload(info)["parent"] == done["commit"]  # a second one follows the first
