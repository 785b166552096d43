"""Agents, as a user runs them: a chat completion with a tool and tool_choice "auto" comes back
as an OpenAI tool call (tool_calls with JSON arguments, finish_reason "tool_calls"), with the
reasoning apart from the answer, streamed and not. The same check for llama.cpp and vLLM;
gpubox.openai_shape absorbs how their answers differ. In the sandbox the tiny model answers
with a think block and a get_weather call, so llama-server's template analysis and parsers
run for real."""

from __future__ import annotations

import json
import shlex

import pytest

from gpubox import openai_shape


@pytest.fixture
def api(box):
    if box.config.backend == "none":
        pytest.skip("backend is none in the inventory")
    return f"http://127.0.0.1:{box.config.api_port}"


def thinks(box) -> bool:
    """Whether the served model reasons before it answers (a thinking model in the catalog)."""
    model = box.config.catalog.get("models", {}).get(box.config.model, {})
    return bool(model.get("thinking_output_tokens"))


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_request_with_a_tool_gets_a_parsed_tool_call(box, api, stream):
    request = openai_shape.tool_request(box.config.model_alias, stream)
    # on the box itself, the key read from its file there (never on a command line here)
    result = box.run(
        "curl -sS --max-time 300 -o /tmp/gpubox-tools.out -w '%{http_code}' "
        f'-H "Authorization: Bearer $(cat {shlex.quote(box.config.api_key_file)})" '
        "-H 'Content-Type: application/json' "
        f"-d {shlex.quote(json.dumps(request))} {shlex.quote(api + '/v1/chat/completions')}; "
        "echo; cat /tmp/gpubox-tools.out; rm -f /tmp/gpubox-tools.out"
    )
    status, _, body = result.stdout.partition("\n")
    assert status == "200", f"{box.name}: a request with a tool answered {status}: {body[:300]}"
    answer = openai_shape.parse(body, stream)
    problems = openai_shape.tool_call_problems(
        answer, openai_shape.offered_names(request), expect_reasoning=thinks(box)
    )
    kind = "streamed" if stream else "whole"
    assert not problems, (
        f"{box.name}: the {kind} answer to a request with a tool is not a parsed tool call: "
        + "; ".join(problems)
        + f" ({openai_shape.describe(answer)})"
    )
