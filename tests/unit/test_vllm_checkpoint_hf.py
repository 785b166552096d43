"""The vLLM checkpoint's download run with the real `hf` (huggingface_hub, the catalog's
requirement, installed in a scratch venv from the wheels the sandbox caches, fetched from PyPI
once) against the sandbox's Hub served in this process: the plan-time listing, the whole
multi-file repository downloaded at the listed commit as the long step runs it (progress lines
with the total), the marker, and a second run after one shard went missing and another was
truncated (its mtime put back, so hf's own metadata would take it for finished) that fetches
those two shards only.

The sandbox's Hub answers no tree listing (``/api/models/REPO/tree/REV``), which
``hf download REPO`` (snapshot_download) asks for the list of files; the test's server adds
that route, as the Hub answers it (one JSON entry per file: type, oid, size, path, lfs)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import helpers
import pytest
from helpers import serving

from gpubox.infra import progress
from gpubox.plans import checkpoint, model_script
from gpubox.sandbox import hub
from gpubox.stages import model as model_stage

REPO = "someone/Tiny-int4-AutoRound"
SHARD_1 = "model-00001-of-00002.safetensors"
SHARD_2 = "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def hf_venv() -> Path:
    """A venv with the catalog's huggingface_hub (helpers.hf_venv: one per test process)."""
    return helpers.hf_venv()


def tree_handler(base: type[hub.HubHandler]) -> type[hub.HubHandler]:
    """The sandbox Hub's handler with the tree listing added."""

    class WithTree(base):  # type: ignore[misc, valid-type]
        def _dispatch(self, body: bool) -> None:
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path)
            if not m:
                super()._dispatch(body)
                return
            repo = self._repo(m[1], m[2], body)
            if repo is None:
                return
            entries = []
            for f in sorted(repo.files.values(), key=lambda f: f.name):
                entry = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": f.name}
                if f.lfs:
                    entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
                entries.append(entry)
            data = json.dumps(entries).encode()
            self._send(200, data, "application/json; charset=utf-8", body)

    return WithTree


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict]:
    """A repository of a config, two shards (Git LFS) and a tokenizer in a subdirectory, served
    on a free loopback port until the test ends (60 s at most); every request logged."""
    contents = {
        "config.json": b'{"architectures": ["Qwen3NextForCausalLM"]}\n',
        SHARD_1: hashlib.shake_256(b"shard 1").digest(3 * 2**20 + 17),
        SHARD_2: hashlib.shake_256(b"shard 2").digest(2 * 2**20 + 5),
        "tokenizer/tokenizer.json": b'{"version": "1.0"}\n',
    }
    files = {}
    for name, data in contents.items():
        path = tmp_path / "served" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files[name] = path
    repo = hub.make_repo(REPO, files)
    log = tmp_path / "requests.jsonl"
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"rate": 2**20}))  # bytes/s, per download
    handler = tree_handler(hub.handler_class({REPO: repo}, control=control, request_log=log))
    with serving(handler) as port:
        yield {
            "endpoint": f"http://127.0.0.1:{port}",
            "repo": repo,
            "contents": contents,
            "log": log,
        }


def sh(command: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=timeout
    )


def download(c, listing, served, hf_venv, tmp_path) -> subprocess.CompletedProcess[str]:
    """The download unit's script for the checkpoint, run under the long step's progress
    lines (every 1 s), as the backend shows them while it waits for the unit."""
    commands = checkpoint.download_commands(
        c, listing, served["endpoint"], str(tmp_path / "token"), str(hf_venv),
        model_stage.HF_QUIET,
    )  # fmt: skip
    script = progress.wrapper_command(
        model_stage.step_command(commands),
        progress.download_probe(c.directory, listing.total if listing else None),
        every=1,
        label="Download the vLLM checkpoint",
    )
    return sh(script, timeout=300)


def fetched(log: Path) -> list[str]:
    """The files whose bytes were asked for (GET .../resolve/...)."""
    return sorted(
        urllib.parse.unquote(e["path"].split("/resolve/", 1)[1].split("/", 1)[1])
        for e in hub.read_log(log)
        if e["method"] == "GET" and "/resolve/" in e["path"]
    )


