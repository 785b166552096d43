"""The model stage's download, run for real in a temporary directory: curl downloads the
Hub's file into <file>.part and the file moves into model_dir only once it verifies; a file
that does not verify is refused with both sha256s and leaves nothing behind; the stage's
commands run as one long step whose progress lines grow with the download; the size
announced by a Hub (or a URL) is read for the ETA. modelscope's download (the real client,
its stall watchdog): test_model_download_modelscope.py."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import model_plan, serving

from gpubox.config import load_host_config, validate
from gpubox.infra import progress
from gpubox.plans import model as plan_model
from gpubox.plans import model_pin
from gpubox.sandbox import hub
from gpubox.stages import model as model_stage

GOOD = b"GGUF tiny model stand-in\n" * 400
SHA = hashlib.sha256(GOOD).hexdigest()
BAD = GOOD[:-1] + b"?"
BAD_SHA = hashlib.sha256(BAD).hexdigest()


def plan(directory: Path, source: str = "hf", sha256: str | None = SHA) -> model_stage.ModelPlan:
    return model_plan(directory, source=source, sha256=sha256)


def run_step(p: model_stage.ModelPlan, hf_endpoint: str = "http://127.0.0.1:9", stall_s: int = 120):
    """The stage's commands as the unit's script runs them (one script, stops at a failure).
    modelscope's: tests/unit/test_model_download_modelscope.py, with the real client."""
    commands = model_stage.download_commands(
        p,
        hf_endpoint,
        "127.0.0.1:9",
        token_file=str(Path(p.directory).parent / "token"),
        stall_s=stall_s,
    )
    return subprocess.run(
        ["sh", "-c", model_stage.step_command(commands)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def hub_gets(log: Path) -> list[dict]:
    return [e for e in hub.read_log(log) if e["method"] == "GET"]


def test_a_good_download_moves_into_model_dir_and_leaves_nothing_else(hub_server, tmp_path):
    p = plan(tmp_path / "models")
    result = run_step(p, hf_endpoint=f"http://127.0.0.1:{hub_server}")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "models" / "tiny.gguf").read_bytes() == GOOD
    # readable by others (llama-server runs as its own user): the script sets no umask
    assert (tmp_path / "models" / "tiny.gguf").stat().st_mode & 0o004
    assert sorted(os.listdir(tmp_path / "models")) == ["tiny.gguf", "tiny.gguf.gpubox-verified"]
    assert plan_model.verified(p, state(p))
    (get,) = hub_gets(tmp_path / "requests.jsonl")
    assert get["path"] == "/gpubox/tiny-GGUF/resolve/main/tiny.gguf" and get["status"] == 200


def test_a_wrong_checksum_is_refused_naming_both_and_nothing_stays(hub_server, tmp_path):
    """What the backend would load is only ever a verified file: the check runs on the
    partial file, before the move."""
    p = plan(tmp_path / "models", sha256=BAD_SHA)
    result = run_step(p, hf_endpoint=f"http://127.0.0.1:{hub_server}")
    assert result.returncode == 1
    assert f"tiny.gguf has sha256 {SHA}, expected {BAD_SHA}; removed it" in result.stderr
    assert sorted(os.listdir(tmp_path / "models")) == []
    assert not plan_model.verified(p, state(p))
    # the next run with the right sha256 converges
    p = plan(tmp_path / "models")
    result = run_step(p, hf_endpoint=f"http://127.0.0.1:{hub_server}")
    assert result.returncode == 0, result.stderr
    assert plan_model.verified(p, state(p))


def test_an_interrupted_download_is_resumed_not_started_again(hub_server, tmp_path):
    """What a run cut short left (<file>.part) is resumed with a Range request: the Hub
    sends only the rest."""
    p = plan(tmp_path / "models")
    (tmp_path / "models").mkdir()
    Path(p.path + ".part").write_bytes(GOOD[:1000])
    result = run_step(p, hf_endpoint=f"http://127.0.0.1:{hub_server}")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "models" / "tiny.gguf").read_bytes() == GOOD
    (get,) = hub_gets(tmp_path / "requests.jsonl")
    assert (get["status"], get["range"], get["bytes"]) == (206, "bytes=1000-", len(GOOD) - 1000)


