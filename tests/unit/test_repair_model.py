"""The model stage's shell, run for real in a temporary directory, one command after the
other as pyinfra runs them (each by `sh -c`, stopping at the first failure), with the
downloaders (hf, curl) replaced by scripts: the Hugging Face token file never outlives the
download command, and a model file that changed after it was verified is verified again and
downloaded again when it no longer verifies."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import model_plan

from gpubox.plans import model as plan_model
from gpubox.stages import model as model_stage

GOOD = b"GGUF tiny model stand-in\n" * 40
SHA = hashlib.sha256(GOOD).hexdigest()


def run(commands: list[str], shims: Path | None = None) -> subprocess.CompletedProcess:
    """The commands in order, each by sh -c, stopping at the first failure (as pyinfra)."""
    env = dict(os.environ)
    if shims is not None:
        env["PATH"] = f"{shims}:{env['PATH']}"
    result = subprocess.CompletedProcess([], 0, "", "")
    for command in commands:
        step = subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, env=env, timeout=60
        )
        result = subprocess.CompletedProcess(
            command, step.returncode, result.stdout + step.stdout, result.stderr + step.stderr
        )
        if step.returncode != 0:
            break
    return result


def state(p: model_stage.ModelPlan) -> str:
    """What the stage's fact reads on the box."""
    return subprocess.run(
        ["sh", "-c", plan_model.model_state_command(p)], capture_output=True, text=True
    ).stdout


# --------------------------------------------------------------------------- HF token (8a)


def hf_plan(directory: Path) -> model_stage.ModelPlan:
    return model_plan(directory, repo="example/tiny-GGUF", sha256=SHA)


def fake_curl(tmp_path: Path, body: str) -> tuple[Path, Path]:
    """A curl on PATH that runs ``body`` with $out set to its -o path (after noting whether
    its header file carried the token); the token file, written as the stage writes it."""
    shims = tmp_path / "bin"
    shims.mkdir()
    curl = shims / "curl"
    curl.write_text(
        "#!/bin/sh\n"
        "hdr=; out=\n"
        'while [ $# -gt 0 ]; do case "$1" in -H) hdr=${2#@};; -o) out=$2;; esac; shift; done\n'
        f'grep -qx "Authorization: Bearer hf_secret" "$hdr" && echo yes > {tmp_path}/had-token\n'
        + body
    )
    curl.chmod(0o755)
    token = tmp_path / "cache" / "hf-token"
    token.parent.mkdir()
    token.write_text("hf_secret\n")
    token.chmod(0o600)
    return shims, token


def hf_commands(tmp_path: Path, token: Path) -> list[str]:
    p = hf_plan(tmp_path / "models")
    return model_stage.download_commands(p, "https://hf.example.org", "", token_file=str(token))


def test_the_token_file_is_removed_when_the_download_fails(tmp_path):
    shims, token = fake_curl(tmp_path, 'echo "503 Service Unavailable" >&2; exit 22\n')
    commands = hf_commands(tmp_path, token)
    assert "hf_secret" not in " ".join(commands)
    result = run(commands, shims)
    assert result.returncode == 22 and "503 Service Unavailable" in result.stderr
    assert "the transfer failed 3 times (exit status 22)" in result.stderr
    assert (tmp_path / "had-token").read_text() == "yes\n"  # the download got the token
    assert not token.exists()
    assert not (tmp_path / "models" / "tiny.gguf.gpubox-verified").exists()


def test_a_stopped_download_keeps_the_token_for_its_resume_but_not_the_header(tmp_path):
    """SIGTERM to the download's shell (the unit stopped, the box shutting down): the token
    file stays for the run that resumes it (the unit at boot, or the next deploy); the header
    file with the token in it goes."""
    body = f"echo $$ > {tmp_path}/curl-pid; sleep 30\n"
    shims, token = fake_curl(tmp_path, body)
    mkdir, command, _ = hf_commands(tmp_path, token)
    os.makedirs(tmp_path / "models")
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(["sh", "-c", command], env=env)
    try:
        for _ in range(100):
            if (tmp_path / "curl-pid").exists() and (tmp_path / "had-token").exists():
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 143
    finally:
        pid = (tmp_path / "curl-pid").read_text().strip()
        subprocess.run(["kill", pid], check=False)
    assert token.exists()
    assert [f.name for f in tmp_path.glob("tmp.*")] == []  # the header file (mktemp) is gone


def test_the_token_file_is_removed_after_a_good_download(tmp_path):
    shims, token = fake_curl(tmp_path, f"printf '%s' '{GOOD.decode()}' > \"$out\"\n")
    result = run(hf_commands(tmp_path, token), shims)
    assert result.returncode == 0, result.stderr
    assert not token.exists()
    assert plan_model.verified(hf_plan(tmp_path / "models"), state(hf_plan(tmp_path / "models")))


