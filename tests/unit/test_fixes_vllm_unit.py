"""The vLLM unit's ExecStart= is docker's argv quoted by systemd's own rules, no `sh -c` layer:
parsed back the way systemd parses it, every argument comes out as it went in, whatever
quotes, spaces, `%` or `$` it holds."""

from __future__ import annotations

import re

import pytest

from gpubox.config import load_host_config
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
    assert systemd_words("/x " + vllm_stage.systemd_quote(arg)) == ["/x", arg]


def test_the_unit_runs_docker_without_a_shell_and_keeps_every_argument():
    config = load_host_config(
        "b", {**REFERENCE, "model_alias": NASTY, "model_dir": "/srv/my models/100%"}
    )
    unit = vllm_stage.unit_text(config)
    argv = exec_start(unit)
    image = config.catalog["vllm"]["image"]
    assert argv[:2] == ["/usr/bin/docker", "run"]  # not /bin/sh -c '...'
    assert argv[argv.index(image) + 1 :] == vllm_stage.vllm_args(config)
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
