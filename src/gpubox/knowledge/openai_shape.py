"""The shape of an OpenAI chat completion that calls a tool, as llama-server and vLLM return it.

An agent needs three things from the server: the tool call parsed (``tool_calls``, each with
an ``id``, a function ``name`` and ``arguments``, a string holding a JSON object), the
reasoning kept apart from the answer, and ``finish_reason`` ``"tool_calls"``. The two backends
differ in small ways that this module absorbs:

- The reasoning field. llama-server (``--reasoning-format deepseek``) names it
  ``reasoning_content``. vLLM 0.19 names it ``reasoning`` (it renamed DeepSeek's
  ``reasoning_content`` to follow OpenAI's guidance; some builds send both, with the same
  text). Either one counts, never twice.
- Streaming. Both send Server-Sent Events (``data: {json}`` lines, then ``data: [DONE]``). The
  reasoning and the content arrive in pieces; a tool call arrives as deltas keyed by
  ``index``: the ``id`` and the function ``name`` first, then the ``arguments`` string in
  pieces that only parse as JSON once joined. vLLM may end with a usage event whose
  ``choices`` is empty.
- The content beside a call: llama-server leaves it empty or null; vLLM's Hermes parser
  returns what came before ``<tool_call>`` (often ``"\\n\\n"``).

``parse`` turns either answer, streamed or not, into one ``Answer``; ``tool_call_problems``
says what an agent would trip over. The checks backend.tool-call-whole and -streamed send
``tool_request`` to the box and fails with those problems.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
            "required": ["city"],
        },
    },
}
QUESTION = "What is the weather in Paris right now? Use the get_weather tool."
# Markup that belongs to the model's raw output, never to a parsed answer's content.
RAW_MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>")


def tool_request(model: str, stream: bool, max_tokens: int = 4096) -> dict[str, Any]:
    """A chat completion request that a model with tools should answer with a get_weather
    call. ``max_tokens`` leaves a thinking model room to think before it calls."""
    request: dict[str, Any] = {
        "model": model,
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
    }
    return request


def offered_names(request: dict[str, Any]) -> set[str]:
    return {tool["function"]["name"] for tool in request.get("tools", [])}


@dataclass
class ToolCall:
    id: str = ""
    type: str = ""
    name: str = ""
    arguments: str = ""  # the JSON text as the server sent it


@dataclass
class Answer:
    """One choice of a chat completion, streamed or not, put together."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    streamed: bool = False
    done: bool = False  # a stream ended with data: [DONE]; an unstreamed answer is done
    errors: list[str] = field(default_factory=list)


def _reasoning(part: dict[str, Any]) -> str:
    """llama.cpp's ``reasoning_content`` or vLLM's ``reasoning``: one of them, not both."""
    return part.get("reasoning_content") or part.get("reasoning") or ""


