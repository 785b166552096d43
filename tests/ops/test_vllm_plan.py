"""The vLLM backend's plans: the image pulled once with progress, never by the unit; the cache
directories made every deploy they are missing; the forward-compatibility check of the image;
the warm-up at several lengths; a second deploy that plans no pull. The checkpoint is downloaded
by the model stage before vLLM starts (tests/ops/test_vllm_checkpoint_plan.py) and served from
model_dir with the Hub off."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from conftest import REFERENCE, fake_host, fresh_box, unit_state
from pyinfra.api import OperationError
from pyinfra.connectors.util import CommandOutput, OutputLine

from gpubox.config import load_host_config
from gpubox.knowledge import torch_archs
from gpubox.plans import vllm as plan_vllm
from gpubox.stages import backend as backend_stage
from gpubox.stages import vllm as vllm_stage
from gpubox.stages import vllm_image

VLLM = {**REFERENCE, "backend": "vllm"}
IMAGE = "vllm/vllm-openai:v0.19.1"
UNIT_PATH = "/etc/systemd/system/gpubox-vllm.service"
MISSING_DIRS = '[ -d "$d" ] || echo "$d"'
CHECKPOINT = "jart25--Qwen3-Next-80B-A3B-Thinking-Int4-GPTQ"
# The model stage's answer for a checkpoint whose marker matches the files on the box.
CHECKPOINT_COMPLETE = {
    ".gpubox-complete": ["marker=yes", "commit=" + "a" * 40, "files=3", "present=45097156608"]
}


def short(names) -> list[str]:
    """Operation names without their deploy's prefix ("Backend | ...")."""
    return [n.rsplit(" | ", 1)[-1] for n in names]


def first_deploy(**overrides: object) -> dict[object, object]:
    """A box with Docker but no image, no cache directory, no unit."""
    return fresh_box("ubuntu2404", **{MISSING_DIRS: plan_vllm.cache_dirs(), **overrides})


def converged(data: dict[str, object]) -> dict[object, object]:
    """A box where the image, the caches, the key and the unit are as the config wants."""
    unit = vllm_stage.unit_text(load_host_config("box", data))
    digest = hashlib.sha256(unit.encode()).hexdigest()
    return fresh_box(
        "ubuntu2404",
        **{
            "docker image inspect": "sha256:0123456789abcdef",
            **unit_state("gpubox-vllm"),
            "test -s /etc/gpubox/api-key": "yes",
            "sha256sum <": [f"{UNIT_PATH} 644 {digest}"],
            **CHECKPOINT_COMPLETE,
        },
    )


def test_the_first_deploy_pulls_once_with_progress_and_makes_the_caches(plan_of):
    plan = plan_of(backend_stage.backend, VLLM, first_deploy())
    (pull,) = plan.op(f"Pull {IMAGE}")
    # progress.long_step: the pull runs in the background, a line every 10 s from the probe
    assert "gpubox long step" in pull and "_gb_every=10" in pull
    # the wait for the pull's unit (started here: no earlier stage did), the host's bytes
    assert vllm_image.wait_command(IMAGE) in pull and f"pulling {IMAGE}" in pull
    start = f"Start gpubox-vllm-pull (pull {IMAGE} in the background)"
    assert plan.op(re.escape(start)) == ["systemctl start gpubox-vllm-pull.service"]
    (mkdir,) = plan.op("vLLM cache directories")
    assert mkdir == "mkdir -p " + " ".join(plan_vllm.cache_dirs())
    for name in ("huggingface", "vllm", "triton", "torchinductor", "torch"):
        assert f"/var/cache/gpubox/vllm/{name}" in mkdir
    # the pull comes before anything that starts the image
    names = short(plan.names)
    assert names.index(start) < names.index(next(n for n in names if n.startswith("Pull ")))
    assert names.index(next(n for n in names if n.startswith("Pull "))) < names.index(
        "(Re)start vLLM"
    )


