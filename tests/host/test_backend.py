"""The OpenAI-compatible API: up, guarded by its key, serving the model, proven by a real
streamed chat completion."""

from __future__ import annotations

import json
import shlex

import pytest

UNITS = {"llamacpp": "gpubox-llama-server", "vllm": "gpubox-vllm"}


@pytest.fixture
def api(box):
    if box.config.backend == "none":
        pytest.skip("backend is none in the inventory")
    return f"http://127.0.0.1:{box.config.api_port}"


def curl(box, url: str, *args: str, key: bool = True) -> tuple[int, str]:
    """(HTTP status, body) of a request made on the box itself."""
    auth = (
        f'-H "Authorization: Bearer $(cat {shlex.quote(box.config.api_key_file)})" ' if key else ""
    )
    result = box.run(
        f"curl -sS --max-time 120 -o /tmp/gpubox-check.out -w '%{{http_code}}' {auth}"
        + " ".join(shlex.quote(a) for a in args)
        + f" {shlex.quote(url)}; echo; "
        "cat /tmp/gpubox-check.out; rm -f /tmp/gpubox-check.out"
    )
    status, _, body = result.stdout.partition("\n")
    return int(status or 0), body


@pytest.mark.quick
def test_the_service_is_active_and_enabled(box, api):
    box.assert_service_up(UNITS[box.config.backend])


@pytest.mark.quick
def test_health_is_200(box, api):
    status, body = curl(box, f"{api}/health", key=False)
    assert status == 200, f"{box.name}: /health answered {status}: {body[:200]}"


@pytest.mark.quick
def test_the_api_key_file_is_root_only(box, api):
    f = box.host.file(box.config.api_key_file)
    assert f.exists and f.user == "root" and f.mode == 0o600, (
        f"{box.name}: {box.config.api_key_file} exists={f.exists} "
        f"owner={f.user if f.exists else '-'} mode={oct(f.mode) if f.exists else '-'}"
    )
    assert_secret_not_in_ps(
        box.name,
        "the API key",
        box.out(f"cat {shlex.quote(box.config.api_key_file)}").strip(),
        box.out("ps -eww -o pid=,args="),
    )


def processes_showing(secret: str, ps_output: str) -> list[str]:
    """Each process of `ps -o pid=,args=` whose arguments hold ``secret``, as "PID (program)":
    all that a failure may print (the program's name redacted where it holds the secret)."""
    found = []
    for line in ps_output.splitlines():
        pid, _, args = line.strip().partition(" ")
        if secret in args:
            program = args.split(maxsplit=1)[0].rsplit("/", 1)[-1]
            found.append(f"{pid} ({'?' if secret in program else program})")
    return found


def assert_secret_not_in_ps(name: str, what: str, secret: str, ps_output: str) -> None:
    """Fails naming only the offending processes: never the secret, nor anyone's arguments
    (pytrace=False: no traceback, so no locals either)."""
    if not secret:
        pytest.fail(f"{name}: {what} is empty", pytrace=False)
    shown = processes_showing(secret, ps_output)
    if shown:
        pytest.fail(f"{name}: {what} shows in the arguments of {', '.join(shown)}", pytrace=False)


@pytest.mark.quick
def test_a_request_without_the_key_is_refused(box, api):
    status, _ = curl(box, f"{api}/v1/models", key=False)
    assert status == 401, f"{box.name}: /v1/models without the key answered {status}"


@pytest.mark.quick
def test_models_lists_the_alias(box, api):
    status, body = curl(box, f"{api}/v1/models")
    ids = [m.get("id") for m in json.loads(body).get("data", [])] if status == 200 else []
    assert box.config.model_alias in ids, f"{box.name}: /v1/models ({status}) lists {ids}"


@pytest.mark.quick
def test_a_streamed_chat_completion_returns_tokens(box, api):
    request = {
        "model": box.config.model_alias,
        "stream": True,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello."}],
    }
    status, body = curl(
        box,
        f"{api}/v1/chat/completions",
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps(request),
    )
    assert status == 200, f"{box.name}: chat completion answered {status}: {body[:300]}"
    pieces = []
    for line in body.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices", []):
                delta = choice.get("delta", {})
                pieces.append(delta.get("content") or delta.get("reasoning_content") or "")
    assert "data: [DONE]" in body and "".join(pieces), (
        f"{box.name}: the stream carried no tokens: {body[:300]}"
    )


@pytest.mark.quick
def test_every_slot_has_the_whole_context(box, api):
    """llama-server's /props: the context of one slot (with the unified KV cache, all of
    model_ctx) and the number of slots."""
    if box.config.backend != "llamacpp":
        pytest.skip("/props is llama.cpp's")
    status, body = curl(box, f"{api}/props")
    assert status == 200, f"{box.name}: /props answered {status}: {body[:200]}"
    props = json.loads(body)
    slot_ctx = props.get("default_generation_settings", {}).get("n_ctx")
    assert (slot_ctx, props.get("total_slots")) == (
        box.config.model_ctx,
        box.config.model_parallel,
    ), (
        f"{box.name}: each of llama-server's {props.get('total_slots')} slots holds {slot_ctx} "
        f"tokens; the config wants {box.config.model_parallel} slots of {box.config.model_ctx}"
    )


@pytest.mark.quick
def test_llama_server_is_the_catalogs_commit_with_llama_bench_beside_it(box, api):
    if box.config.backend != "llamacpp":
        pytest.skip("llama.cpp is not the backend")
    from gpubox.stages.llamacpp_build import llama_build

    b = llama_build(box.config)
    version = box.run(f"{shlex.quote(b.binary)} --version 2>&1").stdout
    assert b.is_version(version), (
        f"{box.name}: {b.binary} --version says {version.strip()!r}, not build "
        f"{b.build_number} at commit {b.short_commit} (the catalog's)"
    )
    assert box.host.file(b.bench).is_executable, f"{box.name}: no {b.bench}"


@pytest.mark.quick
def test_metrics_answer(box, api):
    if box.config.backend != "llamacpp":
        pytest.skip("/metrics is llama.cpp's")
    status, body = curl(box, f"{api}/metrics")
    assert status == 200 and "llamacpp:" in body, f"{box.name}: /metrics answered {status}"


@pytest.mark.gpu
def test_the_server_holds_memory_on_every_gpu(box, api):
    if box.config.backend == "llamacpp" and not box.config.llamacpp_cuda:
        pytest.skip("llama.cpp is built for the CPU (llamacpp_cuda false)")
    apps = box.out("nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader")
    gpus = box.out("nvidia-smi --query-gpu=uuid --format=csv,noheader").split()
    holding = {line.split(",")[0].strip() for line in apps.splitlines() if line.strip()}
    assert set(gpus) <= holding, f"{box.name}: no server memory on {sorted(set(gpus) - holding)}"


@pytest.mark.slow
def test_the_model_file_matches_its_checksum(box, api):
    model = box.config.catalog["models"][box.config.model]
    name = box.config.model_file or model["file"]
    want = box.config.model_sha256 or (model["sha256"] if name == model["file"] else None)
    if box.config.backend == "vllm" or not want:
        pytest.skip("no pinned checksum for this model file")
    got = box.out(f"sha256sum {shlex.quote(box.config.model_dir + '/' + name)}").split()[0]
    assert got == want, f"{box.name}: {name} has sha256 {got}, expected {want}"
