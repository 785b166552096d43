"""gpubox.knowledge.openai_shape: the answers of llama-server and vLLM to a request with a tool,
whole and
streamed, put together and judged the way the checks backend.tool-call-whole and
backend.tool-call-streamed (gpubox.checks.backend) do.

The llama.cpp answers are recorded from llama-server b11312 (--jinja --reasoning-format
deepseek) serving the sandbox's tiny model. The vLLM answers follow vLLM 0.19's OpenAI protocol
(Hermes tool parser, a reasoning parser): ``reasoning`` instead of ``reasoning_content``, the
text before ``<tool_call>`` left in ``content``, the name in the first tool-call delta, the
arguments in pieces, a usage event with no choices at the end of a stream."""

from __future__ import annotations

import contextlib
import json

import pytest

from gpubox.knowledge import openai_shape
from gpubox.knowledge.openai_shape import parse, tool_call_problems

LLAMA_WHOLE = (
    '{"choices":[{"finish_reason":"tool_calls","index":0,"message":{"role":"assistant",'
    '"content":"","reasoning_content":"checking the weather\\n","tool_calls":[{"type":'
    '"function","function":{"name":"get_weather","arguments":"{\\"city\\": \\"Paris\\"}"},'
    '"id":"riRiXVVMzZAhuYol8H7LMEGSRu2PdCEQ"}]}}],"created":1796105310,"model":"tiny",'
    '"system_fingerprint":"b11312-0c1e57098bba43ac29e6e3b677cdceebdd22334f","object":'
    '"chat.completion","usage":{"completion_tokens":10,"prompt_tokens":846,"total_tokens":856,'
    '"prompt_tokens_details":{"cached_tokens":845}},"id":"chatcmpl-eTbzj7pE5XtKBImlr4eCK5opaaITV5oR",'
    '"timings":{"cache_n":845,"prompt_n":1,"predicted_n":10}}'
)

_CHUNK = (
    '"created":1796105310,"id":"chatcmpl-TprhF","model":"tiny","object":"chat.completion.chunk"'
)
LLAMA_STREAM = "\n\n".join(
    [
        'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant",'
        '"content":null}}],' + _CHUNK + "}",
        'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":'
        '"checking the weather\\n"}}],' + _CHUNK + "}",
        'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,'
        '"id":"TUZxp3NW7b1BvX6QFuUQgLVhg7cWZec4","type":"function","function":{"name":'
        '"get_weather","arguments":"{"}}]}}],' + _CHUNK + "}",
        'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,'
        '"function":{"arguments":"\\"city\\": \\"Paris\\"}"}}]}}],' + _CHUNK + "}",
        'data: {"choices":[{"finish_reason":"tool_calls","index":0,"delta":{}}],' + _CHUNK + ","
        '"timings":{"cache_n":845,"prompt_n":1,"predicted_n":10}}',
        "data: [DONE]",
        "",
    ]
)

VLLM_WHOLE = json.dumps(
    {
        "id": "chatcmpl-9a1f0c6e2b7d4d55",
        "object": "chat.completion",
        "created": 1790000000,
        "model": "qwen3-next",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "\n\n",
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [
                        {
                            "id": "chatcmpl-tool-4c8e1a7f90b2",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": '{"city": "Paris"}',
                            },
                        }
                    ],
                    "reasoning": "The user wants the weather in Paris. I should call get_weather.",
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 201, "total_tokens": 262, "completion_tokens": 61},
        "prompt_logprobs": None,
    }
)


def _vllm_event(delta: dict | None, finish: str | None = None, both: bool = False) -> str:
    if delta and both and "reasoning" in delta:  # builds that send the old name beside the new
        delta = {**delta, "reasoning_content": delta["reasoning"]}
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    event = {"id": "chatcmpl-9a1f", "object": "chat.completion.chunk", "created": 1790000000}
    event |= {"model": "qwen3-next", "choices": choices}
    if delta is None:
        event["usage"] = {"prompt_tokens": 201, "total_tokens": 262, "completion_tokens": 61}
    return "data: " + json.dumps(event)


def vllm_stream(both: bool = False) -> str:
    call = {"id": "chatcmpl-tool-4c8e1a7f90b2", "type": "function", "index": 0}
    deltas = [
        {"role": "assistant", "content": ""},
        {"reasoning": "The user wants the weather"},
        {"reasoning": " in Paris. I should call get_weather."},
        {"content": "\n\n"},
        {"tool_calls": [{**call, "function": {"name": "get_weather"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]},
    ]
    lines = [_vllm_event(d, both=both) for d in deltas]
    lines += [_vllm_event({"content": ""}, "tool_calls"), _vllm_event(None), "data: [DONE]"]
    return "\n\n".join(lines) + "\n\n"


OFFERED = {"get_weather"}


@pytest.mark.parametrize(
    ("body", "stream", "reasoning"),
    [
        (LLAMA_WHOLE, False, "checking the weather\n"),
        (LLAMA_STREAM, True, "checking the weather\n"),
        (VLLM_WHOLE, False, "The user wants the weather in Paris. I should call get_weather."),
        (vllm_stream(), True, "The user wants the weather in Paris. I should call get_weather."),
        (
            vllm_stream(both=True),
            True,
            "The user wants the weather in Paris. I should call get_weather.",
        ),
    ],
    ids=["llama-whole", "llama-streamed", "vllm-whole", "vllm-streamed", "vllm-both-names"],
)
def test_both_backends_answers_are_one_parsed_tool_call(body: str, stream: bool, reasoning: str):
    answer = parse(body, stream)
    assert tool_call_problems(answer, OFFERED, expect_reasoning=True) == []
    assert answer.reasoning == reasoning  # from either field, never twice
    assert [(c.name, json.loads(c.arguments)) for c in answer.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert answer.tool_calls[0].id and answer.tool_calls[0].type == "function"
    assert answer.finish_reason == "tool_calls"
    assert answer.content.strip() == ""
    assert answer.streamed is stream and answer.done


def test_streamed_arguments_only_parse_once_joined():
    events, done, bad = openai_shape.stream_events(vllm_stream())
    assert done and not bad
    pieces = [
        part["function"]["arguments"]
        for event in events
        for choice in event["choices"]
        for part in choice["delta"].get("tool_calls", [])
        if "arguments" in part["function"]
    ]
    assert len(pieces) == 3
    for piece in pieces:  # no piece alone is the arguments object
        with contextlib.suppress(json.JSONDecodeError):
            assert not isinstance(json.loads(piece), dict)
    assert parse(vllm_stream(), True).tool_calls[0].arguments == '{"city": "Paris"}'


def test_a_server_without_a_tool_parser_leaves_the_call_and_the_thinking_in_content():
    # what llama-server without --jinja, or vLLM without its parsers, would return
    raw = (
        '<think>\nchecking the weather\n</think>\n\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris"}}\n</tool_call>'
    )
    body = {"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": raw}}]}
    problems = tool_call_problems(parse(json.dumps(body), False), OFFERED, expect_reasoning=True)
    assert problems == [
        f"no tool call (finish_reason 'stop', content {raw!r})",
        "finish_reason is 'stop', not 'tool_calls'",
        "no reasoning in reasoning_content (or reasoning)",
        "the content holds raw markup ['<think>', '</think>', '<tool_call>', '</tool_call>']: "
        f"{raw!r}",
    ]


