"""Whether a model's answer is text at all: the judge of the check backend.sane and of
``gpubox bench --smoke``.

A server can be up, stream tokens in the right shape, and still answer garbage. vLLM issue
#10656 reports the exllama ``gptq_gemm`` kernel (what a GPTQ checkpoint runs on when Marlin is
unavailable: Volta and Turing) answering ``!!!!!`` to prompts of 50 tokens or fewer, while
longer prompts come back fine; a broken kernel or a wrong dtype can also give an empty answer
or bytes that are not text. The check therefore sends two prompts, ``SHORT`` (under 50 tokens
with the chat template) and ``LONG`` (a few hundred tokens), and judges each answer:

- **empty**: neither ``content`` nor the reasoning (``reasoning_content`` for llama-server,
  ``reasoning`` for vLLM 0.19) holds anything but white space;
- **one character repeated**: at least 3 characters (white space aside), and one character is
  80 % of them or more (``!!!!!``, ``!!!!!!!!.!!!``);
- **not text**: more than 5 % of the characters (white space aside) are control characters
  other than tab and newline, surrogates, or U+FFFD (the replacement character a decoder writes
  for bytes that are not UTF-8).

A thinking model may spend a small budget entirely on reasoning and leave ``content`` empty, so
both parts are judged, each on its own when it is not empty: garbage in either fails. The
requests ask for ``MAX_TOKENS`` tokens, enough for either part to show what the model writes
(the judge needs no finished answer), and few enough that the deploy's quick checks stay quick
on a slow box (64 tokens at the 11.7 tok/s the project's first user measured on vLLM: about
5 s a prompt).
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from typing import Any

from gpubox.knowledge.openai_shape import Answer

MAX_TOKENS = 64
SHORT = "In one sentence, why is the sky blue?"
# A few hundred tokens of plain prose (about 170 words), then the question.
LONG = (
    "Read the following notes about a small computing cluster, then answer the question at "
    "the end.\n\n"
    "The cluster sits in a narrow room at the back of a university building. It has four "
    "machines, each with two graphics cards joined by a fast link and fans loud enough to make "
    "conversation difficult. They were bought second hand, with their disks wiped.\n\n"
    "The first installation scripts, written by hand, broke a machine during an update that "
    "replaced its graphics driver. So the group now describes each machine in a single file and "
    "lets a tool bring every machine to the same state, checking each step first.\n\n"
    "The tool installs the driver and holds its version, installs the container runtime, "
    "downloads a language model and starts a server that answers questions over the local "
    "network. Before it ends, it sends the server a few requests and reads the answers, "
    "because a server can be running and still answer nonsense.\n\n"
    "Question: in two sentences, what problem did the group have, and how did they solve it?"
)
PROMPTS = {"short": SHORT, "long": LONG}

REPEATED_SHARE = 0.8
NOT_TEXT_SHARE = 0.05
QUOTE = 60  # characters of an answer quoted in a finding


def request(model: str, prompt: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """A plain chat completion request (not streamed) for one prompt."""
    return {
        "model": model,
        "stream": False,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": prompt}],
    }


def _not_text(char: str) -> bool:
    if char in "\t\n\r":
        return False
    return char == "\ufffd" or unicodedata.category(char) in ("Cc", "Cs")


def text_problem(text: str) -> str | None:
    """What is wrong with one part of an answer (None: text). The empty string is judged by
    ``answer_problem``, which knows whether the other part holds something."""
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return "is empty"
    bad = sum(1 for c in chars if _not_text(c))
    if bad / len(chars) > NOT_TEXT_SHARE:
        return (
            f"is not text ({bad} of {len(chars)} characters are control or replacement characters)"
        )
    if len(chars) >= 3:
        char, count = Counter(chars).most_common(1)[0]
        if count / len(chars) >= REPEATED_SHARE:
            return f"is one character repeated ({char!r} {count} of {len(chars)} times)"
    return None


def quote(text: str) -> str:
    """The start of an answer, as Python writes a string (control characters escaped, and
    the replacement character as \\ufffd)."""
    shown = repr(text[:QUOTE]).replace("\ufffd", "\\ufffd")
    return shown + ("..." if len(text) > QUOTE else "")


def answer_problem(answer: Answer) -> str | None:
    """What makes ``answer`` garbage, quoting its start; None when it is text. An answer that
    carries an error or no choice is a problem too."""
    if answer.errors:
        return "; ".join(answer.errors)
    parts = [("content", answer.content), ("reasoning", answer.reasoning)]
    if not any(text.strip() for _, text in parts):
        return (
            f"is empty (no content, no reasoning; finish_reason {answer.finish_reason!r}): "
            f"content {quote(answer.content)}"
        )
    problems = [
        f"{name} {problem}: {quote(text.strip())}"
        for name, text in parts
        if text.strip() and (problem := text_problem(text))
    ]
    return "; ".join(problems) or None
