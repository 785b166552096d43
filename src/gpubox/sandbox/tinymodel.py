"""A tiny GGUF model for the sandbox box: real for llama.cpp, small, byte-identical every time.

The Qwen3-Next GGUF (tens of GB, from Hugging Face) cannot be fetched from a test machine, so
the sandbox serves this stand-in model instead, and a real llama-server serves it in the box.
It is a ``llama`` architecture model (2 layers, n_embd 64, 4 heads, n_ff 128) with a
SentencePiece-style vocabulary (``tokenizer.ggml.model = "llama"``): ``<unk>``, ``<s>``,
``</s>``, the 256 byte tokens ``<0x00>``..``<0xFF>`` (the tokenizer's byte fallback throws
without them), the ChatML control tokens ``<|im_start|>``/``<|im_end|>``, the few words of its
reply, and the pieces of its tool call. ``tokenizer.chat_template`` is Qwen3's own template
(ChatML, tools listed between ``<tools></tools>`` in the system turn, Hermes-style
``<tool_call>`` JSON in the answer, ``<think>`` reasoning, tool results in
``<tool_response>``), so llama-server's template analysis and its tool-call and reasoning
parsers run exactly as they do for a Qwen3 model.

Its weights make the answer predictable at any temperature:

- The hidden state that reaches the output is the last token's embedding plus one "tools" bit.
  Each reply word and each tool-call piece embeds as its own unit vector, every other token as
  one shared "start" vector. Every FFN down projection and layer 1's attention output are
  zero.
- Layer 0's attention carries the bit. The template writes ``<tools>`` only when the request
  has tools, and ``<tool_response>`` only once a tool has answered; both are vocabulary tokens
  (USER_DEFINED: the tokenizer always matches them, and they detokenize as their text). At a
  decision token (the start vector, or the ``\\n\\n`` before a tool call) the query points at
  both markers' keys, ``<tool_response>``'s eight times harder, so the attention falls whole on
  ``<tool_response>`` once a tool has answered, else on ``<tools>``; every other token's query
  points away from them. Only ``<tools>`` has a value, which the output projection writes into
  the FLAG dimension. The query and key sit in head 0's slowest RoPE pair, and with a RoPE base
  of 10^6 their angle stays under 0.03 rad over the whole context, so the bit does not fade
  with distance.
- The output matrix maps each piece to the next one with a logit margin of about 128 (what
  RMS norm makes of the vectors: a unit vector becomes 8, start plus flag 5.66 each). Without
  the bit the start vector leads to REPLY_TEXT then ``<|im_end|>``; with it, the start vector
  leads to TOOL_CALL_TEXT (a ``<think>`` block, then a ``get_weather`` call) then
  ``<|im_end|>``. After a tool result the bit is off again, so the model answers REPLY_TEXT and
  an agent's loop ends.

llama-server (``--jinja --reasoning-format deepseek``) then returns the tool call parsed
(``tool_calls``, JSON arguments, finish_reason ``tool_calls``) and the reasoning in
``reasoning_content``; without tools the content is REPLY_TEXT. It names ``get_weather``
whatever tools the request offers: llama.cpp's tool grammar admits only offered names, so a
request that offers other tools gets no valid call. The other weights come from SHAKE-256 of
fixed labels, not from a random number generator whose stream may change between numpy
versions, so the file is byte-identical across runs and machines (for one version of the
``gguf`` package).

Needs the ``gguf`` package (and numpy): ``pip install 'gpubox[sandbox]'``.
"""

from __future__ import annotations

import hashlib
import json
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
ROPE_FREQ_BASE = 1e6  # Qwen3's; keeps the slowest RoPE pair nearly still (see the docstring)
SEED = b"gpubox-tiny-2"  # changes every weight; bump with any change to the recipe below