def test_the_reply_of_a_model_that_does_not_call():
    body = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"content": "It is sunny.", "reasoning_content": "I will guess."},
            }
        ]
    }
    problems = tool_call_problems(parse(json.dumps(body), False), OFFERED, expect_reasoning=True)
    assert problems == [
        "no tool call (finish_reason 'stop', content 'It is sunny.')",
        "finish_reason is 'stop', not 'tool_calls'",
    ]


def _call(name: str = "get_weather", arguments: str = '{"city": "Paris"}', id: str = "c1") -> dict:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _whole(*calls: dict, reasoning: str = "", content: str = "") -> str:
    message = {"content": content, "reasoning_content": reasoning, "tool_calls": list(calls)}
    return json.dumps(
        {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": message}]}
    )


def test_a_call_an_agent_cannot_use_is_named():
    answer = parse(
        _whole(
            _call("get_time"),
            _call(arguments='{"city": "Par'),
            _call(arguments='["Paris"]', id=""),
            reasoning="thinking",
        ),
        False,
    )
    assert tool_call_problems(answer, OFFERED, expect_reasoning=True) == [
        "tool call 0 names 'get_time', not an offered tool ['get_weather']",
        "tool call 1's arguments are not JSON: '{\"city\": \"Par'",
        "tool call 2 has no id (the tool's result cannot refer to it)",
        "tool call 2's arguments are not a JSON object: '[\"Paris\"]'",
    ]


def test_reasoning_is_required_only_of_a_thinking_model():
    answer = parse(_whole(_call()), False)
    assert tool_call_problems(answer, OFFERED, expect_reasoning=False) == []
    assert tool_call_problems(answer, OFFERED, expect_reasoning=True) == [
        "no reasoning in reasoning_content (or reasoning)"
    ]


def test_reasoning_repeated_in_the_content_is_named():
    answer = parse(_whole(_call(), reasoning="look it up", content="look it up"), False)
    assert tool_call_problems(answer, OFFERED, expect_reasoning=True) == [
        "the reasoning is repeated in the content: 'look it up'"
    ]


def test_a_cut_stream_an_error_event_and_a_body_that_is_not_json():
    cut = LLAMA_STREAM.replace("data: [DONE]", "")
    assert tool_call_problems(parse(cut, True), OFFERED, expect_reasoning=True) == [
        "the stream did not end with data: [DONE]"
    ]
    error = 'data: {"error":{"code":500,"message":"boom"}}\n\ndata: [DONE]\n\n'
    problems = tool_call_problems(parse(error, True), OFFERED, expect_reasoning=False)
    assert problems[0] == 'error: {"code": 500, "message": "boom"}'
    assert "no tool call" in problems[1]
    garbled = "data: {not json\n\ndata: [DONE]\n"
    assert tool_call_problems(parse(garbled, True), OFFERED, False)[0] == (
        "not JSON: data: {not json"
    )
    assert parse("<html>502</html>", False).errors == ["the answer is not JSON: '<html>502</html>'"]
    assert parse('{"error": {"message": "no"}}', False).errors == [
        'error: {"message": "no"}',
        "no choices in the answer",
    ]


def test_the_request_offers_one_tool_with_automatic_choice():
    for stream in (False, True):
        request = openai_shape.tool_request("qwen3-next", stream)
        assert request["stream"] is stream and request["tool_choice"] == "auto"
        assert request["model"] == "qwen3-next" and request["max_tokens"] >= 1024
        assert openai_shape.offered_names(request) == {"get_weather"}
        assert request["messages"] == [{"role": "user", "content": openai_shape.QUESTION}]
        json.dumps(request)  # sent as JSON
    parameters = openai_shape.WEATHER_TOOL["function"]["parameters"]
    assert parameters["required"] == ["city"]  # the tiny model's arguments fit the schema


def test_describe_says_what_came_back():
    text = openai_shape.describe(parse(LLAMA_WHOLE, False))
    assert text == (
        "finish_reason='tool_calls' tool_calls=['get_weather({\"city\": \"Paris\"})'] "
        "reasoning='checking the weather\\n' content=''"
    )
