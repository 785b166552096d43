"""The vLLM checkpoint's shell (gpubox.plans.checkpoint), run for real with /bin/sh in a
temporary directory and a fake `hf` that downloads as hf does (partial files under
DIR/.cache/huggingface/download, then moved into DIR, a metadata file per file): the marker is
written only once every listed file has its size; the state fact finds a missing or resized
file; a second run removes that file first and skips nothing else; the token file goes however
the download ends; the long step's lines count the whole directory against the listed total.
The Hub's listing is read from the sandbox's Hub served in this process."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import serving

from gpubox.base import layout
from gpubox.infra import progress
from gpubox.plans import checkpoint, model_script
from gpubox.sandbox import hub
from gpubox.stages import model as model_stage

REPO = "someone/Tiny-int4"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {
    "config.json": 120,
    "model-00001-of-00002.safetensors": 300_000,
    "model-00002-of-00002.safetensors": 200_000,
    "sub dir/tokenizer config.json": 77,  # a space and a subdirectory
}
LISTING = checkpoint.Listing(COMMIT, dict(FILES))


def fake_hf(tmp_path: Path, files: dict[str, int], delay: float = 0, fail: bool = False) -> Path:
    """A venv whose bin/hf downloads ``files`` (zero bytes of each size) into --local-dir as
    hf does, skipping a file already there; it logs its arguments, the files it found there,
    whether the token file was there and what HF_TOKEN it got."""
    venv = tmp_path / "hf-venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    lines = [
        "#!/bin/sh",
        f'echo "$@" > {tmp_path}/hf-args',
        f'printf "%s" "$HF_TOKEN" > {tmp_path}/hf-token-seen',
        'dir=; while [ $# -gt 0 ]; do case "$1" in --local-dir) dir=$2;; esac; shift; done',
        'dl="$dir/.cache/huggingface/download"; mkdir -p "$dl"',
    ]
    for name, size in files.items():
        path = f'"$dir"/{shlex.quote(name)}'
        partial = f'"$dl"/{shlex.quote(name.replace("/", "_"))}.incomplete'
        lines += [
            f"if [ -e {path} ]; then echo {shlex.quote(name)} >> {tmp_path}/hf-found; else",
            f'  mkdir -p "$(dirname {path})"',
            f"  head -c {size} /dev/zero > {partial}",
            f"  sleep {delay}" if delay else "  :",
            f"  mv {partial} {path}",
            f'  printf "{COMMIT}\\netag\\n1\\n" > "$dl"/{shlex.quote(name.replace("/", "_"))}'
            ".metadata",
            "fi",
        ]
    if fail:
        lines.append("exit 3")
    (venv / "bin" / "hf").write_text("\n".join(lines) + "\n")
    (venv / "bin" / "hf").chmod(0o755)
    return venv


def run(
    c: checkpoint.Checkpoint,
    venv: Path,
    listing: checkpoint.Listing | None = LISTING,
    stall_s: int = 120,
) -> subprocess.CompletedProcess[str]:
    """The unit's script for the checkpoint (its commands as one script), run by /bin/sh."""
    token = Path(c.model_dir).parent / "token"
    commands = checkpoint.download_commands(
        c,
        listing,
        "http://127.0.0.1:9",
        str(token),
        str(venv),
        model_stage.HF_QUIET,
        stall_s=stall_s,
    )
    return subprocess.run(
        ["/bin/sh", "-c", model_stage.step_command(commands)],
        capture_output=True,
        text=True,
        timeout=90,
    )


def state(c: checkpoint.Checkpoint) -> checkpoint.State:
    out = subprocess.run(
        ["/bin/sh", "-c", checkpoint.state_command(c)], capture_output=True, text=True, timeout=30
    )
    return checkpoint.parse_state(out.stdout)


@pytest.fixture
def c(tmp_path: Path) -> checkpoint.Checkpoint:
    return checkpoint.Checkpoint(repo=REPO, model_dir=str(tmp_path / "models"))


