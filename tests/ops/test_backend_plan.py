"""The backend stage's plans: llama.cpp's build and server flags, vLLM's unit; the model
download; the compat rules for backends."""

from __future__ import annotations

import re

from conftest import REFERENCE, fresh_box

from gpubox.base import rendering
from gpubox.config import load_host_config, validate
from gpubox.plans import llamacpp as plan_llamacpp
from gpubox.plans import model as plan_model
from gpubox.stages import backend as backend_stage
from gpubox.stages import llamacpp as llamacpp_stage
from gpubox.stages import llamacpp_build, vllm_image
from gpubox.stages import model as model_stage
from gpubox.stages import vllm as vllm_stage


def problems(data):
    found = validate("b", {**REFERENCE, **data})[1]
    return {p.key: p.message for p in found if p.severity == "error"}


def test_llamacpp_is_built_for_sm_70_with_cuda_12_8():
    build = plan_llamacpp.llama_build(load_host_config("b", REFERENCE))
    flags = build.cmake_flags()
    assert flags[:2] == ["-G", "Ninja"]
    assert "-DGGML_CUDA=ON" in flags and "-DCMAKE_CUDA_ARCHITECTURES=70" in flags
    assert "-DCMAKE_CUDA_COMPILER=/usr/local/cuda-12.8/bin/nvcc" in flags
    # the catalog's build number and commit: what `llama-server --version` shows
    assert "-DLLAMA_BUILD_NUMBER=11312" in flags and "-DLLAMA_BUILD_COMMIT=0c1e570" in flags
    assert build.binary == "/opt/llama.cpp/b11312/bin/llama-server"
    assert build.bench == "/opt/llama.cpp/b11312/bin/llama-bench"
    cpu = plan_llamacpp.llama_build(load_host_config("b", {**REFERENCE, "llamacpp_cuda": False}))
    assert "-DGGML_CUDA=OFF" in cpu.cmake_flags() and cpu.info != build.info


def test_the_build_fetches_the_pinned_sdist_and_extracts_only_its_llama_cpp_tree():
    (command,) = llamacpp_build.build_commands(
        plan_llamacpp.llama_build(load_host_config("b", REFERENCE))
    )
    url = (
        "https://files.pythonhosted.org/packages/ec/e9/"
        "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
        "llama_cpp_python-0.3.36.tar.gz"
    )
    assert f'curl -fsSL --retry 3 -o "$t/src.tar.gz" {url};' in command
    assert (
        'if [ "$got" != 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e ]; '
        "then" in command
    )
    assert (
        'tar -xzf "$t/src.tar.gz" -C /opt/llama.cpp/b11312/src --strip-components=3 '
        "--exclude=.git llama_cpp_python-0.3.36/vendor/llama.cpp;" in command
    )
    # the source check before CMake, on CPU builds too; Ninja builds both targets
    assert command.index("ggml_cuda_graph_set_enabled") < command.index("cmake -S")
    assert "--target llama-server llama-bench >> /opt/llama.cpp/b11312/build.log" in command
    assert "test -x /opt/llama.cpp/b11312/build/bin/llama-bench;" in command


def test_a_github_tag_archive_by_override_strips_its_top_directory():
    data = {
        **REFERENCE,
        "catalog_overrides": {
            "llamacpp.url": "https://github.example/llama.cpp/archive/refs/tags/{tag}.tar.gz",
            "llamacpp.sha256": "ab" * 32,
            "llamacpp.tree": "",
        },
    }
    build = plan_llamacpp.llama_build(load_host_config("b", data))
    (command,) = llamacpp_build.build_commands(build)
    assert "https://github.example/llama.cpp/archive/refs/tags/b11312.tar.gz;" in command
    assert "--strip-components=1 --exclude=.git;" in command
    assert build.info != plan_llamacpp.llama_build(load_host_config("b", REFERENCE)).info


