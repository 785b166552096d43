"""The vLLM image's pull unit, run for real with stand-in `docker`, `systemctl` and
`journalctl` executables: the unit's command retries a failed pull (ATTEMPTS in all) and
fails after the last; the vLLM stage's wait succeeds only once Docker has the image, and
otherwise fails with the pull unit's journal lines."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from gpubox.stages import vllm_image

IMAGE = "vllm/vllm-openai:v0.19.1"


def stand_ins(tmp_path: Path, failures: int, has_image: bool) -> dict[str, str]:
    """PATH with a docker whose first ``failures`` pulls fail (each logged), whose `image
    inspect` answers per ``has_image``; systemctl says the unit is inactive."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "pulls"
    scripts = {
        "docker": (
            f'if [ "$1" = pull ]; then echo "$2" >> {log}; '
            f'[ "$(wc -l < {log})" -gt {failures} ] && exit 0; '
            'echo "pull: timeout" >&2; exit 1; fi\n'
            f'if [ "$1" = image ]; then {"echo sha256:0123" if has_image else "exit 1"}; fi\n'
        ),
        "systemctl": "echo inactive",
        "journalctl": 'echo "Error response from daemon: TLS handshake timeout"',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def exec_start(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(vllm_image, "RETRY_S", 0)
    (line,) = [x for x in vllm_image.unit_text(IMAGE).splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))  # no $, %, \\: systemd reads it alike


@pytest.mark.parametrize(("failures", "rc"), [(0, 0), (2, 0), (3, 1)])
def test_the_unit_retries_a_failed_pull(tmp_path, monkeypatch, failures, rc):
    argv = exec_start(monkeypatch)
    env = stand_ins(tmp_path, failures, has_image=False)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == rc, result.stdout + result.stderr
    pulls = (tmp_path / "pulls").read_text().splitlines()
    assert pulls == [IMAGE] * min(failures + 1, vllm_image.ATTEMPTS)


def test_the_wait_succeeds_only_once_docker_has_the_image(tmp_path):
    command = vllm_image.wait_command(IMAGE)
    failed = subprocess.run(
        ["/bin/sh", "-c", command],
        capture_output=True, text=True, timeout=30,
        env=stand_ins(tmp_path, 0, has_image=False),
    )  # fmt: skip
    assert failed.returncode == 1
    assert "the image pull (gpubox-vllm-pull.service: inactive" in failed.stderr
    assert "TLS handshake timeout" in failed.stderr
    # the model download's unit and token are not this wait's to touch
    assert "hf-token" not in command and "disable" not in command
    ok = subprocess.run(
        ["/bin/sh", "-c", command],
        capture_output=True, text=True, timeout=30,
        env=stand_ins(tmp_path, 0, has_image=True),
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert f"gpubox: {IMAGE} pulled" in ok.stdout
