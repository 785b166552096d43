"""The backend stage's plans: llama.cpp's build and server flags, vLLM's unit; the model
download; the compat rules for backends."""

from __future__ import annotations

import re

from conftest import REFERENCE, fresh_box

from gpubox.config import load_host_config, validate
from gpubox.stages import backend as backend_stage
from gpubox.stages import model as model_stage
from gpubox.stages import vllm as vllm_stage


def problems(data):
    found = validate("b", {**REFERENCE, **data})[1]
    return {p.key: p.message for p in found if p.severity == "error"}


def test_llamacpp_is_built_for_sm_70_with_cuda_12_8():
    build = backend_stage.llama_build(load_host_config("b", REFERENCE))
    flags = build.cmake_flags()
    assert "-DGGML_CUDA=ON" in flags and "-DCMAKE_CUDA_ARCHITECTURES=70" in flags
    assert "-DCMAKE_CUDA_COMPILER=/usr/local/cuda-12.8/bin/nvcc" in flags
    assert "-DLLAMA_BUILD_NUMBER=8054" in flags
    assert build.binary == "/opt/llama.cpp/b8054/bin/llama-server"
    cpu = backend_stage.llama_build(load_host_config("b", {**REFERENCE, "llamacpp_cuda": False}))
    assert "-DGGML_CUDA=OFF" in cpu.cmake_flags() and cpu.info != build.info


def test_llama_server_flags_follow_the_config():
    config = load_host_config("b", {**REFERENCE, "model_ctx": 65536, "model_parallel": 2})
    args = backend_stage.llama_args(config, "/srv/models/m.gguf")
    text = " ".join(args)
    for expected in (
        "-m /srv/models/m.gguf",
        "--alias qwen3-next",
        "--host 127.0.0.1",
        "--port 8080",
        "-c 65536",
        "-np 2",
        "-ngl 999",
        "-sm layer",
        "-ts 1,1",
        "-fa on",
        "--jinja",
        "--reasoning-format deepseek",
        "--temp 0.6",
        "--top-p 0.95",
        "--top-k 20",
        "--min-p 0.0",
        "--metrics",
        "--api-key-file ${CREDENTIALS_DIRECTORY}/api-key",
    ):
        assert expected in text, expected


def test_the_flag_check_names_unknown_flags():
    command = backend_stage.flag_check_command("/x/llama-server", ["-m", "a", "--metrics", "-5"])
    assert "for f in --metrics -m;" in command and "does not know" in command


def test_the_unit_reads_the_key_as_a_credential_never_on_the_command_line():
    from gpubox.stages import render

    unit = render(
        "llama-server.service.j2",
        tag="b1",
        model_file="m",
        alias="a",
        binary="/b",
        args="--api-key-file ${CREDENTIALS_DIRECTORY}/api-key",
        api_key_file="/etc/gpubox/api-key",
    )
    assert "LoadCredential=api-key:/etc/gpubox/api-key" in unit and "User=llama" in unit


def test_fresh_box_builds_generates_a_key_and_waits_for_health(plan_of):
    data = {
        **REFERENCE,
        "model_source": "url",
        "model_url": "https://models.example.org/m.gguf",
        "model_file": "m.gguf",
        "model_sha256": "ab" * 32,
    }
    plan = plan_of(backend_stage.backend, data, fresh_box("ubuntu2404"))
    (build,) = plan.op("Build llama-server b8054")
    assert "-DCMAKE_CUDA_ARCHITECTURES=70" in build
    (download,) = [c for n, c in plan.ops if "Download and verify m.gguf" in n]
    assert "curl -fL --retry 10 --retry-delay 5 -C - -o /srv/models/m.gguf.part" in download[1]
    assert plan.op("Generate the API key")
    assert [n for n in plan.names if "Wait for the API" in n]


