"""The sandbox's tiny GGUF model: byte-identical every time, loadable by llama.cpp (the keys and
vocabulary it needs), and weights that make its answer the same whatever the temperature: the
reply without tools, a think block and a get_weather call with them. Read back with the gguf
package's own reader and run by a numpy forward pass of the two layers (written here from
llama.cpp's llama graph, not from the generator), over prompts that Qwen3's template renders;
llama-server itself serves it in the sandbox integration tier."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader, TokenType
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gpubox.sandbox import tinymodel


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / tinymodel.FILE_NAME
    tinymodel.write(path)
    return path


@pytest.fixture(scope="module")
def reader(model: Path) -> GGUFReader:
    return GGUFReader(str(model))


def _field(reader: GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def _tensor(reader: GGUFReader, name: str) -> np.ndarray:
    return next(t for t in reader.tensors if t.name == name).data


def test_two_runs_are_byte_identical(model: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.gguf"
    tinymodel.write(again)
    assert again.read_bytes() == model.read_bytes()
    assert 100_000 < model.stat().st_size < 1_000_000  # about 0.5 MB


def test_ensure_writes_once_and_reports_the_facts(model: Path, tmp_path: Path) -> None:
    facts = tinymodel.ensure(tmp_path)
    path = tmp_path / tinymodel.FILE_NAME
    data = path.read_bytes()
    assert facts == {
        "path": str(path),
        "file": "gpubox-tiny.gguf",
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "reply": "Hello from the gpubox sandbox.",
    }
    assert data == model.read_bytes()
    before = path.stat().st_mtime_ns
    assert tinymodel.ensure(tmp_path) == facts
    assert path.stat().st_mtime_ns == before  # the same bytes are not written again
    assert sorted(p.name for p in tmp_path.iterdir()) == [tinymodel.FILE_NAME]


def test_the_keys_llama_cpp_needs(reader: GGUFReader) -> None:
    for key in tinymodel.REQUIRED_KEYS:
        assert key in reader.fields, key
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "llama.block_count") == 2
    assert _field(reader, "llama.embedding_length") == 64
    assert _field(reader, "llama.attention.head_count") == 4
    assert _field(reader, "llama.feed_forward_length") == 128
    assert _field(reader, "llama.context_length") > 0
    # llama.cpp refuses a llama model whose RoPE does not cover the whole head
    assert _field(reader, "llama.rope.dimension_count") == 64 // 4
    assert 0 < _field(reader, "llama.attention.layer_norm_rms_epsilon") < 1e-3
    assert _field(reader, "tokenizer.ggml.model") == "llama"  # SentencePiece-style


def test_the_chat_template_is_one_llama_cpp_parses_tool_calls_and_reasoning_from(
    reader: GGUFReader,
) -> None:
    # Qwen3's template: llama.cpp's template analysis finds ChatML turns, <think> reasoning and
    # Hermes-style <tool_call> JSON, and its parser returns tool_calls and reasoning_content
    template = _field(reader, "tokenizer.chat_template")
    for part in ("<|im_start|>", "add_generation_prompt", "<tools>", "</tools>"):
        assert part in template, part
    for part in ('<tool_call>\\n{"name": "', '"arguments": ', "<tool_response>", "<think>"):
        assert part in template, part
    tools = [_weather_tool()]
    assert "<tools>" in _render(template, [_user("hi")], tools)
    assert "<tools>" not in _render(template, [_user("hi")])
    history = _render(template, _after_the_call(), tools)
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in history
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in history


def test_the_vocabulary(reader: GGUFReader) -> None:
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    assert (
        len(tokens)
        == len(set(tokens))
        == len(types)
        == len(_field(reader, "tokenizer.ggml.scores"))
    )
    kinds = dict(zip(tokens, types, strict=True))
    # every byte, or llama.cpp's byte fallback throws on the first character it lacks
    for byte in range(256):
        assert kinds[f"<0x{byte:02X}>"] == TokenType.BYTE
    for control in ("<|im_start|>", "<|im_end|>"):
        assert kinds[control] == TokenType.CONTROL
    # the tool call's pieces and the markers: matched whole in any text, output as their text
    for piece in tinymodel.TOOL_PIECES + ("<tools>", "<tool_response>"):
        assert kinds[piece] == TokenType.USER_DEFINED, piece
    assert tokens[_field(reader, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert tokens[_field(reader, "tokenizer.ggml.bos_token_id")] == "<s>"
    assert _field(reader, "llama.vocab_size") == len(tokens)


def test_only_layer_0_attention_writes_to_the_residual_stream(reader: GGUFReader) -> None:
    assert not _tensor(reader, "blk.1.attn_output.weight").any()
    for layer in range(2):
        assert not _tensor(reader, f"blk.{layer}.ffn_down.weight").any()
    # and only into one dimension, the tools bit
    written = np.flatnonzero(_tensor(reader, "blk.0.attn_output.weight").any(axis=1))
    assert written.tolist() == [tinymodel.FLAG_DIM]


# --- A numpy forward pass of the file, as llama.cpp's llama graph computes it ---------------


class Forward:
    """Greedy generation with the file's weights: RMS norm, attention with normal-mode RoPE
    (adjacent pairs rotated by pos * base^(-2i/head_dim)), causal softmax scaled by
    1/sqrt(head_dim) over a KV cache, SwiGLU FFN, output norm and projection. Float64."""

    def __init__(self, reader: GGUFReader) -> None:
        self.tokens = list(_field(reader, "tokenizer.ggml.tokens"))
        self.eps = float(_field(reader, "llama.attention.layer_norm_rms_epsilon"))
        self.base = float(_field(reader, "llama.rope.freq_base"))
        self.heads = int(_field(reader, "llama.attention.head_count"))
        self.layers = int(_field(reader, "llama.block_count"))
        self.w = {t.name: np.array(t.data, dtype=np.float64) for t in reader.tensors}

    def _norm(self, x: np.ndarray, weight: str) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.w[weight]

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x: (heads, positions, head_dim)."""
        half = x.shape[-1] // 2
        angle = positions[:, None] * self.base ** (-2.0 * np.arange(half) / x.shape[-1])
        cos, sin = np.cos(angle), np.sin(angle)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def _step(self, ids: list[int], cache: list[list[np.ndarray]]) -> np.ndarray:
        """Run ``ids`` after the cached positions; the logits of the last one."""
        start = cache[0][0].shape[1] if cache[0] else 0
        x = self.w["token_embd.weight"][ids]
        n, dim = x.shape
        hd = dim // self.heads
        positions = np.arange(start, start + n)
        for layer in range(self.layers):
            b = f"blk.{layer}"
            h = self._norm(x, f"{b}.attn_norm.weight")
            q, k, v = (
                (h @ self.w[f"{b}.attn_{name}.weight"].T).reshape(n, self.heads, hd).swapaxes(0, 1)
                for name in "qkv"
            )
            q, k = self._rope(q, positions), self._rope(k, positions)
            if cache[layer]:
                k = np.concatenate([cache[layer][0], k], axis=1)
                v = np.concatenate([cache[layer][1], v], axis=1)
            cache[layer] = [k, v]
            scores = q @ k.swapaxes(1, 2) / np.sqrt(hd)  # (heads, new, all)
            scores[:, positions[:, None] < np.arange(k.shape[1])[None, :]] = -np.inf
            scores -= scores.max(axis=-1, keepdims=True)
            weights = np.exp(scores)
            weights /= weights.sum(axis=-1, keepdims=True)
            attn = (weights @ v).swapaxes(0, 1).reshape(n, dim)
            x = x + attn @ self.w[f"{b}.attn_output.weight"].T
            h = self._norm(x, f"{b}.ffn_norm.weight")
            gate = h @ self.w[f"{b}.ffn_gate.weight"].T
            up = h @ self.w[f"{b}.ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ self.w[f"{b}.ffn_down.weight"].T
        return self.w["output.weight"] @ self._norm(x[-1], "output_norm.weight")

    def generate(self, ids: list[int], limit: int = 16) -> tuple[str, float]:
        """The answer's text (up to <|im_end|>) and the smallest logit margin on the way."""
        cache: list[list[np.ndarray]] = [[] for _ in range(self.layers)]
        pieces, margin, new = [], np.inf, list(ids)
        for _ in range(limit):
            scores = self._step(new, cache)
            top, second = np.sort(scores)[-2:][::-1]
            margin = min(margin, top - second)
            token = int(np.argmax(scores))
            if self.tokens[token] == "<|im_end|>":
                return "".join(pieces).replace("\u2581", " "), margin
            pieces.append(self.tokens[token])
            new = [token]
        raise AssertionError(f"no end of turn: {pieces}")


def _tokenize(tokens: list[str], text: str) -> list[int]:
    """llama.cpp's SentencePiece tokenization for this vocabulary: control and user-defined
    tokens are matched first (longest first), then each character is a token of its own if
    the vocabulary has it, else its UTF-8 bytes (no two characters merge into a vocabulary
    token here: no vocabulary token is a pair of one-character tokens); a space is U+2581, and
    the text starts with one."""
    index = {t: i for i, t in enumerate(tokens)}
    whole = sorted(
        (t for t in tokens if t in tinymodel.CONTROL + tinymodel.TOOL_PIECES + tinymodel.MARKERS),
        key=len,
        reverse=True,
    )
    ids = [tinymodel.BOS_ID]
    rest, first = text, True
    while rest:
        hits = [(rest.find(t), t) for t in whole if t in rest]
        at, special = min(hits, key=lambda hit: (hit[0], -len(hit[1]))) if hits else (len(rest), "")
        plain = rest[:at].replace(" ", "\u2581")
        if plain and first:
            plain = "\u2581" + plain
        for char in plain:
            if char in index:
                ids.append(index[char])
            else:
                ids.extend(index[f"<0x{b:02X}>"] for b in char.encode())
        first = False
        if special:
            ids.append(index[special])
        rest = rest[at + len(special) :]
    return ids


def _render(template: str, messages: list[dict], tools: list | None = None, **extra: Any) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    return env.from_string(template).render(
        messages=messages, tools=tools, add_generation_prompt=True, **extra
    )


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _weather_tool() -> dict:
    return {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }


def _after_the_call() -> list[dict]:
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    return [
        _user("What is the weather in Paris?"),
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "checking the weather",
            "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]


@pytest.fixture(scope="module")
def forward(reader: GGUFReader) -> Forward:
    return Forward(reader)


def _answer(forward: Forward, reader: GGUFReader, messages, tools=None, **extra) -> str:
    prompt = _render(_field(reader, "tokenizer.chat_template"), messages, tools, **extra)
    text, margin = forward.generate(_tokenize(forward.tokens, prompt))
    # at temperature 2, any other token is less likely than e^-45 at every step
    assert margin / 2 > 45, (text, margin)
    return text


TOOL_CALL = (
    '<think>\nchecking the weather\n</think>\n\n<tool_call>\n{"name": "get_weather", '
    '"arguments": {"city": "Paris"}}\n</tool_call>'
)


def test_without_tools_the_answer_is_the_reply(forward: Forward, reader: GGUFReader) -> None:
    assert tinymodel.REPLY_TEXT == "Hello from the gpubox sandbox."
    assert _answer(forward, reader, [_user("Say hello.")]) == tinymodel.REPLY_TEXT
    system = {"role": "system", "content": "You are terse."}
    assert _answer(forward, reader, [system, _user("Hi")]) == tinymodel.REPLY_TEXT
    # thinking switched off: the prompt ends "<think>\n\n</think>\n\n"
    no_think = _answer(forward, reader, [_user("Hi")], enable_thinking=False)
    assert no_think == tinymodel.REPLY_TEXT


def test_with_tools_the_answer_is_a_think_block_and_a_tool_call(
    forward: Forward, reader: GGUFReader
) -> None:
    assert tinymodel.TOOL_CALL_TEXT == TOOL_CALL
    tools = [_weather_tool()]
    question = [_user("What is the weather in Paris?")]
    assert _answer(forward, reader, question, tools) == TOOL_CALL
    # thinking switched off: the call without the think block
    no_think = _answer(forward, reader, question, tools, enable_thinking=False)
    assert no_think == TOOL_CALL[TOOL_CALL.index("<tool_call>") :]
    # the bit does not fade over the context: the marker 3,500 tokens before the answer
    long = [_user("Paris? " + "x" * 3500)]
    assert _answer(forward, reader, long, tools) == TOOL_CALL


def test_after_the_tool_answers_the_reply_ends_the_turn(
    forward: Forward, reader: GGUFReader
) -> None:
    assert _answer(forward, reader, _after_the_call(), [_weather_tool()]) == tinymodel.REPLY_TEXT


def test_the_tests_tokenizer_matches_the_markers_whole(forward: Forward) -> None:
    # a tokenizer that split "<tools>" into bytes would hide the tools bit from the tests above
    ids = _tokenize(forward.tokens, "a <tools>\n\n.")
    pieces = [forward.tokens[i] for i in ids]
    space = ["<0xE2>", "<0x96>", "<0x81>"]  # U+2581 in UTF-8
    assert pieces == ["<s>", *space, "<0x61>", *space, "<tools>", "\n\n", "."]