def test_hf_and_modelscope_ask_for_the_plans_revision(hub_server, tmp_path):
    files = {"tiny.gguf": tmp_path / "tiny.gguf", "README.md": tmp_path / "README.md"}
    commit = hub.make_repo("gpubox/tiny-GGUF", files).commit  # the fixture's repository
    p = model_plan(tmp_path / "models", sha256=SHA, revision=commit)
    assert run_step(p, hf_endpoint=f"http://127.0.0.1:{hub_server}").returncode == 0
    (get,) = hub_gets(tmp_path / "requests.jsonl")
    assert get["path"] == f"/gpubox/tiny-GGUF/resolve/{commit}/tiny.gguf"
    # modelscope's, with the real client: test_model_download_modelscope.py
    pinned = plan(tmp_path / "ms", source="modelscope")
    pinned = model_stage.ModelPlan(**{**pinned.__dict__, "revision": "v1.0"})
    assert "tiny.gguf --revision v1.0 --local_dir" in "".join(
        model_stage.download_commands(pinned, "", "127.0.0.1:9")
    )
    unpinned = plan(tmp_path / "other", source="modelscope")
    assert "--revision" not in "".join(model_stage.download_commands(unpinned, "", "127.0.0.1:9"))


def test_a_verified_file_is_not_hashed_again(hub_server, tmp_path):
    """The unit's script at boot, with the marker matching the file: done at once."""
    p = plan(tmp_path / "models")
    assert run_step(p, hf_endpoint=f"http://127.0.0.1:{hub_server}").returncode == 0
    again = run_step(p)  # no Hub there
    assert again.returncode == 0 and "is there and verified; kept" in again.stdout


def test_the_step_stops_at_the_first_failing_command_and_keeps_set_e():
    script = model_stage.step_command(["echo one", "set -e; false; echo two", "echo three"])
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10)
    assert result.returncode != 0 and result.stdout == "one\n"


def state(p: model_stage.ModelPlan) -> str:
    return subprocess.run(
        ["sh", "-c", plan_model.model_state_command(p)], capture_output=True, text=True
    ).stdout


# --------------------------------------------------------------------------- progress (G3)


def test_an_hf_download_shows_growing_progress_lines(tmp_path):
    """The long step with the stage's probe (the file's .part), every second, against a Hub
    that sends 200 kB/s: bytes grow from line to line, with the total and an ETA."""
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"G" * 800000)
    repo = hub.make_repo("gpubox/tiny-GGUF", {"tiny.gguf": model})
    control = tmp_path / "control.json"
    control.write_text('{"rate": 200000}')
    p = plan(tmp_path / "models", sha256=None)
    p = model_stage.ModelPlan(**{**p.__dict__, "size": 800000})
    with serving(hub.handler_class({repo.repo_id: repo}, None, control)) as port:
        commands = model_stage.download_commands(
            p, f"http://127.0.0.1:{port}", "", token_file=str(tmp_path / "t")
        )
        script = progress.wrapper_command(
            model_stage.step_command(commands),
            progress.download_probe(p.path, 800000),
            every=1,
            label="Download and verify tiny.gguf (hf)",
        )
        result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("Download and verify tiny.gguf (hf) [")
    ]
    sizes = [
        float(m[1])
        for m in (re.search(r"downloaded ([\d.]+) KiB of 781\.2 KiB", x) for x in lines)
        if m
    ]
    assert len(sizes) >= 2, result.stdout
    assert max(sizes[1:]) > sizes[0], result.stdout
    assert any("ETA" in line for line in lines), result.stdout
    assert (tmp_path / "models" / "tiny.gguf").stat().st_size == 800000


# --------------------------------------------------------------------------- the announced size


@pytest.fixture
def hub_server(tmp_path: Path) -> Iterator[int]:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(GOOD)
    readme = tmp_path / "README.md"
    readme.write_bytes(b"hello\n")
    repo = hub.make_repo("gpubox/tiny-GGUF", {"tiny.gguf": model, "README.md": readme})
    with serving(
        hub.handler_class({repo.repo_id: repo}, None, None, tmp_path / "requests.jsonl")
    ) as port:
        yield port


def announced(command: str | None, path: str | None = None) -> int | None:
    """The size the size query's answer announces (model_pin.announced_size), the command
    run with ``path`` as PATH when given."""
    assert command is not None
    env = {**os.environ, "PATH": path} if path else None
    result = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, timeout=30, env=env
    )
    return model_pin.announced_size(model_pin.parse_response(result.stdout))