def test_a_download_writes_the_marker_with_the_commit_and_every_files_size(c, tmp_path):
    assert not state(c).marker and not state(c).complete
    (tmp_path / "token").write_text("hf_secret\n")
    result = run(c, fake_hf(tmp_path, FILES))
    assert result.returncode == 0, result.stderr
    args = (tmp_path / "hf-args").read_text().split()
    assert args == [
        "download",
        REPO,
        "--revision",
        COMMIT,
        "--local-dir",
        c.directory,
        "--max-workers",
        str(checkpoint.MAX_WORKERS),
    ]
    assert (tmp_path / "hf-token-seen").read_text() == "hf_secret"
    assert not (tmp_path / "token").exists()  # removed once the download ended
    marker = Path(c.marker).read_text().splitlines()
    assert marker[:2] == [f"repo {REPO}", f"commit {COMMIT}"]
    assert sorted(marker[2:]) == sorted(f"file {s} {n}" for n, s in FILES.items())
    s = state(c)
    assert s.complete and s.commit == COMMIT and s.files == len(FILES) and not s.bad
    assert s.present >= sum(FILES.values())


def test_a_missing_or_resized_file_is_found_and_only_it_is_fetched_again(c, tmp_path):
    assert run(c, fake_hf(tmp_path, FILES)).returncode == 0
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    Path(c.directory, first).unlink()
    with open(Path(c.directory, second), "r+b") as f:
        f.truncate(1000)  # resized
    s = state(c)
    assert not s.complete and sorted(s.bad) == [first, second]
    (tmp_path / "hf-found").unlink(missing_ok=True)
    result = run(c, fake_hf(tmp_path, FILES), listing=None)
    assert result.returncode == 0, result.stderr
    # the script found the resized file by the old marker and removed it before hf ran (hf
    # would keep a file it has metadata for); the files that matched were there and kept
    found = (tmp_path / "hf-found").read_text().splitlines()
    assert sorted(found) == ["config.json", "sub dir/tokenizer config.json"]
    assert Path(c.directory, second).stat().st_size == FILES[second]
    assert state(c).complete


def test_a_short_file_after_hf_leaves_no_marker_and_names_it(c, tmp_path):
    short = {**FILES, "model-00002-of-00002.safetensors": 199_999}
    result = run(c, fake_hf(tmp_path, short))
    assert result.returncode == 1
    assert (
        f"gpubox: {REPO}: model-00002-of-00002.safetensors has 199999 bytes, expected 200000"
        in result.stderr
    )
    assert not Path(c.marker).exists() and not Path(c.marker + ".new").exists()
    assert not state(c).complete


def test_a_failed_hf_removes_the_old_marker_and_the_token(c, tmp_path, monkeypatch):
    monkeypatch.setattr(model_script, "RETRY_S", 0)
    assert run(c, fake_hf(tmp_path, FILES)).returncode == 0
    (tmp_path / "token").write_text("hf_secret\n")
    Path(c.directory, "config.json").unlink()
    result = run(c, fake_hf(tmp_path, {}, fail=True))
    assert result.returncode == 3
    assert f"the transfer failed {model_script.ATTEMPTS} times (exit status 3)" in result.stderr
    assert not Path(c.marker).exists() and not (tmp_path / "token").exists()
    assert not state(c).marker


def test_without_a_listing_the_marker_lists_what_hf_left(c, tmp_path):
    result = run(c, fake_hf(tmp_path, FILES), listing=None)
    assert result.returncode == 0, result.stderr
    assert "--revision" not in (tmp_path / "hf-args").read_text()
    marker = Path(c.marker).read_text().splitlines()
    assert marker[:2] == [f"repo {REPO}", f"commit {COMMIT}"]  # from hf's metadata
    assert sorted(marker[2:]) == sorted(f"file {s} {n}" for n, s in FILES.items())  # no .cache
    assert state(c).complete


def test_the_long_step_counts_the_directory_against_the_listed_total(c, tmp_path):
    files = {"a.safetensors": 400_000, "b.safetensors": 400_000, "config.json": 10}
    listing = checkpoint.Listing(COMMIT, files)
    commands = checkpoint.download_commands(
        c,
        listing,
        "http://127.0.0.1:9",
        str(tmp_path / "token"),
        str(fake_hf(tmp_path, files, delay=1.5)),
        model_stage.HF_QUIET,
    )
    script = progress.wrapper_command(
        model_stage.step_command(commands),
        progress.download_probe(c.directory, listing.total),
        every=1,
        label="Download the vLLM checkpoint",
    )
    result = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [
        x for x in result.stdout.splitlines() if x.startswith("Download the vLLM checkpoint [")
    ]
    sizes = [
        float(m[1])
        for m in (re.search(r"downloaded ([\d.]+) KiB of 781\.3 KiB", x) for x in lines)
        if m
    ]
    assert len(sizes) >= 2 and max(sizes) > min(sizes), result.stdout
    assert any("ETA" in x for x in lines), result.stdout
    assert state(c).complete