def test_llama_server_flags_follow_the_config():
    config = load_host_config("b", {**REFERENCE, "model_ctx": 65536, "model_parallel": 2})
    args = llamacpp_stage.llama_args(config, "/srv/models/m.gguf")
    text = " ".join(args)
    for expected in (
        "-m /srv/models/m.gguf",
        "--alias qwen3-next",
        "--host 127.0.0.1",
        "--port 8080",
        "-c 131072",  # two slots of 65536 each
        "-np 2",
        "-no-kvu",
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
    command = llamacpp_stage.flag_check_command("/x/llama-server", ["-m", "a", "--metrics", "-5"])
    assert "for f in --metrics -m;" in command and "does not know" in command


def unit_of(data) -> str:
    config = load_host_config("b", {**REFERENCE, **data})
    return rendering.render(
        "llama-server.service.j2",
        tag="b11312",
        commit="0c1e570",
        environment=llamacpp_stage.llama_environment(config),
        model_file="m",
        alias="a",
        binary="/b",
        args=" ".join(llamacpp_stage.llama_args(config, "/m")),
        api_key_file="/k",
        user="llama",
    )


def test_split_mode_layer_is_the_default_with_no_p2p():
    config = load_host_config("b", REFERENCE)
    args = llamacpp_stage.llama_args(config, "/m")
    assert args[args.index("-sm") + 1] == "layer" and "-ctk" not in args
    assert "GGML_CUDA_P2P" not in unit_of({})


def test_split_mode_row_splits_each_layer_with_no_p2p():
    args = llamacpp_stage.llama_args(
        load_host_config("b", {**REFERENCE, "llamacpp_split_mode": "row"}), "/m"
    )
    assert args[args.index("-sm") + 1] == "row" and "-ctk" not in args
    assert "GGML_CUDA_P2P" not in unit_of({"llamacpp_split_mode": "row"})


def test_split_mode_tensor_gets_f16_kv_flash_attention_and_peer_access():
    config = load_host_config("b", {**REFERENCE, "llamacpp_split_mode": "tensor"})
    text = " ".join(llamacpp_stage.llama_args(config, "/m"))
    for expected in ("-sm tensor", "-fa on", "-ctk f16 -ctv f16", "-c 262144", "-no-kvu"):
        assert expected in text, expected
    unit = unit_of({"llamacpp_split_mode": "tensor"})
    assert "\nEnvironment=GGML_CUDA_P2P=1\n" in unit
    # ...and the flag check asks the built binary whether its -sm offers tensor
    check = llamacpp_stage.flag_check_command("/b", ["-sm", "tensor"], "tensor")
    assert "grep -qw -- tensor" in check


def test_the_flag_check_runs_against_a_help_text(tmp_path):
    """The flag check, run for real against a stand-in llama-server that prints a --help."""
    import subprocess

    binary = tmp_path / "llama-server"
    binary.write_text(
        "#!/bin/sh\ncat <<'EOF'\n-c,    --ctx-size N\n-kvu,  --kv-unified, -no-kvu\n"
        "-sm,   --split-mode {none,layer,row}\n-fa,   --flash-attn [on|off|auto]\nEOF\n"
    )
    binary.chmod(0o755)

    def check(args, mode):
        command = llamacpp_stage.flag_check_command(str(binary), args, mode)
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True)

    assert check(["-c", "1", "-kvu", "-sm", "row"], "row").returncode == 0
    unknown = check(["-c", "1", "-kvu", "--nope"], "layer")
    assert unknown.returncode == 1 and "does not know: --nope" in unknown.stderr
    no_tensor = check(["-sm", "tensor"], "tensor")
    assert no_tensor.returncode == 1 and "offers no -sm tensor" in no_tensor.stderr