def test_the_size_a_hub_announces_is_read(hub_server, tmp_path):
    endpoint = f"http://127.0.0.1:{hub_server}"
    p = plan(tmp_path)
    assert announced(plan_model.remote_size_command(p, endpoint)) == len(GOOD)
    readme = model_stage.ModelPlan(**{**p.__dict__, "file": "README.md"})
    assert announced(plan_model.remote_size_command(readme, endpoint)) == 6
    missing = model_stage.ModelPlan(**{**p.__dict__, "file": "nope.gguf"})
    assert announced(plan_model.remote_size_command(missing, endpoint)) is None
    url = model_stage.ModelPlan(
        **{
            **p.__dict__,
            "source": "url",
            "url": f"{endpoint}/gpubox/tiny-GGUF/resolve/main/tiny.gguf",
        }
    )
    assert announced(plan_model.remote_size_command(url, "")) == len(GOOD)
    assert plan_model.remote_size_command(plan(tmp_path, source="modelscope"), endpoint) is None
    # without curl (a fresh box before the deploy installs it): python3 asks the same
    no_curl = tmp_path / "bin"
    no_curl.mkdir()
    (no_curl / "sh").symlink_to(shutil.which("sh") or "/bin/sh")
    (no_curl / "python3").symlink_to(os.path.realpath(sys.executable))
    assert announced(plan_model.remote_size_command(p, endpoint), str(no_curl)) == len(GOOD)
    assert announced(plan_model.remote_size_command(url, ""), str(no_curl)) == len(GOOD)
    # nothing listens: no size, and the command still succeeds
    result = subprocess.run(
        ["sh", "-c", plan_model.remote_size_command(p, "http://127.0.0.1:9") or ""],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and result.stdout == ""


# --------------------------------------------------------------------------- config


REFERENCE = {"gpu_model": "Tesla V100-SXM2-32GB", "gpu_count": 2, "driver_branch": "570"}


def test_model_repo_points_hf_and_modelscope_at_any_repository():
    config = load_host_config("b", {**REFERENCE, "model_repo": "me/my-GGUF"})
    assert plan_model.plan(config).repo == "me/my-GGUF"
    config = load_host_config(
        "b", {**REFERENCE, "model_source": "modelscope", "model_repo": "me/ms-GGUF"}
    )
    assert plan_model.plan(config).repo == "me/ms-GGUF"
    default = plan_model.plan(load_host_config("b", REFERENCE))
    assert (
        default.repo
        == load_host_config("b", REFERENCE).catalog["models"]["qwen3-next-80b-a3b-thinking"][
            "hf_repo"
        ]
    )


def test_model_repo_is_validated():
    _, problems = validate("b", {**REFERENCE, "model_repo": "no-slash"})
    (problem,) = [x for x in problems if x.key == "model_repo"]
    assert problem.severity == "error" and "'owner/name'" in problem.message
    _, problems = validate("b", {**REFERENCE, "model_repo": "a/b/c"})
    assert [x.key for x in problems if x.severity == "error"] == ["model_repo"]
    _, problems = validate(
        "b",
        {
            **REFERENCE,
            "model_repo": "a/b",
            "model_source": "url",
            "model_url": "http://127.0.0.1:9/m.gguf",
        },
    )
    (problem,) = [x for x in problems if x.key == "model_repo"]
    assert problem.severity == "warning"


def test_a_model_file_of_its_own_does_not_take_the_catalogs_size_or_checksum():
    sized = {"catalog_overrides": {"models.qwen3-next-80b-a3b-thinking.size": 123}}
    assert plan_model.plan(load_host_config("b", {**REFERENCE, **sized})).size == 123
    config = load_host_config("b", {**REFERENCE, **sized, "model_file": "other.gguf"})
    p = plan_model.plan(config)
    assert p.sha256 is None and p.size is None


def test_the_wait_shows_journal_lines_that_journald_writes_late(tmp_path):
    """A unit that failed a moment ago may not have its last lines in the journal yet (the
    sandbox saw an empty tail on a busy box): the wait asks journald to catch up and looks
    again, so the refusal reaches the deploy's output."""
    p = model_plan(tmp_path / "models", sha256="0" * 64)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        'case "$*" in *ActiveState*) echo failed;; *Result*) echo exit-code;; '
        "*InvocationID*) echo 0123abcd;; esac\n"
    )
    # this run's lines show from the third look on; --sync is counted
    (bin_dir / "journalctl").write_text(
        "#!/bin/sh\n"
        f'case "$*" in *--sync*) echo sync >> {tmp_path}/syncs; exit 0;; esac\n'
        f"echo look >> {tmp_path}/looks\n"
        'case "$*" in *_SYSTEMD_INVOCATION_ID=0123abcd*) '
        f'[ "$(wc -l < {tmp_path}/looks)" -ge 3 ] && echo "gpubox: tiny.gguf has sha256 1f0c, '
        'expected 0000; removed it";; esac\n'
    )
    for tool in ("systemctl", "journalctl"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["sh", "-c", model_stage.wait_command(p)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 1
    assert "ended without a verified tiny.gguf; its last journal lines:" in result.stderr
    assert "tiny.gguf has sha256 1f0c, expected 0000; removed it" in result.stderr
    assert (tmp_path / "syncs").read_text().count("sync") >= 3