def test_the_token_file_is_removed_when_the_file_was_intact(tmp_path):
    shims, token = fake_curl(tmp_path, f"echo called > {tmp_path}/curl-called; exit 1\n")
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny.gguf").write_bytes(GOOD)  # there, but no marker: verified again, kept
    result = run(hf_commands(tmp_path, token), shims)
    assert result.returncode == 0, result.stderr
    assert "tiny.gguf is there and verifies; kept" in result.stdout
    assert not (tmp_path / "curl-called").exists() and not token.exists()


# --------------------------------------------------------------------------- repair (H)


def url_plan(directory: Path, sha256: str | None = SHA, size: int | None = None):
    url = "http://127.0.0.1:9/tiny.gguf"
    return model_plan(directory, source="url", repo="", url=url, sha256=sha256, size=size)


@pytest.fixture
def curl(tmp_path):
    """A curl that writes SERVE (the file `serve` holds) to its -o path and counts calls."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (tmp_path / "serve").write_bytes(GOOD)
    script = shims / "curl"
    script.write_text(
        "#!/bin/sh\n"
        f"echo call >> {tmp_path}/curl-calls\n"
        'while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n'
        f'cat {tmp_path}/serve > "$out"\n'
    )
    script.chmod(0o755)
    return shims


def calls(tmp_path: Path) -> int:
    f = tmp_path / "curl-calls"
    return len(f.read_text().splitlines()) if f.exists() else 0


def deploy(p: model_stage.ModelPlan, shims: Path) -> subprocess.CompletedProcess | None:
    """What the stage does: nothing when the fact says verified, else the download."""
    if plan_model.verified(p, state(p)):
        return None
    return run(model_stage.download_commands(p, "", ""), shims)


@pytest.mark.parametrize("known", ["sha256", "size"])
def test_a_truncated_model_is_downloaded_again(tmp_path, curl, known):
    p = url_plan(
        tmp_path / "models",
        sha256=SHA if known == "sha256" else None,
        size=len(GOOD) if known == "size" else None,
    )
    first = deploy(p, curl)
    assert first is not None and first.returncode == 0, first and first.stderr
    assert calls(tmp_path) == 1 and Path(p.path).read_bytes() == GOOD
    assert deploy(p, curl) is None  # verified once, recorded: nothing to do

    with open(p.path, "r+b") as f:  # truncated (a full disk, a careless copy)
        f.truncate(len(GOOD) // 2)
    assert not plan_model.verified(p, state(p))
    again = deploy(p, curl)
    assert again is not None and again.returncode == 0, again and again.stderr
    assert calls(tmp_path) == 2 and Path(p.path).read_bytes() == GOOD
    assert deploy(p, curl) is None


def test_a_corrupted_model_of_the_same_size_is_downloaded_again(tmp_path, curl):
    p = url_plan(tmp_path / "models")
    deploy(p, curl)
    data = bytearray(GOOD)
    data[10] ^= 0xFF
    Path(p.path).write_bytes(bytes(data))  # rewritten in place: same size, new mtime
    os.utime(p.path, (1, 1))
    assert not plan_model.verified(p, state(p))
    again = deploy(p, curl)
    assert again is not None and again.returncode == 0
    assert calls(tmp_path) == 2 and Path(p.path).read_bytes() == GOOD


def test_a_touched_but_intact_model_is_verified_again_not_downloaded(tmp_path, curl):
    p = url_plan(tmp_path / "models")
    deploy(p, curl)
    os.utime(p.path, (1, 1))  # a backup restore, say: the mtime moved, the bytes did not
    again = deploy(p, curl)
    assert again is not None and again.returncode == 0
    assert "tiny.gguf is there and verifies; kept" in again.stdout
    assert calls(tmp_path) == 1
    assert deploy(p, curl) is None


def test_a_deleted_model_is_downloaded_again(tmp_path, curl):
    p = url_plan(tmp_path / "models")
    deploy(p, curl)
    os.remove(p.path)
    assert not plan_model.verified(p, state(p))
    assert deploy(p, curl).returncode == 0
    assert calls(tmp_path) == 2 and Path(p.path).read_bytes() == GOOD


def test_a_bad_download_fails_and_leaves_no_partial_to_resume(tmp_path, curl):
    p = url_plan(tmp_path / "models")
    (tmp_path / "serve").write_bytes(GOOD[:-1] + b"!")
    result = deploy(p, curl)
    assert result is not None and result.returncode == 1
    assert f"tiny.gguf has sha256 {hashlib.sha256(GOOD[:-1] + b'!').hexdigest()}" in result.stderr
    assert "removed it" in result.stderr
    assert not Path(p.path + ".part").exists() and not Path(p.path).exists()
    assert not Path(p.marker).exists()
    (tmp_path / "serve").write_bytes(GOOD)  # the mirror fixed: the next deploy succeeds
    assert deploy(p, curl).returncode == 0 and Path(p.path).read_bytes() == GOOD