def test_the_unit_reads_the_key_as_a_credential_never_on_the_command_line():
    from gpubox.base.rendering import render

    unit = render(
        "llama-server.service.j2",
        tag="b1",
        commit="0c1e570",
        environment=[],
        model_file="m",
        alias="a",
        binary="/b",
        args="--api-key-file ${CREDENTIALS_DIRECTORY}/api-key",
        api_key_file="/etc/gpubox/api-key",
        user="llama",
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
    assert "ninja-build" in plan.installs()
    (build,) = plan.op("Build llama-server b11312")
    assert "-DCMAKE_CUDA_ARCHITECTURES=70" in build
    # a long step: the build runs in the background, Ninja's "[n/N]" read from its log
    assert "gpubox long step" in build and "/opt/llama.cpp/b11312/build.log" in build
    (command,) = llamacpp_build.build_commands(
        plan_llamacpp.llama_build(load_host_config("b", data))
    )
    assert command in build
    assert [n for n in plan.names if "Download and verify m.gguf" in n]  # waits for the unit
    assert [n for n in plan.names if "Start gpubox-model-download" in n]
    p = plan_model.plan(load_host_config("b", data))
    commands = "".join(model_stage.download_commands(p, "", ""))
    assert "curl -fsSL --retry 10 --retry-delay 5 -C - -o /srv/models/m.gguf.part" in commands
    assert plan.op("Generate the API key")
    assert [n for n in plan.names if "Wait for the API" in n]


def test_vllm_unit_flags_volumes_and_no_key_on_the_command_line():
    config = load_host_config(
        "b", {**REFERENCE, "backend": "vllm", "model_parallel": 8, "model_ctx": 32768}
    )
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
    (pull,) = plan.op("Pull vllm/vllm-openai:v0.19.1")
    # a long step, with progress: the wait for the pull's unit (gpubox.stages.vllm_image)
    assert vllm_image.wait_command("vllm/vllm-openai:v0.19.1") in pull
    (warm,) = plan.op("Warm-up request")
    # The key reaches curl on its standard input (--config -), never in an argument.
    assert "--config - " in warm and "/etc/gpubox/api-key" in warm
    assert "$(" not in warm and "`" not in warm and "Bearer $" not in warm
    assert [n for n in plan.names if "Stop and disable gpubox-llama-server" in n]


def test_model_download_from_hf_with_a_mirror():
    config = load_host_config("b", {**REFERENCE, "hf_endpoint": "https://hf-mirror.com"})
    p = plan_model.plan(config)
    commands = model_stage.download_commands(p, config.hf_endpoint, "")
    assert (
        "https://hf-mirror.com/unsloth/Qwen3-Next-80B-A3B-Thinking-GGUF/resolve/main/"
        "Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf" in commands[1]
    )
    assert "if [ -s /root/.cache/gpubox/hf-token ]; then printf 'Authorization" in commands[1]


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
    assert (
        "larger than the model's 262144"
        in problems({"model_ctx": 400128, "model_parallel": 1})["model_ctx"]
    )
    assert "must be one of 'llamacpp', 'vllm', 'none'" in problems({"backend": "tgi"})["backend"]
    assert problems({"model_quantization": "bf16", "gpu_model": "NVIDIA A100-SXM4-80GB"}) == {}
    assert "model_url" in problems({"model_source": "url"})


def test_too_little_disk_for_the_model_is_refused_before_anything(plan_of):
    import pytest

    from gpubox.base.errors import DeployRefused

    answers = fresh_box("ubuntu2404", **{"df -B1 --output=avail": str(10 * 2**30)})
    with pytest.raises(DeployRefused, match=r"has 10\.0 GiB free; .* needs 46\.0 GiB"):
        plan_of(model_stage.model, REFERENCE, answers)


LLAMA_PASSWD = "llama:x:998:998::/var/lib/llama:/usr/sbin/nologin"


def test_the_llama_user_is_made_once_and_then_read_with_one_getent(plan_of):
    """A fresh box gets the system user; a box where getent shows it as server.user leaves it
    (system uid, its home, no login shell) plans no user operation, so the no-op re-deploy
    skips pyinfra's Users fact (every account and its groups)."""

    def user_op(answers: dict[object, object]) -> bool:
        plan = plan_of(backend_stage.backend, REFERENCE, answers)
        return any(n.endswith("System user llama") for n in plan.names)

    assert user_op(fresh_box("ubuntu2404"))
    there = fresh_box("ubuntu2404", **{"getent passwd llama": [LLAMA_PASSWD, "home"]})
    assert not user_op(there)
    for other in (
        LLAMA_PASSWD.replace(":998:998:", ":1001:1001:"),  # a login user's uid
        LLAMA_PASSWD.replace("/usr/sbin/nologin", "/bin/bash"),  # a login shell
    ):
        box = fresh_box("ubuntu2404", **{"getent passwd llama": [other, "home"]})
        assert user_op(box)
    gone = fresh_box("ubuntu2404", **{"getent passwd llama": [LLAMA_PASSWD]})  # no home dir
    assert user_op(gone)
