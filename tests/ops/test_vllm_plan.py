"""The vLLM backend's plans: the image pulled once with progress, never by the unit; the cache
directories made every deploy they are missing; the forward-compatibility check of the image;
the warm-up at several lengths; a second deploy that plans no pull. The checkpoint is downloaded
by the model stage before vLLM starts (tests/ops/test_vllm_checkpoint_plan.py) and served from
model_dir with the Hub off."""

from __future__ import annotations

import hashlib
import re

from conftest import REFERENCE, fresh_box

from gpubox.config import load_host_config
from gpubox.stages import backend as backend_stage
from gpubox.stages import vllm as vllm_stage
from gpubox.stages import vllm_image

VLLM = {**REFERENCE, "backend": "vllm"}
IMAGE = "vllm/vllm-openai:v0.19.1"
UNIT_PATH = "/etc/systemd/system/gpubox-vllm.service"
MISSING_DIRS = '[ -d "$d" ] || echo "$d"'
CHECKPOINT = "INC4AI--Qwen3-Next-80B-A3B-Thinking-int4-AutoRound"
# The model stage's answer for a checkpoint whose marker matches the files on the box.
CHECKPOINT_COMPLETE = {
    ".gpubox-complete": ["marker=yes", "commit=" + "a" * 40, "files=3", "present=45097156608"]
}


def short(names) -> list[str]:
    """Operation names without their deploy's prefix ("Backend | ...")."""
    return [n.rsplit(" | ", 1)[-1] for n in names]


def first_deploy(**overrides: object) -> dict[object, object]:
    """A box with Docker but no image, no cache directory, no unit."""
    return fresh_box("ubuntu2404", **{MISSING_DIRS: vllm_stage.cache_dirs(), **overrides})


def converged(data: dict[str, object]) -> dict[object, object]:
    """A box where the image, the caches, the key and the unit are as the config wants."""
    unit = vllm_stage.unit_text(load_host_config("box", data))
    digest = hashlib.sha256(unit.encode()).hexdigest()
    return fresh_box(
        "ubuntu2404",
        **{
            "docker image inspect": "sha256:0123456789abcdef",
            "systemctl is-active gpubox-vllm": "active",
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
    assert mkdir == "mkdir -p " + " ".join(vllm_stage.cache_dirs())
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
        f"/models/{CHECKPOINT} --quantization auto-round",
        "--dtype half",
        "--attention-backend TRITON_ATTN",
        "--enable-auto-tool-choice --tool-call-parser hermes",
        "--reasoning-parser deepseek_r1",
    ):
        assert expected in exec_start, expected
    assert "docker pull" not in unit and "--pull always" not in unit
    assert "INC4AI/" not in exec_start  # the local directory, never the Hub's repository
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
