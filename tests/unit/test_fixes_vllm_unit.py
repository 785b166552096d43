"""The vLLM unit's ExecStart= is docker's argv quoted by systemd's own rules, no `sh -c` layer:
parsed back the way systemd parses it, every argument comes out as it went in, whatever
quotes, spaces, `%` or `$` it holds. The warm-up, run for real with a fake curl, sends every
prompt length and never puts the key on a command line."""

from __future__ import annotations

import re

import pytest

from gpubox.config import load_host_config
from gpubox.plans import vllm as plan_vllm
from gpubox.stages import vllm as vllm_stage

REFERENCE = {"gpu_model": "Tesla V100-SXM2-32GB", "gpu_count": 2, "backend": "vllm"}
NASTY = 'it\'s "the" 100% ${HOME} $USER %d back\\slash ; tab\there'

_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", '"': '"', "'": "'", "s": " ",
}  # fmt: skip
_SPECIFIERS = {"d": "/run/credentials/gpubox-vllm.service", "t": "/run"}


def _unescape(text: str, i: int) -> tuple[str, int]:
    """systemd's cunescape_one: the escape at text[i] (just after the backslash)."""
    c = text[i]
    if c in _ESCAPES:
        return _ESCAPES[c], i + 1
    if c == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[i + 1 : i + 3]):
        return chr(int(text[i + 1 : i + 3], 16)), i + 3
    if re.fullmatch(r"[0-7]{3}", text[i : i + 3]):
        return chr(int(text[i : i + 3], 8)), i + 3
    raise ValueError(f"systemd refuses the escape \\{c}")


def systemd_words(line: str) -> list[str]:
    """A command line as systemd's config_parse_exec reads it: words split at unquoted
    whitespace, "" and '' quoting anywhere in a word, C escapes everywhere (EXTRACT_UNQUOTE |
    EXTRACT_CUNESCAPE), a lone unquoted `;` separating commands (refused here); then each
    word's %-specifiers; then, at exec time, $-variables ($$ is a literal $)."""
    words, i = [], 0
    while True:
        while i < len(line) and line[i] in " \t":
            i += 1
        if i == len(line):
            return [_resolve(w) for w in words]
        if line[i] == ";" and (i + 1 == len(line) or line[i + 1] in " \t"):
            raise ValueError("a second command in ExecStart=")
        word, quote = "", None
        while i < len(line) and (quote or line[i] not in " \t"):
            c = line[i]
            if c == "\\":
                if i + 1 == len(line):
                    raise ValueError("a trailing backslash")
                piece, i = _unescape(line, i + 1)
                word += piece
            elif quote and c == quote:
                quote, i = None, i + 1
            elif not quote and c in "\"'":
                quote, i = c, i + 1
            else:
                word, i = word + c, i + 1
        if quote:
            raise ValueError("an unbalanced quote")
        words.append(word)


