"""The API key stays out of every argument list: the vLLM warm-up hands it to curl on standard
input, and the host check that looks for it in ps names only the offending processes."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from gpubox.stages import vllm as vllm_stage

KEY = 'k3y-"quoted"-back\\slash-0123456789abcdef'
HOST_CHECKS = Path(__file__).parents[1] / "host" / "test_backend.py"


def _host_checks():
    spec = importlib.util.spec_from_file_location("gpubox_host_test_backend", HOST_CHECKS)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


PLANTED = "\n".join(
    [
        "    1 /sbin/init",
        f"  812 /usr/bin/curl -H Authorization: Bearer {KEY} http://127.0.0.1:8080/v1",
        "  900 /usr/bin/python3 -m http.server --secret-of-someone-else",
        f" 4711 sh -c VLLM_API_KEY={KEY} exec docker run",
        f" 4712 /opt/{KEY}/bin/tool --flag",
    ]
)


def test_the_ps_check_names_only_pids_and_programs():
    checks = _host_checks()
    assert checks.processes_showing(KEY, PLANTED) == ["812 (curl)", "4711 (sh)", "4712 (tool)"]
    assert checks.processes_showing(KEY, "    1 /sbin/init\n  2 sshd: root") == []


def test_the_ps_check_failure_shows_neither_the_key_nor_the_arguments():
    checks = _host_checks()
    with pytest.raises(pytest.fail.Exception) as failure:
        checks.assert_secret_not_in_ps("box1", "the API key", KEY, PLANTED)
    message = str(failure.value)
    assert (
        message == "box1: the API key shows in the arguments of 812 (curl), 4711 (sh), 4712 (tool)"
    )
    assert failure.value.pytrace is False  # no traceback, so no locals holding the key
    for secret_or_args in (KEY, "Bearer", "http.server", "--flag", "/opt/"):
        assert secret_or_args not in message
    checks.assert_secret_not_in_ps("box1", "the API key", KEY, "    1 /sbin/init")  # passes
    with pytest.raises(pytest.fail.Exception, match="box1: the API key is empty"):
        checks.assert_secret_not_in_ps("box1", "the API key", "", PLANTED)