def test_the_listing_is_parsed_strictly():
    info = {"sha": COMMIT, "siblings": [{"rfilename": n, "size": s} for n, s in FILES.items()]}
    listing = checkpoint.parse_listing(json.dumps(info))
    assert listing == LISTING and listing.total == sum(FILES.values())
    lfs_only = {"sha": COMMIT, "siblings": [{"rfilename": "a", "lfs": {"size": 5}}]}
    assert checkpoint.parse_listing(json.dumps(lfs_only)) == checkpoint.Listing(COMMIT, {"a": 5})
    for broken in (
        "",
        "not json",
        json.dumps({"sha": "main", "siblings": info["siblings"]}),
        json.dumps({"sha": COMMIT, "siblings": []}),
        json.dumps({"sha": COMMIT, "siblings": [{"rfilename": "a"}]}),  # no size
        json.dumps({"sha": COMMIT, "siblings": [{"rfilename": "../a", "size": 1}]}),
        json.dumps({"sha": COMMIT, "siblings": [{"rfilename": "/etc/x", "size": 1}]}),
        json.dumps({"sha": COMMIT, "siblings": [{"rfilename": "a\nfile 1 b", "size": 1}]}),
    ):
        assert checkpoint.parse_listing(broken) is None, broken


def test_a_repository_name_that_is_no_owner_slash_name_is_refused():
    from gpubox.config import load_host_config

    base = {"gpu_model": "Tesla V100-SXM2-32GB", "gpu_count": 2, "backend": "vllm"}
    for bad in ("../../etc", "a/b/c", "a", "a/.."):
        key = "models.qwen3-next-80b-a3b-thinking.vllm_repo"
        config = load_host_config("b", {**base, "catalog_overrides": {key: bad}})
        with pytest.raises(ValueError, match="not a Hugging Face repository"):
            checkpoint.plan(config)


# --------------------------------------------------------------------------- the Hub's listing


@pytest.fixture
def hub_server(tmp_path: Path) -> Iterator[tuple[int, hub.HubRepo]]:
    """The sandbox's Hub with a two-shard repository, in this process; stops within 60 s."""
    files = {}
    for name, size in {"config.json": 50, "model-00001-of-00002.safetensors": 70_000}.items():
        path = tmp_path / "served" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        files[name] = path
    repo = hub.make_repo(REPO, files)
    with serving(hub.handler_class({repo.repo_id: repo})) as port:
        yield port, repo


def test_the_hubs_listing_gives_the_commit_and_the_sizes(hub_server):
    port, repo = hub_server
    command = checkpoint.listing_command(REPO, f"http://127.0.0.1:{port}/")
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30)
    listing = checkpoint.parse_listing(out.stdout)
    assert listing == checkpoint.Listing(
        repo.commit, {"config.json": 50, "model-00001-of-00002.safetensors": 70_000}
    )
    missing = checkpoint.listing_command("nobody/none", f"http://127.0.0.1:{port}")
    out = subprocess.run(["/bin/sh", "-c", missing], capture_output=True, text=True, timeout=30)
    assert checkpoint.parse_listing(out.stdout) is None


# ------------------------------------------------ the unit's script: watchdog, Xet, leftovers