def test_the_real_hf_downloads_the_whole_repository_and_a_rerun_fetches_only_what_is_missing(
    served, hf_venv, tmp_path
):
    c = checkpoint.Checkpoint(repo=REPO, model_dir=str(tmp_path / "models"))
    listing = checkpoint.parse_listing(
        sh(checkpoint.listing_command(REPO, served["endpoint"])).stdout
    )
    contents = served["contents"]
    assert listing == checkpoint.Listing(
        served["repo"].commit, {n: len(d) for n, d in contents.items()}
    )
    (tmp_path / "token").write_text("hf_test_token\n")

    result = download(c, listing, served, hf_venv, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # progress lines while it ran (the shards come at 1 MiB/s), against the listed total
    assert re.search(
        r"Download the vLLM checkpoint \[.*\]: downloaded .* of 5\.0 MiB", result.stdout
    )
    assert "Download the vLLM checkpoint: done in " in result.stdout
    for name, data in contents.items():
        assert Path(c.directory, name).read_bytes() == data, name
    assert not (tmp_path / "token").exists()
    assert fetched(served["log"]) == sorted(contents)
    s = checkpoint.parse_state(sh(checkpoint.state_command(c)).stdout)
    assert s.complete and s.commit == served["repo"].commit and s.files == len(contents)

    # one shard gone, the other truncated with its old mtime put back
    Path(c.directory, SHARD_1).unlink()
    shard_2 = Path(c.directory, SHARD_2)
    before = shard_2.stat()
    with open(shard_2, "r+b") as f:
        f.truncate(1000)
    os.utime(shard_2, ns=(before.st_atime_ns, before.st_mtime_ns))
    s = checkpoint.parse_state(sh(checkpoint.state_command(c)).stdout)
    assert not s.complete and sorted(s.bad) == [SHARD_1, SHARD_2]

    served["log"].unlink()
    # the script finds them by the marker
    result = download(c, listing, served, hf_venv, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert fetched(served["log"]) == sorted([SHARD_1, SHARD_2])  # nothing else again
    for name, data in contents.items():
        assert Path(c.directory, name).read_bytes() == data, name
    assert checkpoint.parse_state(sh(checkpoint.state_command(c)).stdout).complete


# Issue 29 B2: an OOM kill by the kernel at the download unit's MemoryMax, not a kill -9.
XET_STANDIN = Path(__file__).parent / "xet_standin"  # its sitecustomize: hf_xet's memory


def memory_cgroup_base() -> Path | None:
    """This process's memory cgroup in a cgroup v1 memory hierarchy, where root can make a
    child with a limit of its own; None without one (or without root)."""
    if os.geteuid() != 0:
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (base / "memory.limit_in_bytes").is_file() and os.access(base, os.W_OK):
                return base
    return None


def test_a_real_cgroup_oom_kill_of_hf_is_retried_at_once_with_xet_off(served, hf_venv, tmp_path):
    """The checkpoint's download as the unit runs it (the watchdog, the real hf), in a memory
    cgroup capped at the unit's MemoryMax (download_memory_max 256M). With Xet on, hf grows
    past the cap (xet_standin/sitecustomize.py: hf_xet's buffers, which the sandbox's Hub
    cannot make the real hf_xet allocate); the kernel's OOM killer ends it (exit status 137,
    the cgroup's oom_kill count), and the next attempt runs with Xet off and completes.

    What the sandbox box cannot show on this machine: systemd's own part, OOMPolicy=continue
    keeping the unit (and so the script) alive after the kill. The box's systemd runs on
    cgroup v2 without a memory controller here (the host's memory controller is in its v1
    hierarchy), so MemoryMax= is not enforced in the box; the cap is set on a v1 cgroup
    instead, and the unit's text is checked for the policy."""
    base = memory_cgroup_base()
    if base is None:
        pytest.skip("needs root and a cgroup v1 memory hierarchy (as on the test machine)")
    c = checkpoint.Checkpoint(repo=REPO, model_dir=str(tmp_path / "models"))
    unit = model_script.unit_text_for(REPO, c.directory, "256M", token=False)
    assert "\nOOMPolicy=continue\n" in unit
    cap = re.search(r"^MemoryMax=(\S+)$", unit, re.M)
    assert cap and cap[1] == "256M"
    listing = checkpoint.parse_listing(
        sh(checkpoint.listing_command(REPO, served["endpoint"])).stdout
    )
    script = model_script.step_command(
        checkpoint.download_commands(
            c, listing, served["endpoint"], str(tmp_path / "token"), str(hf_venv),
            model_stage.HF_QUIET,
        )
    )  # fmt: skip
    xet_log = tmp_path / "xet.log"
    env = dict(os.environ, PYTHONPATH=str(XET_STANDIN), GPUBOX_TEST_XET_LOG=str(xet_log))
    cgroup = base / f"gpubox-test-oom-{os.getpid()}"
    cgroup.mkdir()
    try:
        (cgroup / "memory.limit_in_bytes").write_text(cap[1])
        # the script's shell enters the cgroup, then runs the script: all it starts is inside
        result = subprocess.run(
            ["/bin/sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec /bin/sh -c "$0"', script],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        control = (cgroup / "memory.oom_control").read_text()
        oom = dict(line.split() for line in control.splitlines())
    finally:
        for pid in (cgroup / "cgroup.procs").read_text().split():  # left by a failed run: ours
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        for _ in range(50):
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert oom["oom_kill"] == "1", (oom, output)  # the kernel killed once, at the cap
    assert xet_log.read_text().splitlines() == ["xet on", "xet off"], output
    assert "the transfer was killed (exit status 137: out of memory at MemoryMax?)" in output
    assert "hf was killed for memory (exit status 137): hf runs with Xet off" in output
    for name, data in served["contents"].items():
        assert Path(c.directory, name).read_bytes() == data, name
    assert checkpoint.parse_state(sh(checkpoint.state_command(c)).stdout).complete
