"""The API key stays out of every argument list: the vLLM warm-up hands it to curl on standard
input. (The check that looks for it in ps, naming only the offending processes, is tested with
the other checks in test_checks.py.)"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from gpubox.stages import vllm as vllm_stage

KEY = 'k3y-"quoted"-back\\slash-0123456789abcdef'


def _logging_wrapper(bin_dir: Path, name: str, real: str | None, log: Path) -> None:
    """``name`` on PATH: logs its argv (and, for curl, its standard input), then runs ``real``."""
    tail = f'exec {shlex.quote(real)} "$@"' if real else f"cat > {shlex.quote(str(log))}.stdin"
    path = bin_dir / name
    path.write_text(
        f'#!/bin/sh\nprintf \'%s\\n\' "$0" "$@" >> {shlex.quote(str(log))}\n'
        f"cat /proc/$PPID/cmdline >> {shlex.quote(str(log))}.parents\n{tail}\n"
    )
    path.chmod(0o755)


def curl_config_header(text: str) -> str:
    """The value of curl's `header = "..."` config line (curl's escapes: \\\\ and \\")."""
    (line,) = text.splitlines()
    prefix = 'header = "'
    assert line.startswith(prefix) and line.endswith('"'), line
    value, out, i = line[len(prefix) : -1], "", 0
    while i < len(value):
        if value[i] == "\\":
            i += 1
        out, i = out + value[i], i + 1
    return out


def test_the_warm_up_command_text_has_no_key_and_no_substitution():
    command = vllm_stage.warm_up_command(8000, "alias's", "/etc/gpubox/api-key")
    assert "$(" not in command and "`" not in command and "Bearer $" not in command
    assert "--config -" in command and "/etc/gpubox/api-key" in command


def test_the_warm_up_hands_curl_the_key_on_stdin_never_in_an_argument(tmp_path):
    key_file = tmp_path / "api key"
    key_file.write_text(KEY)
    key_file.chmod(0o600)
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.log"
    bin_dir.mkdir()
    sed = subprocess.run(["sh", "-c", "command -v sed"], capture_output=True, text=True)
    _logging_wrapper(bin_dir, "sed", sed.stdout.strip(), log)
    _logging_wrapper(bin_dir, "curl", None, log)
    command = vllm_stage.warm_up_command(8000, "a", str(key_file))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", command], env=env, check=True, timeout=30)
    argv = log.read_text()
    assert KEY not in command and KEY not in argv
    assert "--config" in argv and "sed" in argv  # both ran, through the wrappers
    assert KEY not in Path(f"{log}.parents").read_bytes().decode()  # the shell's own argv
    assert curl_config_header(Path(f"{log}.stdin").read_text()) == f"Authorization: Bearer {KEY}"