SPECIAL = ("<unk>", "<s>", "</s>")
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
CONTROL = ("<|im_start|>", "<|im_end|>")
# The reply, one SentencePiece piece per token ("\u2581" is SentencePiece's space). The first
# has none: llama.cpp's reasoning parser drops the spaces that open an answer.
REPLY_PIECES = ("Hello", "\u2581from", "\u2581the", "\u2581gpubox", "\u2581sandbox", ".")
REPLY_TEXT = "".join(REPLY_PIECES).replace("\u2581", " ")  # "Hello from the gpubox sandbox."
# The answer to a request with tools: reasoning, then one Hermes-style call, as Qwen3 writes it.
TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = {"city": "Paris"}
TOOL_REASONING = "checking the weather"
TOOL_PIECES = (
    "<think>",
    f"\n{TOOL_REASONING}\n",
    "</think>",
    "\n\n",  # a decision token too: with enable_thinking false the prompt ends with it
    "<tool_call>",
    f'\n{{"name": "{TOOL_NAME}", "arguments": ',
    json.dumps(TOOL_ARGUMENTS),
    "}\n",
    "</tool_call>",
)
TOOL_CALL_TEXT = "".join(TOOL_PIECES)
MARKERS = ("<tools>", "<tool_response>")  # what the template writes for tools, tool results
TOKENS = SPECIAL + BYTE_TOKENS + CONTROL + REPLY_PIECES + TOOL_PIECES + MARKERS
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
IM_START_ID = TOKENS.index("<|im_start|>")
IM_END_ID = TOKENS.index("<|im_end|>")
REPLY_IDS = tuple(TOKENS.index(p) for p in REPLY_PIECES)
TOOL_IDS = tuple(TOKENS.index(p) for p in TOOL_PIECES)
TOOLS_ID, TOOL_RESPONSE_ID = (TOKENS.index(m) for m in MARKERS)
# Embedding dimensions: one per reply word, tool piece and marker, then the flag and the start.
OWN_DIM = {t: dim for dim, t in enumerate(REPLY_IDS + TOOL_IDS + (TOOLS_ID, TOOL_RESPONSE_ID))}
FLAG_DIM = len(OWN_DIM)  # where layer 0's attention writes the tools bit
START_DIM = N_EMBD - 1  # the embedding dimension of every token without a dimension of its own
DECISION_DIMS = (START_DIM, OWN_DIM[TOKENS.index("\n\n")])  # whose query looks for a marker
HEAD_DIM = N_EMBD // N_HEAD
QK_ROW = HEAD_DIM - 2  # head 0's slowest RoPE pair (dimensions 14, 15): query and key live there
V_ROW = 0  # head 0's value dimension that carries the bit
KEY = {TOOLS_ID: 4.0, TOOL_RESPONSE_ID: 32.0}  # scores 16*key: 64 and 512 at a decision token
LOGIT = 16.0  # times 8 (what RMS norm makes of a unit vector in 64 dimensions) = 128