def stalling_hf(tmp_path: Path, stalls: int) -> Path:
    """A venv whose bin/hf, on each of its first ``stalls`` runs, leaves a partial file under
    hf's download cache (named anew each run, as huggingface_hub 1.x names it) and then hangs
    without writing a byte; the next run downloads FILES (``fake_hf``). Every run logs its
    HF_HUB_DISABLE_XET and the leftover partial files it found."""
    venv = fake_hf(tmp_path, FILES)
    hf = venv / "bin" / "hf"
    real = venv / "bin" / "hf-real"
    hf.rename(real)
    hf.write_text(
        "#!/bin/sh\n"
        f"runs=$(cat {tmp_path}/runs 2>/dev/null || echo 0); runs=$((runs + 1)); "
        f"echo $runs > {tmp_path}/runs\n"
        f'echo "run $runs xet_off=${{HF_HUB_DISABLE_XET:-}}" >> {tmp_path}/hf-log\n'
        'dir=; for a in "$@"; do [ -n "$next" ] && dir=$a; next=; '
        '[ "$a" = --local-dir ] && next=1; done\n'
        'dl="$dir/.cache/huggingface/download"; mkdir -p "$dl"\n'
        f'ls "$dl" | grep "\\.incomplete$" >> {tmp_path}/hf-leftovers\n'
        f'if [ "$runs" -le {stalls} ]; then\n'
        '  head -c 1000 /dev/zero > "$dl/model-00001-of-00002.safetensors.$runs$$.incomplete"\n'
        "  exec sleep 60\n"
        "fi\n"
        f'exec {real} "$@"\n'
    )
    hf.chmod(0o755)
    return venv


def test_after_two_stalls_hf_runs_with_xet_off_and_no_leftover_is_kept(c, tmp_path):
    """The stall watchdog restarts a transfer that writes nothing for download_stall_s; from
    the second stall on, hf runs with HF_HUB_DISABLE_XET=1 (the way out of a hung hf_xet);
    each run first removes the partial files an earlier run left (hf 1.x never resumes them)."""
    result = run(c, stalling_hf(tmp_path, stalls=2), stall_s=2)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("no new bytes for 2 s (download_stall_s)") == 2
    assert (tmp_path / "hf-log").read_text().splitlines() == [
        "run 1 xet_off=",
        "run 2 xet_off=",
        "run 3 xet_off=1",
    ]
    assert "gpubox: 2 stalls: hf runs with Xet off (HF_HUB_DISABLE_XET=1)" in result.stdout
    assert (tmp_path / "hf-leftovers").read_text() == ""  # each run found none left
    assert not list(Path(c.directory, ".cache").rglob("*.incomplete"))
    assert state(c).complete


def oom_killed_hf(tmp_path: Path, kills: int) -> Path:
    """A venv whose bin/hf, on each of its first ``kills`` runs, writes part of a file and is
    then SIGKILLed as the kernel's OOM killer ends a process at the unit's MemoryMax (exit
    status 137); the next run downloads FILES. Every run logs its HF_HUB_DISABLE_XET and the
    hf_xet bounds it got."""
    venv = fake_hf(tmp_path, FILES)
    hf = venv / "bin" / "hf"
    real = venv / "bin" / "hf-real"
    hf.rename(real)
    hf.write_text(
        "#!/bin/sh\n"
        f"runs=$(cat {tmp_path}/runs 2>/dev/null || echo 0); runs=$((runs + 1)); "
        f"echo $runs > {tmp_path}/runs\n"
        f'echo "run $runs xet_off=${{HF_HUB_DISABLE_XET:-}} '
        f'ac=$HF_XET_CLIENT_AC_MAX_DOWNLOAD_CONCURRENCY" >> {tmp_path}/hf-log\n'
        f'if [ "$runs" -le {kills} ]; then kill -KILL $$; fi\n'
        f'exec {real} "$@"\n'
    )
    hf.chmod(0o755)
    return venv


def test_an_oom_kill_turns_xet_off_for_the_next_attempt_at_once(c, tmp_path):
    """Issue 29 B2: an attempt killed for memory (exit 137) is retried, and the retry runs
    with Xet off, without waiting for stalls; Xet's parallelism is bounded from the start."""
    result = run(c, oom_killed_hf(tmp_path, kills=1))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "hf-log").read_text().splitlines() == [
        "run 1 xet_off= ac=8",
        "run 2 xet_off=1 ac=8",
    ]
    assert "exit status 137" in result.stdout
    assert "hf was killed for memory (exit status 137): hf runs with Xet off" in result.stdout
    assert state(c).complete