def test_the_cache_directories_are_made_whenever_one_is_missing(plan_of):
    """Not only when the image is absent: the image is here, one directory was removed."""
    answers = converged(VLLM)
    answers[MISSING_DIRS] = ["/var/cache/gpubox/vllm/torchinductor"]
    plan = plan_of(backend_stage.backend, VLLM, answers)
    assert plan.op("vLLM cache directories") == ["mkdir -p /var/cache/gpubox/vllm/torchinductor"]
    assert not [n for n in short(plan.names) if n.startswith("Pull ")]


def test_a_second_deploy_with_the_image_present_plans_no_pull(plan_of):
    plan = plan_of(backend_stage.backend, VLLM, converged(VLLM))
    assert not [n for n in short(plan.names) if n.startswith("Pull ")]
    assert not [c for c in plan.commands if "docker pull" in c or "gpubox-vllm-pull" in c]
    assert not [c for c in plan.commands if "hf download" in c]  # the checkpoint is there
    assert not [n for n in plan.names if "cache directories" in n]
    assert "vLLM unit" not in short(plan.names)  # unchanged: no upload
    # the restart, the forward-compat check and the warm-up are planned only `_if` needed
    conditional = short(plan.conditional)
    for name in ("(Re)start vLLM", "Warm-up requests"):
        assert name in conditional
    assert [n for n in conditional if "forward-compatibility" in n]


def test_the_image_is_checked_for_its_forward_compatibility_libraries(plan_of):
    plan = plan_of(backend_stage.backend, VLLM, first_deploy())
    (check,) = plan.op("carries CUDA 12.9's forward-compatibility libraries")
    assert check.startswith(
        f"docker run --rm --pull never --entrypoint sh {IMAGE} -c "
        "'ls /usr/local/cuda-12.9/compat/libcuda.so.*'"
    )
    assert "CUDA 12.8 of the driver" in check and "exit 1" in check
    names = short(plan.names)
    assert names.index(next(n for n in names if "forward-compat" in n)) < names.index(
        "(Re)start vLLM"
    )
    # driver 580 supports CUDA 13.0 natively: the 12.9 image needs no forward compatibility
    on_580 = {**VLLM, "driver_branch": "580", "cuda_version": "12.8"}
    plan = plan_of(backend_stage.backend, on_580, first_deploy())
    assert not [n for n in plan.names if "forward-compat" in n]


def test_the_unit_turns_forward_compatibility_on_only_where_the_driver_is_older():
    """vLLM 0.19.1 loads the image's cuda-compat libraries only with
    VLLM_ENABLE_CUDA_COMPATIBILITY=1 (its Dockerfile sets 0; vllm/env_override.py puts the
    directory first in LD_LIBRARY_PATH, which only a process started afterwards reads: hence
    spawn). Driver 570 (CUDA 12.8) is older than the image's CUDA 12.9: on; 580: off, said."""

    def exec_start(data: dict[str, object]) -> str:
        unit = vllm_stage.unit_text(load_host_config("b", data))
        return next(x for x in unit.splitlines() if x.startswith("ExecStart="))

    on_570 = exec_start(VLLM)
    for expected in (
        "-e VLLM_ENABLE_CUDA_COMPATIBILITY=1",
        "-e VLLM_CUDA_COMPATIBILITY_PATH=/usr/local/cuda-12.9/compat",
        "-e VLLM_WORKER_MULTIPROC_METHOD=spawn",
    ):
        assert expected in on_570, expected
    on_580 = exec_start({**VLLM, "driver_branch": "580", "cuda_version": "12.8"})
    assert "-e VLLM_ENABLE_CUDA_COMPATIBILITY=0" in on_580
    assert "VLLM_CUDA_COMPATIBILITY_PATH" not in on_580
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in on_580


