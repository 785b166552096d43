"""The sandbox's tiny GGUF model: byte-identical every time, loadable by llama.cpp (the keys and
vocabulary it needs), and weights that make its reply the same whatever the prompt or the
temperature. Read back with the gguf package's own reader; llama-server itself serves it in
the sandbox integration tier."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader, TokenType

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
        "reply": " Hello from the gpubox sandbox.",
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
    assert 0 < _field(reader, "llama.attention.layer_norm_rms_epsilon") < 1e-3
    assert _field(reader, "tokenizer.ggml.model") == "llama"  # SentencePiece-style
    template = _field(reader, "tokenizer.chat_template")
    assert "<|im_start|>" in template and "add_generation_prompt" in template  # ChatML


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
    assert tokens[_field(reader, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert tokens[_field(reader, "tokenizer.ggml.bos_token_id")] == "<s>"
    assert _field(reader, "llama.vocab_size") == len(tokens)


def test_the_reply_is_the_same_whatever_the_prompt_or_temperature(reader: GGUFReader) -> None:
    # attention and FFN add nothing to the residual stream: the last hidden state is the last
    # token's embedding
    for layer in range(2):
        assert not _tensor(reader, f"blk.{layer}.attn_output.weight").any()
        assert not _tensor(reader, f"blk.{layer}.ffn_down.weight").any()
    tokens = _field(reader, "tokenizer.ggml.tokens")
    embd = _tensor(reader, "token_embd.weight")
    output = _tensor(reader, "output.weight")
    norm = _tensor(reader, "output_norm.weight")
    eps = _field(reader, "llama.attention.layer_norm_rms_epsilon")

    def logits(token: int) -> np.ndarray:
        x = embd[token].astype(np.float64)
        return output @ (x / np.sqrt(np.mean(x * x) + eps) * norm)

    def reply(last_prompt_token: int) -> str:
        pieces, token = [], last_prompt_token
        for _ in range(16):
            scores = logits(token)
            ranked = np.sort(scores)
            # at temperature 2, every other token is less likely than e^-50
            assert (ranked[-1] - ranked[-2]) / 2 > 50
            token = int(np.argmax(scores))
            if tokens[token] == "<|im_end|>":
                return "".join(pieces).replace("\u2581", " ")
            pieces.append(tokens[token])
        raise AssertionError(f"no end of turn: {pieces}")

    # a ChatML prompt ends "<|im_start|>assistant\n": its last token is the byte 0x0A
    assert (
        reply(tokens.index("<0x0A>")) == tinymodel.REPLY_TEXT == " Hello from the gpubox sandbox."
    )
    for other in ("<0x41>", "<|im_start|>", "<s>", "<unk>"):
        assert reply(tokens.index(other)) == tinymodel.REPLY_TEXT