def test_failures_that_brought_bytes_do_not_add_up(c, tmp_path, monkeypatch):
    """Issue 29 B3: the failure count starts again after an attempt during which bytes
    arrived: more failures than ATTEMPTS, each after some bytes, still end in a download."""
    monkeypatch.setattr(model_script, "RETRY_S", 0)
    venv = fake_hf(tmp_path, FILES)
    hf = venv / "bin" / "hf"
    real = venv / "bin" / "hf-real"
    hf.rename(real)
    failures = model_script.ATTEMPTS + 2
    hf.write_text(
        "#!/bin/sh\n"
        f"runs=$(cat {tmp_path}/runs 2>/dev/null || echo 0); runs=$((runs + 1)); "
        f"echo $runs > {tmp_path}/runs\n"
        'dir=; for a in "$@"; do [ -n "$next" ] && dir=$a; next=; '
        '[ "$a" = --local-dir ] && next=1; done\n'
        f'if [ "$runs" -le {failures} ]; then '
        'head -c 1000 /dev/zero > "$dir/done-$runs.bin"; exit 3; fi\n'
        f'exec {real} "$@"\n'
    )
    hf.chmod(0o755)
    result = run(c, venv)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("the transfer failed (exit status 3)") == failures
    assert state(c).complete


def test_the_watchdog_gives_up_after_repeated_stalls(c, tmp_path, monkeypatch):
    monkeypatch.setattr(model_script, "MAX_STALLS", 3)
    result = run(c, stalling_hf(tmp_path, stalls=99), stall_s=1)
    assert result.returncode == 1
    assert f"stalled {model_script.MAX_STALLS} times; giving up" in result.stderr
    log = (tmp_path / "hf-log").read_text().splitlines()
    assert len(log) == model_script.MAX_STALLS
    assert log[model_script.XET_OFF_AFTER :] == [
        f"run {n} xet_off=1" for n in range(model_script.XET_OFF_AFTER + 1, len(log) + 1)
    ]
    assert not Path(c.marker).exists()


def test_a_file_of_another_size_than_listed_goes_and_a_complete_one_stays(c, tmp_path):
    """A run that follows a stopped one (the unit after a reboot): the files complete by then
    are kept, whatever the plan found missing; a file at another size than the listing's is
    removed before hf runs."""
    shard_1, shard_2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    Path(c.directory).mkdir(parents=True)
    Path(c.directory, shard_1).write_bytes(b"\0" * FILES[shard_1])
    Path(c.directory, shard_2).write_bytes(b"\0" * 10)
    result = run(c, fake_hf(tmp_path, FILES))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "hf-found").read_text().splitlines() == [shard_1]
    assert Path(c.directory, shard_2).stat().st_size == FILES[shard_2]
    assert state(c).complete


def test_a_complete_checkpoint_runs_no_hf(c, tmp_path):
    """The script run again once complete (the unit started at a boot before it was
    disabled): kept, hf not run."""
    assert run(c, fake_hf(tmp_path, FILES)).returncode == 0
    (tmp_path / "hf-args").unlink()
    result = run(c, fake_hf(tmp_path, FILES))
    assert result.returncode == 0, result.stderr
    assert f"gpubox: {REPO} is complete in {c.directory}; kept" in result.stdout
    assert not (tmp_path / "hf-args").exists()
    # another commit listed: downloaded again (hf asked for that commit)
    other = checkpoint.Listing("f" * 40, dict(FILES))
    assert run(c, fake_hf(tmp_path, FILES), listing=other).returncode == 0
    assert f"--revision {'f' * 40}" in (tmp_path / "hf-args").read_text()


def test_the_wait_succeeds_only_on_a_complete_checkpoint(c, tmp_path):
    """The backend's wait (systemctl stood in by a script that says the unit is inactive)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"systemctl": "echo inactive", "journalctl": 'echo "hf: boom"'}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    token = tmp_path / "token-left"
    token.write_text("hf_secret\n")

    def wait() -> subprocess.CompletedProcess[str]:
        # the token file's path on this machine's /root stays untouched
        command = checkpoint.wait_command(c).replace(layout.HF_TOKEN_FILE, str(token))
        return subprocess.run(
            ["/bin/sh", "-c", command],
            capture_output=True, text=True, timeout=30, env=env,
        )  # fmt: skip

    failed = wait()
    assert failed.returncode == 1
    assert f"ended without a complete {REPO}; its last journal lines:" in failed.stderr
    assert "hf: boom" in failed.stderr
    assert run(c, fake_hf(tmp_path, FILES)).returncode == 0
    ok = wait()
    assert ok.returncode == 0, ok.stderr
    assert f"gpubox: {REPO} downloaded (every file at its size)" in ok.stdout
    assert not token.exists()  # removed once the checkpoint is complete