def test_the_unit_file_carries_the_caches_never_pulls_and_names_the_quantization():
    unit = vllm_stage.unit_text(load_host_config("b", VLLM))
    exec_start = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    for expected in (
        "--pull never",
        "-v /var/cache/gpubox/vllm/huggingface:/root/.cache/huggingface",
        "-v /var/cache/gpubox/vllm/vllm:/root/.cache/vllm",
        "-v /var/cache/gpubox/vllm/triton:/root/.triton",
        "-v /var/cache/gpubox/vllm/torchinductor:/root/.cache/torchinductor",
        "-e TORCHINDUCTOR_CACHE_DIR=/root/.cache/torchinductor",
        "-e TRITON_CACHE_DIR=/root/.triton/cache",
        "-e TRITON_CACHE_AUTOTUNING=1",
        "-e VLLM_CACHE_ROOT=/root/.cache/vllm",
        "-e HF_HOME=/root/.cache/huggingface",
        "-e HF_HUB_OFFLINE=1",
        "-v /srv/models:/models",
        f"/models/{CHECKPOINT} --quantization gptq",
        "--dtype half",
        "--attention-backend TRITON_ATTN",
        "--enable-auto-tool-choice --tool-call-parser hermes",
        "--reasoning-parser deepseek_r1",
    ):
        assert expected in exec_start, expected
    assert "docker pull" not in unit and "--pull always" not in unit
    assert "jart25/" not in exec_start  # the local directory, never the Hub's repository
    gptq = {
        "models.qwen3-next-80b-a3b-thinking.vllm_repo": "someone/Qwen3-Next-80B-A3B-Thinking-GPTQ",
        "models.qwen3-next-80b-a3b-thinking.vllm_quantization": "gptq",
        "models.qwen3-next-80b-a3b-thinking.vllm_weights_gib": 44,
    }
    unit = vllm_stage.unit_text(load_host_config("b", {**VLLM, "catalog_overrides": gptq}))
    assert "/models/someone--Qwen3-Next-80B-A3B-Thinking-GPTQ --quantization gptq " in unit
    bf16 = {"models.qwen3-next-80b-a3b-thinking.vllm_quantization": "none"}
    unit = vllm_stage.unit_text(load_host_config("b", {**VLLM, "catalog_overrides": bf16}))
    assert "--quantization" not in unit
    mirror = vllm_stage.unit_text(
        load_host_config("b", {**VLLM, "hf_endpoint": "https://hf-mirror.com"})
    )
    assert "-e HF_ENDPOINT=https://hf-mirror.com" in mirror


def test_the_warm_up_sends_every_length_after_a_restart(plan_of):
    data = {**VLLM, "model_ctx": 65536, "model_parallel": 3}
    plan = plan_of(backend_stage.backend, data, first_deploy())
    (warm,) = plan.op("Warm-up requests")
    assert "for n in 16 512 2048 16384; do" in warm and "for i in 1 2 3; do" in warm
    assert "--config - " in warm and "/etc/gpubox/api-key" in warm
    assert "$(" not in warm and "`" not in warm and "Bearer $" not in warm
    assert "Warm-up requests" in short(plan.conditional)


# --- Before vLLM starts: the image's torch and the checkpoint's quantization_config ---------

ARCHS_CHECK = re.escape(f"The torch in {IMAGE} runs on compute capability 7.0")
CONFIG_CHECK = "The checkpoint's quantization_config suits vLLM on Tesla V100-SXM2-32GB"
DIRECTORY = f"/srv/models/{CHECKPOINT}"


def test_both_checks_come_before_anything_of_vllm_changes(plan_of):
    plan = plan_of(backend_stage.backend, VLLM, first_deploy())
    (archs,) = plan.op(ARCHS_CHECK)
    assert archs.startswith("FunctionCommand(_image_archs, ('vllm/vllm-openai:v0.19.1', ")
    (config,) = plan.op(CONFIG_CHECK)
    assert f"'{DIRECTORY}', 'gptq', 'Tesla V100-SXM2-32GB'" in config
    names = short(plan.names)
    checks = [names.index(n) for n in names if n.startswith(("The torch in", "The checkpoint's"))]
    pull = names.index(next(n for n in names if n.startswith("Pull ")))
    assert len(checks) == 2 and pull < min(checks)  # the image is there to be read
    for later in ("vLLM cache directories", "vLLM unit", "(Re)start vLLM", "Warm-up requests"):
        assert max(checks) < names.index(next(n for n in names if n.startswith(later))), later
    assert set(short(plan.conditional)) >= {
        n for n in names if n.startswith(("The torch in", "The checkpoint's"))
    }