def _resolve(word: str) -> str:
    def specifier(m: re.Match[str]) -> str:
        if m.group(1) == "%":
            return "%"
        if m.group(1) in _SPECIFIERS:
            return _SPECIFIERS[m.group(1)]
        raise ValueError(f"an unexpected specifier %{m.group(1)}")

    def variable(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        raise ValueError(f"an environment variable systemd would expand: {m.group(0)}")

    word = re.sub(r"%(.)", specifier, word)
    return re.sub(r"\$\$|\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*", variable, word)


def exec_start(unit: str) -> list[str]:
    (line,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    return systemd_words(line.removeprefix("ExecStart="))


def test_the_parser_follows_systemd():
    assert systemd_words(r'a "b c" d\"e "%%" "$$x" x"y z"w') == [
        "a",
        "b c",
        'd"e',
        "%",
        "$x",
        "xy zw",
    ]
    for refused in ("a ; b", "%n", "$HOME", '"open', "${X}"):
        with pytest.raises(ValueError):
            systemd_words(refused)


@pytest.mark.parametrize(
    "arg",
    [NASTY, "'", '"', " ", "%", "$", "%%", "$$", ";", "\\;", "", "a\nExecStartPre=/bin/x", "ü"],
)
def test_each_argument_comes_back_as_it_went_in(arg):
    assert systemd_words("/x " + plan_vllm.systemd_quote(arg)) == ["/x", arg]


def test_the_unit_runs_docker_without_a_shell_and_keeps_every_argument():
    config = load_host_config(
        "b", {**REFERENCE, "model_alias": NASTY, "model_dir": "/srv/my models/100%"}
    )
    unit = vllm_stage.unit_text(config)
    argv = exec_start(unit)
    image = config.catalog["vllm"]["image"]
    assert argv[:2] == ["/usr/bin/docker", "run"]  # not /bin/sh -c '...'
    assert argv[argv.index(image) + 1 :] == plan_vllm.vllm_args(config)
    assert argv[argv.index("--served-model-name") + 1] == NASTY
    assert "/srv/my models/100%:/models" in argv
    assert argv[argv.index("--env-file") + 1] == "/run/gpubox-vllm/env"
    # The alias shows in the header comment too: one line, whatever it holds.
    newline = load_host_config("b", {**REFERENCE, "model_alias": "a\nExecStartPre=/bin/x"})
    assert "\nExecStartPre=/bin/x" not in vllm_stage.unit_text(newline)


def test_the_key_reaches_docker_from_the_credential_never_an_argument():
    unit = vllm_stage.unit_text(load_host_config("b", REFERENCE))
    assert "LoadCredential=api-key:/etc/gpubox/api-key" in unit
    assert "RuntimeDirectory=gpubox-vllm\nRuntimeDirectoryMode=0700" in unit
    (writer,) = [x for x in unit.splitlines() if "VLLM_API_KEY=" in x]
    argv = systemd_words(writer.removeprefix("ExecStartPre="))
    assert argv == [
        "/bin/sh",
        "-c",
        'umask 077 && sed -n "1s/^/VLLM_API_KEY=/p" '
        "/run/credentials/gpubox-vllm.service/api-key > /run/gpubox-vllm/env",
    ]  # sed reads the key from the file: no $(cat ...) that would put it in an argument


# --- The warm-up, run for real with a fake curl ---------------------------------------------

WARM_KEY = 'k3y-"quoted"-back\\slash-$HOME-0123456789abcdef'


def _fake_curl(bin_dir, log, fail_words: int | None = None) -> None:
    """curl on PATH: logs its argv, its parent shell's argv, its standard input (the config)
    and the body it was handed (--data-binary @FILE); fails for a prompt of ``fail_words``."""
    fail = (
        f'if [ "$(grep -o hello "$body" | wc -l)" -eq {fail_words} ]; then exit 22; fi\n'
        if fail_words
        else ""
    )
    # Each record is appended with one write (printf of a whole line): the parallel requests'
    # records never interleave.
    path = bin_dir / "curl"
    path.write_text(
        "#!/bin/sh\n"
        f'printf \'%s\\n\' "$0" "$@" >> {log}\n'
        f"p=$(tr '\\0' ' ' < /proc/$PPID/cmdline); printf '%s\\n' \"$p\" >> {log}.parents\n"
        f"s=$(cat); printf '%s\\n' \"$s\" >> {log}.stdin\n"
        'body=; prev=; for a; do [ "$prev" = --data-binary ] && body=${a#@}; prev=$a; done\n'
        f'b=$(cat "$body"); printf \'%s\\n\' "$b" >> {log}.bodies\n'
        f"{fail}"
    )
    path.chmod(0o755)


def _run_warm_up(tmp_path, command: str):
    import os
    import subprocess

    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "TMPDIR": str(tmp_path / "tmp"),
    }
    return subprocess.run(
        ["sh", "-c", command], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def warm_box(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "tmp").mkdir()
    key_file = tmp_path / "api key"
    key_file.write_text(WARM_KEY + "\n")
    key_file.chmod(0o600)
    return tmp_path, tmp_path / "curl.log", str(key_file)


def test_the_warm_up_sends_every_length_and_keeps_the_key_off_every_command_line(warm_box):
    import json

    tmp_path, log, key_file = warm_box
    _fake_curl(tmp_path / "bin", log)
    config = load_host_config("b", {**REFERENCE, "model_ctx": 65536, "model_parallel": 3})
    lengths = vllm_stage.warm_up_lengths(config.model_ctx)
    assert lengths == [16, 512, 2048, 16384]
    command = vllm_stage.warm_up_command(8080, 'it\'s "q"', key_file, lengths, parallel=3)
    result = _run_warm_up(tmp_path, command)
    assert result.returncode == 0, result.stderr
    bodies = [json.loads(line) for line in log.with_suffix(".log.bodies").read_text().splitlines()]
    words = [len(b["messages"][0]["content"].split()) for b in bodies]
    # every length in order, then three short ones at once
    assert words == [16, 512, 2048, 16384, 16, 16, 16]
    for body in bodies:
        assert body["model"] == 'it\'s "q"' and body["max_tokens"] == 64 and body["ignore_eos"]
        assert set(body["messages"][0]["content"].split()) == {"hello"}
    argv = log.read_text()
    assert argv.count("--config\n-\n") == 7
    assert argv.count("http://127.0.0.1:8080/v1/chat/completions") == 7
    assert WARM_KEY not in argv and WARM_KEY not in command
    assert WARM_KEY not in log.with_suffix(".log.parents").read_text()
    # the key reached every curl on its standard input, as curl's config syntax quotes it
    escaped = WARM_KEY.replace("\\", "\\\\").replace('"', '\\"')
    headers = log.with_suffix(".log.stdin").read_text().splitlines()
    assert headers == [f'header = "Authorization: Bearer {escaped}"'] * 7
    assert list((tmp_path / "tmp").iterdir()) == []  # the body's temporary file is gone


def test_a_failed_warm_up_request_fails_the_step_and_says_which(warm_box):
    tmp_path, log, key_file = warm_box
    _fake_curl(tmp_path / "bin", log, fail_words=512)
    command = vllm_stage.warm_up_command(8080, "a", key_file, [16, 512, 2048], parallel=2)
    result = _run_warm_up(tmp_path, command)
    assert result.returncode != 0
    assert "the request of 512 words failed" in result.stderr
    assert len(log.with_suffix(".log.bodies").read_text().splitlines()) == 2  # stopped there
    assert list((tmp_path / "tmp").iterdir()) == []


def test_the_warm_up_lengths_fit_the_context():
    assert vllm_stage.warm_up_lengths(131072) == [16, 512, 2048, 16384]
    assert vllm_stage.warm_up_lengths(8192) == [16, 512, 2048, 4096]
    assert vllm_stage.warm_up_lengths(2048) == [16, 512, 1024]
    assert vllm_stage.warm_up_lengths(100) == [1]
