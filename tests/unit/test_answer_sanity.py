"""gpubox.knowledge.answer_sanity: the judge of backend.sane and of `gpubox bench --smoke`, on
answers in
the two servers' shapes.

LLAMA_TINY is llama-server b11312's whole answer to the check's short prompt, recorded from the
sandbox's tiny model (the deploy's server, --jinja --reasoning-format deepseek). The vLLM answers
follow vLLM 0.19's OpenAI protocol (``reasoning``, not ``reasoning_content``): a thinking
model's answer cut off inside its reasoning (content null), a sane whole answer, and the
``!!!!!`` answer vLLM issue #10656 reports from the exllama gptq_gemm kernel on Volta and Turing
for prompts of 50 tokens or fewer."""

from __future__ import annotations

import json

import pytest

from gpubox.knowledge import answer_sanity
from gpubox.knowledge.answer_sanity import answer_problem, text_problem
from gpubox.knowledge.openai_shape import parse

LLAMA_TINY = (
    '{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"H'
    'ello from the gpubox sandbox."}}],"created":1796200294,"model":"qwen3-next","system_fing'
    'erprint":"b11312-0c1e570","object":"chat.completion","usage":{"completion_tokens":7,"pro'
    'mpt_tokens":80,"total_tokens":87,"prompt_tokens_details":{"cached_tokens":79}},"id":"cha'
    'tcmpl-j7Z7ArW2Um3cgBXM6R4kmxeS9yX8pe5V","timings":{"cache_n":79,"prompt_n":1,"prompt_ms"'
    ':322.865,"prompt_per_token_ms":322.865,"prompt_per_second":3.0972697567094607,"predicted'
    '_n":7,"predicted_ms":2439.975,"predicted_per_token_ms":406.66249999999997,"predicted_per'
    '_second":2.4590415885408663}}'
)


def vllm(content: str | None, reasoning: str | None, finish: str = "length") -> str:
    """vLLM 0.19's whole chat completion with this content and reasoning."""
    message = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [],
        "reasoning": reasoning,
    }
    return json.dumps(
        {
            "id": "chatcmpl-5e0b7c2d9a4f4f18",
            "object": "chat.completion",
            "created": 1790000000,
            "model": "qwen3-next",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            ],
            "usage": {"prompt_tokens": 24, "total_tokens": 88, "completion_tokens": 64},
            "prompt_logprobs": None,
        }
    )


THINKING_CUT = vllm(
    None,
    "Okay, the user asks why the sky is blue. The short answer is Rayleigh scattering: air "
    "molecules scatter shorter wavelengths of sunlight much more strongly than longer ones, so",
)
VLLM_SANE = vllm(
    "The sky looks blue because air molecules scatter blue sunlight more than red light.",
    "The user wants one sentence. Rayleigh scattering.",
    "stop",
)
VLLM_BANGS = vllm("!" * 64, None)  # vLLM #10656
VLLM_BANGS_IN_REASONING = vllm(None, "!" * 64)
VLLM_EMPTY = vllm("", None, "stop")


@pytest.mark.parametrize("body", [LLAMA_TINY, THINKING_CUT, VLLM_SANE])
def test_text_answers_pass(body: str):
    assert answer_problem(parse(body, stream=False)) is None


def test_a_thinking_model_cut_off_in_its_reasoning_is_judged_on_its_reasoning():
    answer = parse(THINKING_CUT, stream=False)
    assert answer.content == "" and answer.reasoning
    assert answer_problem(answer) is None
    garbage = parse(VLLM_BANGS_IN_REASONING, stream=False)
    assert answer_problem(garbage) == (
        "reasoning is one character repeated ('!' 64 of 64 times): '" + "!" * 60 + "'..."
    )


def test_the_exllama_bangs_fail_quoting_the_start():
    assert answer_problem(parse(VLLM_BANGS, stream=False)) == (
        "content is one character repeated ('!' 64 of 64 times): '" + "!" * 60 + "'..."
    )


def test_an_empty_answer_fails():
    assert answer_problem(parse(VLLM_EMPTY, stream=False)) == (
        "is empty (no content, no reasoning; finish_reason 'stop'): content ''"
    )


def test_a_body_that_is_not_an_answer_fails():
    assert answer_problem(parse("<html>502</html>", stream=False)) == (
        "the answer is not JSON: '<html>502</html>'"
    )
    assert answer_problem(parse('{"choices": []}', stream=False)) == "no choices in the answer"


def test_garbage_in_the_content_fails_even_with_sane_reasoning():
    body = vllm("\x00\x01\x02\x03 \ufffd\ufffd", "Rayleigh scattering.", "stop")
    assert answer_problem(parse(body, stream=False)) == (
        "content is not text (6 of 6 characters are control or replacement characters): "
        "'\\x00\\x01\\x02\\x03 \\ufffd\\ufffd'"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("!!!!!", "is one character repeated ('!' 5 of 5 times)"),
        ("!!!! !!!!.!!!!!!", "is one character repeated ('!' 14 of 15 times)"),
        ("...", "is one character repeated ('.' 3 of 3 times)"),
        ("   \n ", "is empty"),
        (
            "ab\x1b[0m\x07\x07\x07",
            "is not text (4 of 9 characters are control or replacement characters)",
        ),
    ],
)
def test_text_problems(text: str, problem: str):
    assert text_problem(text) == problem


@pytest.mark.parametrize(
    "text",
    [
        "Blue.",
        "Yes",
        "4",
        "Hello from the gpubox sandbox.",
        "| a | b |\n|---|---|\n| 1 | 2 |",  # a table's rule is not the whole answer
        "Caf\u00e9 \u2014 \u84dd\u8272\u7684\u5929\u7a7a \U0001f600",  # any script, emoji
        "one broken byte \ufffd in a long enough answer of ordinary words, which still reads",
        "tabs\tand\nnewlines\r\nare text",
    ],
)
def test_ordinary_text_passes(text: str):
    assert text_problem(text) is None


def test_the_prompts_are_short_and_long():
    # the short one stays under 50 tokens with the chat template (a word is a token or more,
    # the template adds about 15); the long one is a few hundred
    assert len(answer_sanity.SHORT.split()) <= 15
    assert 150 <= len(answer_sanity.LONG.split()) <= 400
    request = answer_sanity.request("qwen3-next", answer_sanity.SHORT)
    assert request["stream"] is False and request["max_tokens"] == answer_sanity.MAX_TOKENS
    assert request["messages"] == [{"role": "user", "content": answer_sanity.SHORT}]