def check_conditions(data: dict[str, object], answers: dict[object, object]) -> list[bool]:
    """The `_if` of the two checks, evaluated as the deploy would before running them."""
    with fake_host(data, answers) as fake:
        backend_stage.backend()
        found = []
        for op_hash in fake.state.get_op_order():
            names = fake.state.op_meta[op_hash].names
            if any(("The torch in" in n or "The checkpoint's" in n) for n in names):
                condition = fake.state.get_op_data_for_host(fake.host, op_hash).global_arguments[
                    "_if"
                ]
                conditions = condition if isinstance(condition, list) else [condition]
                found.append(all(c() for c in conditions))
        return found


def test_the_checks_run_only_when_vllm_will_be_started():
    assert check_conditions(VLLM, first_deploy()) == [True, True]
    assert check_conditions(VLLM, converged(VLLM)) == [False, False]  # a no-op deploy
    stopped = converged(VLLM)
    stopped.update(unit_state("gpubox-vllm", "inactive"))
    assert check_conditions(VLLM, stopped) == [True, True]
    # another unit (here: another context) means a restart: checked again
    assert check_conditions({**VLLM, "model_ctx": 65536}, converged(VLLM)) == [True, True]


class Box:
    """A host whose commands answer from recorded outputs (stdout, or a failure's stderr)."""

    def __init__(self, answers: dict[str, tuple[bool, str]], data: dict[str, object] | None = None):
        self.answers, self.sent, self.data = answers, [], data or {}
        self.sudo: list[bool] = []

    def run_shell_command(self, command: str, _sudo: bool = False):
        self.sent.append(command)
        self.sudo.append(_sudo)
        for needle, (ok, text) in self.answers.items():
            if needle in command:
                stream = "stdout" if ok else "stderr"
                return ok, CommandOutput([OutputLine(stream, t) for t in text.splitlines()])
        return False, CommandOutput([OutputLine("stderr", "No such file or directory")])


V100 = "Tesla V100-SXM2-32GB"
# The catalog's record of the pinned image, as TORCH_ARCH_COMMAND prints it (derived from
# PyTorch's build script, tests/unit/test_vllm_volta_checks.py); torch 2.11's cu129 wheel
# lacks sm_70 (pytorch/pytorch PR #172598).
WITH_VOLTA = "2.10.0+cu129 12.9 sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120"
NO_VOLTA = "2.11.0+cu129 12.9 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120"


def test_the_image_check_reads_the_image_without_a_gpu_and_stops_with_its_line():
    command = vllm_stage.torch_arch_command(IMAGE)
    assert command.startswith(
        f"docker run --rm --pull never --runtime runc --network none --entrypoint python3 {IMAGE}"
    )
    assert "torch._C._cuda_getArchFlags()" in command and "--gpus" not in command
    box = Box({"--entrypoint python3": (True, WITH_VOLTA)})
    vllm_stage._image_archs(None, box, IMAGE, V100)  # runs: nothing raised
    assert box.sent == [command]
    with pytest.raises(OperationError) as refused:
        vllm_stage._image_archs(None, Box({"python3": (True, NO_VOLTA)}), IMAGE, V100)
    message = str(refused.value)
    assert message.startswith(f"vLLM is not started: {IMAGE} cannot run on {V100}")
    assert NO_VOLTA in message
    # a CPU-only torch has no _cuda_getArchFlags: the command fails, its error is shown
    failing = Box(
        {
            "python3": (
                False,
                "AttributeError: module 'torch._C' has no attribute '_cuda_getArchFlags'",
            )
        }
    )
    unreadable = "not started: cannot read what the torch in .*'_cuda_getArchFlags'"
    with pytest.raises(OperationError, match=unreadable):
        vllm_stage._image_archs(None, failing, IMAGE, V100)