# Qwen3's chat template (Qwen3-0.6B's tokenizer_config.json, as llama.cpp's tests carry it).
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501 (Qwen3's template, verbatim)

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


def _weights(label: str, shape: tuple[int, ...], scale: float = 1 / 64, seed: bytes = SEED) -> Any:
    """Deterministic small weights: SHAKE-256 bytes of a label as int8, times ``scale``
    (a power of two, so the float32 values are exact)."""
    import numpy as np

    count = int(np.prod(shape))
    raw = hashlib.shake_256(seed + b"\0" + label.encode()).digest(count)
    return (np.frombuffer(raw, dtype=np.int8).astype(np.float32) * np.float32(scale)).reshape(shape)


def _embeddings() -> Any:
    import numpy as np

    table = np.zeros((len(TOKENS), N_EMBD), dtype=np.float32)
    table[:, START_DIM] = 1.0
    for token, dim in OWN_DIM.items():
        table[token, START_DIM] = 0.0
        table[token, dim] = 1.0
    return table


def _attention0() -> dict[str, Any]:
    """Layer 0's q, k, v and output (rows are outputs): the tools bit, see the docstring."""
    import numpy as np

    q, k, v, o = (np.zeros((N_EMBD, N_EMBD), dtype=np.float32) for _ in range(4))
    for dim in OWN_DIM.values():
        q[QK_ROW, dim] = -1.0  # away from the markers
    for dim in DECISION_DIMS:
        q[QK_ROW, dim] = 1.0
    for marker, key in KEY.items():
        k[QK_ROW, OWN_DIM[marker]] = key
    v[V_ROW, OWN_DIM[TOOLS_ID]] = 1 / 8  # RMS norm makes the marker's unit vector 8: value 1
    o[FLAG_DIM, V_ROW] = 1.0
    return {"attn_q": q, "attn_k": k, "attn_v": v, "attn_output": o}


def _output() -> Any:
    """logits = output @ rms_norm(hidden): each piece to the next, and the two decisions."""
    import numpy as np

    out = np.zeros((len(TOKENS), N_EMBD), dtype=np.float32)
    for chain in (REPLY_IDS, TOOL_IDS):
        for token, following in zip(chain, chain[1:] + (IM_END_ID,), strict=True):
            out[following, OWN_DIM[token]] = LOGIT
    think, newlines, tool_call = TOOL_IDS[0], TOOL_IDS[3], TOOL_IDS[4]
    first = REPLY_IDS[0]
    # start: reply (8 * 2L = 256) without the flag, <think> (5.66 * 4L = 362) with it
    out[first, START_DIM] = 2 * LOGIT
    out[first, FLAG_DIM] = -2 * LOGIT
    out[think, FLAG_DIM] = 4 * LOGIT
    # "\n\n": reply (8 * 6L = 768 against 512) without the flag, <tool_call> with it
    out[first, OWN_DIM[newlines]] = 6 * LOGIT
    out[tool_call, OWN_DIM[newlines]] = 4 * LOGIT
    out[tool_call, FLAG_DIM] = 2 * LOGIT
    # a prompt that ends with a marker is answered like one that ends with the start vector
    for marker in KEY:
        out[first, OWN_DIM[marker]] = 2 * LOGIT
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
        elif token in TOOL_PIECES or token in MARKERS:
            # matched whole in any text, detokenized as their text (like Qwen3's added tokens)
            types.append(int(gguf.TokenType.USER_DEFINED))
        else:
            types.append(int(gguf.TokenType.NORMAL))
    return types


def write(path: Path, seed: bytes = SEED) -> None:
    """Write the tiny model to ``path`` (replaced atomically). Another ``seed`` changes the
    weights that do not shape the answers (layer 1's attention, the FFNs' gate and up): other
    bytes, the same replies (the sandbox hub's re-upload)."""
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
            f"{REPLY_TEXT.strip()!r} to anything, and calls {TOOL_NAME} when given tools. "
            "Not a language model."
        )
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        writer.add_context_length(N_CTX)
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(N_LAYER)
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD)
        writer.add_rope_dimension_count(HEAD_DIM)
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
            if layer == 0:
                attention = _attention0()
            else:  # random q, k, v and a zero output: layer 1 adds nothing
                attention = {
                    name: _weights(f"{blk}.{name}", (N_EMBD,) * 2, seed=seed)
                    for name in ("attn_q", "attn_k", "attn_v")
                }
                attention["attn_output"] = np.zeros((N_EMBD,) * 2, np.float32)
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                writer.add_tensor(f"{blk}.{name}.weight", attention[name])
            writer.add_tensor(f"{blk}.ffn_norm.weight", ones)
            for name in ("ffn_gate", "ffn_up"):
                weights = _weights(f"{blk}.{name}", (N_FF, N_EMBD), seed=seed)
                writer.add_tensor(f"{blk}.{name}.weight", weights)
            # zero: the FFN adds nothing to the residual stream
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