def test_vllm_unit_flags_volumes_and_no_key_on_the_command_line():
    config = load_host_config("b", {**REFERENCE, "backend": "vllm", "model_parallel": 8})
    unit = vllm_stage.unit_text(config)
    for expected in (
        "--runtime nvidia --gpus all --ipc=host",
        "--pull never",
        "vllm/vllm-openai:v0.19.1",
        "--tensor-parallel-size 2",
        "--dtype half",
        "--attention-backend TRITON_ATTN",
        "--max-model-len 32768",
        "--max-num-seqs 8",
        "--gpu-memory-utilization 0.92",
        "--enable-auto-tool-choice --tool-call-parser hermes",
        "--reasoning-parser deepseek_r1",
        "--served-model-name qwen3-next",
        "-v /var/cache/gpubox/vllm/triton:/root/.triton",
        "-v /var/cache/gpubox/vllm/vllm:/root/.cache/vllm",
        "--env-file /run/gpubox-vllm/env ",
    ):
        assert expected in unit, expected
    assert "--enforce-eager" not in unit and not re.search(r"--api-key \S", unit)
    eager = vllm_stage.unit_text(
        load_host_config("b", {**REFERENCE, "backend": "vllm", "vllm_enforce_eager": True})
    )
    assert "--enforce-eager" in eager


def test_vllm_plan_warms_up_and_stops_llama_server(plan_of):
    answers = fresh_box(
        "ubuntu2404",
        **{"systemctl list-unit-files gpubox-llama-server": "gpubox-llama-server.service enabled"},
    )
    plan = plan_of(backend_stage.backend, {**REFERENCE, "backend": "vllm"}, answers)
    assert plan.op("Pull vllm/vllm-openai:v0.19.1") == ["docker pull vllm/vllm-openai:v0.19.1"]
    (warm,) = plan.op("Warm-up request")
    # The key reaches curl on its standard input (--config -), never in an argument.
    assert "--config - " in warm and "/etc/gpubox/api-key" in warm
    assert "$(" not in warm and "`" not in warm and "Bearer $" not in warm
    assert [n for n in plan.names if "Stop and disable gpubox-llama-server" in n]


def test_model_download_from_hf_with_a_mirror():
    config = load_host_config("b", {**REFERENCE, "hf_endpoint": "https://hf-mirror.com"})
    p = model_stage.plan(config)
    commands = model_stage.download_commands(p, config.hf_endpoint, "")
    assert "HF_ENDPOINT=https://hf-mirror.com" in commands[1]
    assert (
        "hf download unsloth/Qwen3-Next-80B-A3B-Thinking-GGUF "
        "Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf --local-dir /srv/models" in commands[1]
    )
    assert "HF_TOKEN=$( [ -s /root/.cache/gpubox/hf-token ]" in commands[1]


def test_backend_compat_rules():
    assert (
        "bf16 needs compute capability 8.0"
        in problems({"model_quantization": "bf16"})["model_quantization"]
    )
    assert (
        "use a GGUF quantisation" in problems({"model_quantization": "awq"})["model_quantization"]
    )
    assert (
        "fp8 needs compute capability 8.9"
        in problems({"backend": "vllm", "model_quantization": "fp8"})["model_quantization"]
    )
    msg = problems({"backend": "vllm", "catalog_overrides": {"vllm.version": "0.20.0"}})[
        "catalog_overrides"
    ]
    assert "vLLM 0.20.0 ships no kernels for compute capability 7.0" in msg
    assert (
        "tensor parallel 4 is larger than gpu_count 2"
        in problems({"backend": "vllm", "vllm_tensor_parallel": 4})["vllm_tensor_parallel"]
    )
    assert "larger than the model's 262144" in problems({"model_ctx": 400000})["model_ctx"]
    assert "must be one of 'llamacpp', 'vllm', 'none'" in problems({"backend": "tgi"})["backend"]
    assert problems({"model_quantization": "bf16", "gpu_model": "NVIDIA A100-SXM4-80GB"}) == {}
    assert "model_url" in problems({"model_source": "url"})


def test_too_little_disk_for_the_model_is_refused_before_anything(plan_of):
    import pytest

    from gpubox.stages import DeployRefused

    answers = fresh_box("ubuntu2404", **{"df -B1 --output=avail": str(10 * 2**30)})
    with pytest.raises(DeployRefused, match=r"has 10\.0 GiB free; .* needs 46\.0 GiB"):
        plan_of(model_stage.model, REFERENCE, answers)