def test_the_checkpoint_check_reads_config_json_on_the_box():
    quant = {"bits": 4, "group_size": 128, "sym": True, "desc_act": False, "quant_method": "gptq"}
    config = {"model_type": "qwen3_next", "num_experts": 512, "quantization_config": quant}
    box = Box({f"{DIRECTORY}/config.json": (True, json.dumps(config, indent=2))})
    vllm_stage._checkpoint_config(None, box, DIRECTORY, "gptq", V100)
    assert box.sent == [f"cat -- {DIRECTORY}/{name}" for name in vllm_stage.CHECKPOINT_CONFIGS]
    assert box.sudo == [False, False]
    # a deploy through a sudoer (host data _sudo) reads root's files and runs docker with sudo
    box = Box({f"{DIRECTORY}/config.json": (True, json.dumps(config))}, {"_sudo": True})
    vllm_stage._checkpoint_config(None, box, DIRECTORY, "gptq", V100)
    assert box.sudo == [True, True]
    box = Box({"python3": (True, WITH_VOLTA)}, {"_sudo": True})
    vllm_stage._image_archs(None, box, IMAGE, V100)
    assert box.sudo == [True]
    config["quantization_config"] = {**quant, "sym": False}
    box = Box({f"{DIRECTORY}/config.json": (True, json.dumps(config, indent=2))})
    with pytest.raises(OperationError) as refused:
        vllm_stage._checkpoint_config(None, box, DIRECTORY, "gptq", V100)
    assert str(refused.value).startswith(
        f"vLLM is not started: {DIRECTORY}/config.json: quantization_config.sym is false"
    )
    with pytest.raises(OperationError, match="config.json is missing"):
        vllm_stage._checkpoint_config(None, Box({}), DIRECTORY, "gptq", V100)


def test_the_check_command_is_torchs_own():
    assert vllm_stage.torch_arch_command(IMAGE).endswith(
        "-c 'import torch; print(torch.__version__, torch.version.cuda, "
        "torch._C._cuda_getArchFlags())'"
    )
    assert torch_archs.TORCH_ARCH_COMMAND in vllm_stage.torch_arch_command(IMAGE)


# --- G: VLLM_ATTENTION_BACKEND stays out --------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        VLLM,
        {**VLLM, "vllm_enforce_eager": True, "hf_endpoint": "https://hf-mirror.com"},
        {**VLLM, "catalog_overrides": {"vllm.image": "vllm/vllm-openai:v0.18.0"}},
    ],
)
def test_vllm_attention_backend_is_nowhere_in_what_gpubox_renders(data):
    """vLLM 0.19.1 no longer reads VLLM_ATTENTION_BACKEND; the unit passes
    --attention-backend. Neither the unit, the container's environment, docker's arguments
    nor the unit's template may bring the variable back."""
    config = load_host_config("b", data)
    rendered = "\n".join(
        [
            vllm_stage.unit_text(config),
            json.dumps(plan_vllm.container_env(config)),
            " ".join(plan_vllm.docker_argv(config)),
        ]
    )
    assert "VLLM_ATTENTION_BACKEND" not in rendered
    assert "--attention-backend TRITON_ATTN" in vllm_stage.unit_text(config)
    from importlib import resources

    templates = resources.files("gpubox").joinpath("templates")
    for template in templates.iterdir():
        if template.name.startswith("vllm"):
            assert "VLLM_ATTENTION_BACKEND" not in template.read_text(), template.name


def test_the_ssm_state_dtype_key_reaches_vllms_arguments():
    from gpubox.config import load_host_config

    default = plan_vllm.vllm_args(load_host_config("b", VLLM))
    assert "--mamba-ssm-cache-dtype" not in default
    f32 = plan_vllm.vllm_args(
        load_host_config("b", {**VLLM, "vllm_mamba_ssm_cache_dtype": "float32"})
    )
    assert f32[-2:] == ["--mamba-ssm-cache-dtype", "float32"]