def from_response(body: dict[str, Any]) -> Answer:
    """A non-streamed chat completion (the JSON body) as an Answer."""
    answer = Answer(done=True)
    if "error" in body:
        answer.errors.append(f"error: {json.dumps(body['error'])[:300]}")
    choices = body.get("choices") or []
    if not choices:
        answer.errors.append("no choices in the answer")
        return answer
    choice = choices[0]
    message = choice.get("message") or {}
    answer.content = message.get("content") or ""
    answer.reasoning = _reasoning(message)
    answer.finish_reason = choice.get("finish_reason")
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        answer.tool_calls.append(
            ToolCall(
                id=call.get("id") or "",
                type=call.get("type") or "",
                name=function.get("name") or "",
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    return answer


def stream_events(text: str) -> tuple[list[dict[str, Any]], bool, list[str]]:
    """The JSON events of a Server-Sent Events body, whether it ended with [DONE], and the
    lines that were not JSON."""
    events: list[dict[str, Any]] = []
    bad: list[str] = []
    done = False
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue  # blank separators, comments, event names
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            bad.append(line[:200])
            continue
        if isinstance(event, dict):
            events.append(event)
        else:
            bad.append(line[:200])
    return events, done, bad


def from_stream(text: str) -> Answer:
    """A streamed chat completion (the raw SSE body) as an Answer: the deltas of choice 0
    joined, tool calls put together by index."""
    events, done, bad = stream_events(text)
    answer = Answer(streamed=True, done=done, errors=[f"not JSON: {line}" for line in bad])
    calls: dict[int, ToolCall] = {}
    content, reasoning = [], []
    for event in events:
        if "error" in event:
            answer.errors.append(f"error: {json.dumps(event['error'])[:300]}")
        for choice in event.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(_reasoning(delta))
            for position, part in enumerate(delta.get("tool_calls") or []):
                call = calls.setdefault(part.get("index", position), ToolCall())
                call.id = call.id or part.get("id") or ""
                call.type = call.type or part.get("type") or ""
                function = part.get("function") or {}
                name = function.get("name") or ""
                # the name comes whole in the first delta; a server that repeats it is not
                # asking for it twice
                if name and name != call.name:
                    call.name += name
                call.arguments += function.get("arguments") or ""
            if choice.get("finish_reason"):
                answer.finish_reason = choice["finish_reason"]
    answer.content = "".join(content)
    answer.reasoning = "".join(reasoning)
    answer.tool_calls = [calls[index] for index in sorted(calls)]
    return answer


def parse(body: str, stream: bool) -> Answer:
    """The body of a chat completion as an Answer; a body that is not JSON is an error."""
    if stream:
        return from_stream(body)
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return Answer(errors=[f"the answer is not JSON: {body[:200]!r}"])
    if not isinstance(data, dict):
        return Answer(errors=[f"the answer is not a JSON object: {body[:200]!r}"])
    return from_response(data)


def tool_call_problems(answer: Answer, offered: Iterable[str], expect_reasoning: bool) -> list[str]:
    """What an agent would trip over in ``answer`` to a request that offered the tools named
    ``offered``; empty when it is a well-formed tool call."""
    offered = set(offered)
    problems = list(answer.errors)
    if answer.streamed and not answer.done:
        problems.append("the stream did not end with data: [DONE]")
    if not answer.tool_calls:
        problems.append(
            f"no tool call (finish_reason {answer.finish_reason!r}, "
            f"content {answer.content[:200]!r})"
        )
    for number, call in enumerate(answer.tool_calls):
        where = f"tool call {number}"
        if not call.id:
            problems.append(f"{where} has no id (the tool's result cannot refer to it)")
        if call.name not in offered:
            problems.append(f"{where} names {call.name!r}, not an offered tool {sorted(offered)}")
        try:
            arguments = json.loads(call.arguments)
        except json.JSONDecodeError:
            problems.append(f"{where}'s arguments are not JSON: {call.arguments[:200]!r}")
        else:
            if not isinstance(arguments, dict):
                problems.append(f"{where}'s arguments are not a JSON object: {call.arguments!r}")
    if answer.finish_reason != "tool_calls":
        problems.append(f"finish_reason is {answer.finish_reason!r}, not 'tool_calls'")
    if expect_reasoning and not answer.reasoning.strip():
        problems.append("no reasoning in reasoning_content (or reasoning)")
    leaked = [markup for markup in RAW_MARKUP if markup in answer.content]
    if leaked:
        problems.append(f"the content holds raw markup {leaked}: {answer.content[:200]!r}")
    elif answer.reasoning.strip() and answer.reasoning.strip() in answer.content:
        problems.append(f"the reasoning is repeated in the content: {answer.content[:200]!r}")
    return problems


def describe(answer: Answer) -> str:
    """A short account of an answer for a failure message."""
    calls = [f"{c.name}({c.arguments[:80]})" for c in answer.tool_calls]
    return (
        f"finish_reason={answer.finish_reason!r} tool_calls={calls} "
        f"reasoning={answer.reasoning[:80]!r} content={answer.content[:80]!r}"
    )
