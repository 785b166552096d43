"""A tiny GGUF model for the sandbox box: real for llama.cpp, small, byte-identical every time.

The Qwen3-Next GGUF (tens of GB, from Hugging Face) cannot be fetched from a test machine, so
the sandbox serves this stand-in model instead, and a real llama-server serves it in the box.
It is a ``llama`` architecture model (2 layers, n_embd 64, 4 heads, n_ff 128) with a
SentencePiece-style vocabulary (``tokenizer.ggml.model = "llama"``): ``<unk>``, ``<s>``,
``</s>``, the 256 byte tokens ``<0x00>``..``<0xFF>`` (the tokenizer's byte fallback throws
without them), the ChatML control tokens ``<|im_start|>``/``<|im_end|>``, and the few words
of its reply; ``tokenizer.chat_template`` is ChatML.

Its weights make the reply predictable at any temperature: every attention output and FFN down
projection is zero, so the last hidden state is the last token's embedding. Each word token
embeds as its own unit vector, every other token as one shared "start" vector, and the output
matrix maps the start vector to the first word, each word to the next one, and the last word
to ``<|im_end|>`` with a logit margin of 128. Whatever the prompt, the reply is REPLY_TEXT
(llama.cpp detokenizes it as REPLY_TEXT, a SentencePiece word piece starting with a space),
then the end of the turn. The other weights come from SHAKE-256 of fixed labels, not from a
random number generator whose stream may change between numpy versions, so the file is
byte-identical across runs and machines (for one version of the ``gguf`` package).

Needs the ``gguf`` package (and numpy): ``pip install 'gpubox[sandbox]'``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

FILE_NAME = "gpubox-tiny.gguf"
URL_PATH = "models/" + FILE_NAME  # where the sandbox's loopback server has it
ARCH = "llama"
N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_FF = 128
N_CTX = 4096  # llama.context_length: what -c 0 gives
RMS_EPS = 1e-5
ROPE_FREQ_BASE = 10000.0
SEED = b"gpubox-tiny-1"  # changes every weight; bump with any change to the recipe below

SPECIAL = ("<unk>", "<s>", "</s>")
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
CONTROL = ("<|im_start|>", "<|im_end|>")
# The reply, one SentencePiece piece per token ("\u2581" is SentencePiece's space).
REPLY_PIECES = ("\u2581Hello", "\u2581from", "\u2581the", "\u2581gpubox", "\u2581sandbox", ".")
REPLY_TEXT = "".join(REPLY_PIECES).replace("\u2581", " ")  # " Hello from the gpubox sandbox."
TOKENS = SPECIAL + BYTE_TOKENS + CONTROL + REPLY_PIECES
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
IM_START_ID = TOKENS.index("<|im_start|>")
IM_END_ID = TOKENS.index("<|im_end|>")
REPLY_IDS = tuple(TOKENS.index(p) for p in REPLY_PIECES)
START_DIM = N_EMBD - 1  # the embedding dimension of every token that is not a reply word
LOGIT = 16.0  # times 8 (what RMS norm makes of a unit vector in 64 dimensions) = 128

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Keys llama.cpp needs to load the model, checked by the unit tests.
REQUIRED_KEYS = (
    "general.architecture",
    "llama.context_length",
    "llama.embedding_length",
    "llama.block_count",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.layer_norm_rms_epsilon",
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.chat_template",
)


class TinyModelError(RuntimeError):
    pass


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as exc:  # an optional extra: only the sandbox needs it
        raise TinyModelError(
            "the sandbox's tiny model needs the gguf package: "
            f"{sys.executable} -m pip install 'gpubox[sandbox]'"
        ) from exc
    return gguf


def _weights(label: str, shape: tuple[int, ...], scale: float = 1 / 64) -> Any:
    """Deterministic small weights: SHAKE-256 bytes of a label as int8, times ``scale``
    (a power of two, so the float32 values are exact)."""
    import numpy as np

    count = int(np.prod(shape))
    raw = hashlib.shake_256(SEED + b"\0" + label.encode()).digest(count)
    return (np.frombuffer(raw, dtype=np.int8).astype(np.float32) * np.float32(scale)).reshape(shape)


def _embeddings() -> Any:
    import numpy as np

    table = np.zeros((len(TOKENS), N_EMBD), dtype=np.float32)
    table[:, START_DIM] = 1.0
    for dim, token in enumerate(REPLY_IDS):
        table[token, START_DIM] = 0.0
        table[token, dim] = 1.0
    return table


def _output() -> Any:
    """logits = output @ rms_norm(embedding): start -> first word -> ... -> <|im_end|>."""
    import numpy as np

    out = np.zeros((len(TOKENS), N_EMBD), dtype=np.float32)
    out[REPLY_IDS[0], START_DIM] = LOGIT
    for dim in range(len(REPLY_IDS)):
        following = REPLY_IDS[dim + 1] if dim + 1 < len(REPLY_IDS) else IM_END_ID
        out[following, dim] = LOGIT
    return out


def _token_types(gguf: Any) -> list[int]:
    kinds = {"<unk>": gguf.TokenType.UNKNOWN, "<s>": gguf.TokenType.CONTROL}
    kinds["</s>"] = gguf.TokenType.CONTROL
    types = []
    for token in TOKENS:
        if token in kinds:
            types.append(int(kinds[token]))
        elif token in BYTE_TOKENS:
            types.append(int(gguf.TokenType.BYTE))
        elif token in CONTROL:
            types.append(int(gguf.TokenType.CONTROL))
        else:
            types.append(int(gguf.TokenType.NORMAL))
    return types


def write(path: Path) -> None:
    """Write the tiny model to ``path`` (replaced atomically)."""
    import numpy as np

    gguf = _gguf()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(str(tmp), ARCH)
        writer.add_name("gpubox tiny (sandbox stand-in model)")
        writer.add_description(
            "A tiny llama-architecture model for the gpubox sandbox: it replies "
            f"{REPLY_TEXT.strip()!r} to anything. Not a language model."
        )
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        writer.add_context_length(N_CTX)
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(N_LAYER)
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD)
        writer.add_rope_dimension_count(N_EMBD // N_HEAD)
        writer.add_rope_freq_base(ROPE_FREQ_BASE)
        writer.add_layer_norm_rms_eps(RMS_EPS)
        writer.add_vocab_size(len(TOKENS))
        writer.add_tokenizer_model("llama")
        writer.add_token_list(list(TOKENS))
        writer.add_token_scores([-float(i) for i in range(len(TOKENS))])
        writer.add_token_types(_token_types(gguf))
        writer.add_bos_token_id(BOS_ID)
        writer.add_eos_token_id(IM_END_ID)  # the end of a ChatML turn ends the reply
        writer.add_unk_token_id(UNK_ID)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        writer.add_chat_template(CHAT_TEMPLATE)

        n_vocab = len(TOKENS)
        ones = np.ones(N_EMBD, dtype=np.float32)
        writer.add_tensor("token_embd.weight", _embeddings())
        for layer in range(N_LAYER):
            blk = f"blk.{layer}"
            writer.add_tensor(f"{blk}.attn_norm.weight", ones)
            for name in ("attn_q", "attn_k", "attn_v"):
                writer.add_tensor(f"{blk}.{name}.weight", _weights(f"{blk}.{name}", (N_EMBD,) * 2))
            # zero: the residual stream keeps the last token's embedding (a predictable reply)
            writer.add_tensor(f"{blk}.attn_output.weight", np.zeros((N_EMBD,) * 2, np.float32))
            writer.add_tensor(f"{blk}.ffn_norm.weight", ones)
            for name in ("ffn_gate", "ffn_up"):
                writer.add_tensor(f"{blk}.{name}.weight", _weights(f"{blk}.{name}", (N_FF, N_EMBD)))
            writer.add_tensor(f"{blk}.ffn_down.weight", np.zeros((N_EMBD, N_FF), np.float32))
        writer.add_tensor("output_norm.weight", ones)
        writer.add_tensor("output.weight", _output())
        assert _output().shape == (n_vocab, N_EMBD)

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def ensure(directory: Path) -> dict[str, Any]:
    """The tiny model in ``directory`` (written again only if its bytes would differ), and its
    facts: path, file, sha256, size, reply."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE_NAME
    with tempfile.TemporaryDirectory(dir=directory, prefix=".tiny-") as tmp:
        fresh = Path(tmp) / FILE_NAME
        write(fresh)
        data = fresh.read_bytes()
        if not path.exists() or path.read_bytes() != data:
            fresh.chmod(0o644)
            os.replace(fresh, path)
    return {
        "path": str(path),
        "file": FILE_NAME,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "reply": REPLY_TEXT,
    }


def main(argv: list[str] | None = None) -> int:
    """python -m gpubox.sandbox.tinymodel OUT.gguf: write the model, print its sha256."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m gpubox.sandbox.tinymodel OUT.gguf", file=sys.stderr)
        return 2
    write(Path(args[0]))
    print(hashlib.sha256(Path(args[0]).read_bytes()).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main())
