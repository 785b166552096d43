"""`gpubox check` for the vLLM backend: the checkpoint fits the GPUs' memory, the version is
read from the image the unit runs, and CUDA forward compatibility is a checked rule."""

from __future__ import annotations

import pytest

from gpubox.base import compat
from gpubox.config import validate
from gpubox.knowledge import vllm_rules

REFERENCE = {
    "gpu_model": "Tesla V100-SXM2-32GB",
    "gpu_count": 2,
    "driver_branch": "570",
    "cuda_version": "12.8",
    "backend": "vllm",
}
MODEL = "models.qwen3-next-80b-a3b-thinking."
BF16 = {
    MODEL + "vllm_repo": "Qwen/Qwen3-Next-80B-A3B-Thinking",
    MODEL + "vllm_quantization": "none",
    MODEL + "vllm_weights_gib": 149,
}


def check(**data):
    """(errors, warnings) of a host: {key: message}."""
    found = validate("b", {**REFERENCE, **data})[1]
    errors = {p.key: p.message for p in found if p.severity == "error"}
    warnings = {p.key: p.message for p in found if p.severity == "warning"}
    return errors, warnings


def overrides(**paths):
    return {"catalog_overrides": paths}


# --- GPU memory ---------------------------------------------------------------------------


def test_the_default_4_bit_checkpoint_fits_2x_v100_32gb():
    errors, warnings = check()
    assert errors == {} and warnings == {}
    config = validate("b", REFERENCE)[0]
    model = config.catalog["models"][config.model]
    f = vllm_rules.fit(
        model["vllm_weights_gib"],
        model["kv_mib_per_1k_ctx"],
        config.model_ctx,
        config.model_parallel,
        2,
        config.vllm_gpu_memory_utilization,
        32768,
        eager=False,
    )
    # 45 GiB / 2 + 131072 tokens x 2 slots x 24 KiB / 2 + 3 GiB of headroom
    assert (f.weights, f.kv_cache, f.headroom) == (22.5, 3.0, 3.0)
    assert f.need == 28.5 and f.budget == pytest.approx(0.92 * 32)


def test_the_bf16_original_is_refused_naming_gpu_count_with_the_numbers():
    errors, _ = check(**overrides(**BF16))
    message = errors["gpu_count"]
    assert "74.5 GiB of weights" in message and "Qwen/Qwen3-Next-80B-A3B-Thinking" in message
    assert "a Tesla V100-SXM2-32GB has 32.0 GiB: the weights do not fit" in message
    assert "4-bit" in message


def test_a_too_long_context_is_refused_naming_model_ctx_and_what_fits():
    errors, _ = check(model_ctx=262144)
    message = errors["model_ctx"]
    assert "6.0 GiB of KV cache" in message and "262144 tokens x 2 slots" in message
    assert "0.92 x 32.0 GiB = 29.4 GiB" in message
    assert "lower model_ctx to 172032 or less at model_parallel 2" in message
    # the number it proposes is accepted, one step more is not
    assert check(model_ctx=172032)[0] == {}
    assert "model_ctx" in check(model_ctx=172032 + 1024)[0]
    # more slots at the same context: the KV cache of every slot counts
    assert check(model_parallel=2)[0] == {}  # 22.5 + 3 + 3 = 28.5 GiB
    assert "131072 tokens x 3 slots" in check(model_parallel=3)[0]["model_ctx"]  # 30 GiB


def test_too_little_of_the_gpu_for_vllm_names_the_utilization():
    errors, _ = check(vllm_gpu_memory_utilization=0.6)
    assert "gives 19.2 GiB: raise it to at least 0.90" in errors["vllm_gpu_memory_utilization"]


def test_tensor_parallel_on_one_gpu_does_not_fit():
    errors, _ = check(vllm_tensor_parallel=1)
    assert "45.0 GiB of weights" in errors["gpu_count"]


def test_eager_mode_needs_no_cuda_graph_memory():
    f = vllm_rules.fit(42, 24, 131072, 2, 2, 0.92, 32768, eager=True)
    assert f.headroom == vllm_rules.ACTIVATION_HEADROOM_GIB


def test_a_checkpoint_without_a_size_is_a_warning():
    _, warnings = check(**overrides(**{MODEL + "vllm_weights_gib": 0}))
    assert "cannot tell whether it fits" in warnings["catalog_overrides"]


def test_the_memory_rule_is_the_vllm_one_only():
    """llama.cpp has its own rule; the vLLM checkpoint's size does not count there."""
    assert check(backend="llamacpp", **overrides(**BF16))[0] == {}


# --- Version: read from the image the unit runs ---------------------------------------------


@pytest.mark.parametrize(
    ("image", "tag", "version", "cuda"),
    [
        ("vllm/vllm-openai:v0.19.1", "v0.19.1", "0.19.1", "12.9"),
        ("vllm/vllm-openai:v0.19.1-cu130", "v0.19.1-cu130", "0.19.1", "13.0"),
        ("mirror.example:5000/vllm/vllm-openai:v0.18.0", "v0.18.0", "0.18.0", "12.9"),
        ("vllm/vllm-openai:v0.19.1@sha256:" + "a" * 64, "v0.19.1", "0.19.1", "12.9"),
        ("vllm/vllm-openai:latest", "latest", None, "12.9"),
        ("vllm/vllm-openai@sha256:" + "a" * 64, None, None, "12.9"),
        ("mirror.example:5000/vllm/vllm-openai", None, None, "12.9"),
    ],
)
def test_the_image_reference_is_read(image, tag, version, cuda):
    info = vllm_rules.image_info({"image": image, "version": "", "image_cuda": "12.9"})
    assert (info.tag, info.tag_version, info.cuda) == (tag, version, cuda)
    assert info.verified == (version is not None)


def test_overriding_only_the_image_to_v0_20_is_refused():
    errors, _ = check(**overrides(**{"vllm.image": "vllm/vllm-openai:v0.20.0"}))
    assert "vLLM 0.20.0 ships no kernels for compute capability 7.0" in errors["catalog_overrides"]
    # the same image on an Ampere GPU is not refused for its version
    errors, _ = check(
        gpu_model="NVIDIA A100-SXM4-80GB",
        gpu_count=1,
        driver_branch="580",
        **overrides(**{"vllm.image": "vllm/vllm-openai:v0.20.0", "vllm.image_cuda": "12.9"}),
    )
    assert "catalog_overrides" not in errors


def test_an_image_whose_tag_is_no_version_is_refused_unless_the_version_is_stated():
    errors, _ = check(**overrides(**{"vllm.image": "vllm/vllm-openai:latest"}))
    assert "cannot tell which vLLM vllm/vllm-openai:latest holds" in errors["catalog_overrides"]
    digest = "vllm/vllm-openai@sha256:" + "a" * 64
    errors, _ = check(**overrides(**{"vllm.image": digest}))
    assert "it has no tag" in errors["catalog_overrides"]
    # stated: accepted, and shown as unverified
    errors, warnings = check(
        **overrides(**{"vllm.image": "vllm/vllm-openai:latest", "vllm.version": "0.19.1"})
    )
    assert errors == {}
    assert "vLLM 0.19.1 for vllm/vllm-openai:latest is unverified" in warnings["catalog_overrides"]
    # a stated release is judged too
    errors, _ = check(
        **overrides(**{"vllm.image": "vllm/vllm-openai:latest", "vllm.version": "0.20.1"})
    )
    assert "vLLM 0.20.1 ships no kernels" in errors["catalog_overrides"]


def test_a_version_that_contradicts_the_tag_is_refused():
    found = validate("b", {**REFERENCE, **overrides(**{"vllm.version": "0.18.0"})})[1]
    (problem,) = [p for p in found if p.severity == "error"]
    assert "vllm.version 0.18.0 contradicts vllm.image vllm/vllm-openai:v0.19.1" in problem.message
    assert check(**overrides(**{"vllm.version": "0.19.1"})) == ({}, {})


# --- CUDA forward compatibility -----------------------------------------------------------


def test_the_driver_branches_cuda():
    assert vllm_rules.driver_cuda(570) == "12.8"
    assert vllm_rules.driver_cuda(575) == "12.9"
    assert vllm_rules.driver_cuda(580) == "13.0"
    assert vllm_rules.driver_cuda(470) is None
    assert vllm_rules.needs_forward_compat("12.9", 570)
    assert not vllm_rules.needs_forward_compat("12.9", 580)
    assert not vllm_rules.needs_forward_compat("12.8", 570)


def test_every_known_gpu_is_classified_for_forward_compatibility():
    assert vllm_rules.DATA_CENTER_GPUS.isdisjoint(vllm_rules.CONSUMER_GPUS)
    assert set(compat.GPU_MODELS) == vllm_rules.DATA_CENTER_GPUS | vllm_rules.CONSUMER_GPUS


def test_forward_compatibility_on_a_geforce_is_refused():
    errors, _ = check(gpu_model="NVIDIA GeForce RTX 3090")
    message = errors["gpu_model"]
    assert "built on CUDA 12.9, newer than the CUDA 12.8 of driver branch 570" in message
    # the reason: the deploy then runs vLLM on the image's compat libraries, which a GeForce
    # cannot load (NVIDIA's forward-compatibility page; vllm/env_override.py: error 803)
    assert "forward-compatibility libraries (VLLM_ENABLE_CUDA_COMPATIBILITY=1)" in message
    assert "data-center GPUs only; NVIDIA GeForce RTX 3090 is not one" in message
    assert "use driver branch 575 or newer (CUDA 12.9)" in message
    # a driver whose CUDA is the image's own needs no forward compatibility
    errors, _ = check(gpu_model="NVIDIA GeForce RTX 3090", driver_branch="580")
    assert "forward compatibility" not in errors.get("gpu_model", "")


def test_forward_compatibility_on_a_data_center_gpu_is_accepted():
    assert check() == ({}, {})  # V100 + 570 + the CUDA 12.9 image
    errors, _ = check(gpu_model="Tesla T4", gpu_count=4, vllm_gpu_memory_utilization=0.95)
    assert "gpu_model" not in errors


def test_a_cuda_13_image_on_driver_570_is_refused():
    errors, _ = check(
        gpu_model="NVIDIA A100-SXM4-80GB",
        gpu_count=1,
        **overrides(**{"vllm.image": "vllm/vllm-openai:v0.19.1-cu130"}),
    )
    message = errors["catalog_overrides"]
    assert "built on CUDA 13.0, newer than the CUDA 12.8 of driver branch 570" in message
    assert "does not cross a CUDA major version" in message
    # the same image on driver 580 (CUDA 13.0) runs natively
    errors, _ = check(
        gpu_model="NVIDIA A100-SXM4-80GB",
        gpu_count=1,
        driver_branch="580",
        **overrides(**{"vllm.image": "vllm/vllm-openai:v0.19.1-cu130"}),
    )
    assert errors == {}


def test_a_cuda_13_image_has_no_volta_kernels_whatever_the_driver():
    errors, _ = check(
        driver_branch="580", **overrides(**{"vllm.image": "vllm/vllm-openai:v0.19.1-cu130"})
    )
    assert "which has no kernels for Tesla V100-SXM2-32GB (Volta)" in errors["catalog_overrides"]


def test_an_image_of_unknown_cuda_is_refused():
    errors, _ = check(**overrides(**{"vllm.image_cuda": ""}))
    assert "the CUDA version of vllm/vllm-openai:v0.19.1 is unknown" in errors["catalog_overrides"]


# --- Quantisation -------------------------------------------------------------------------


def test_the_quantization_flag_is_judged_against_the_gpu():
    assert check(**overrides(**{MODEL + "vllm_quantization": "gptq"})) == ({}, {})
    errors, _ = check(**overrides(**{MODEL + "vllm_quantization": "awq"}))
    assert "awq needs compute capability" in errors["model_quantization"]
    errors, _ = check(**overrides(**{MODEL + "vllm_quantization": "gptq_marlin"}))
    assert "gptq-marlin needs compute capability 8.0" in errors["model_quantization"]
    _, warnings = check(**overrides(**{MODEL + "vllm_quantization": "compressed-tensors"}))
    assert "not known to run on compute capability 7.0" in warnings["catalog_overrides"]
    assert vllm_rules.quantization_flag({"vllm_quantization": "none"}) is None
    assert vllm_rules.quantization_flag({"vllm_quantization": ""}) is None
    assert vllm_rules.quantization_flag({"vllm_quantization": "gptq"}) == "gptq"


# --- The torch in the image (the catalog's record, vllm.torch) -------------------------------

TORCH = "vllm.torch."


def test_the_pinned_images_record_carries_sm_70_and_raises_nothing():
    assert check() == ({}, {})


def test_an_image_recorded_without_sm_70_is_refused_naming_image_torch_and_archs():
    no_volta = "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120"
    errors, _ = check(**overrides(**{TORCH + "archs": no_volta, TORCH + "version": "2.11.0"}))
    message = errors["catalog_overrides"]
    assert message.startswith("vllm/vllm-openai:v0.19.1 carries torch 2.11.0 (CUDA 12.9) built ")
    assert f"built for {no_volta}: none of these runs on compute capability 7.0" in message
    assert "(Tesla V100-SXM2-32GB)" in message and "carries sm_70" in message
    # PTX old enough is compiled by the driver: accepted
    assert check(**overrides(**{TORCH + "archs": "sm_80 compute_70"}))[0] == {}
    # the same record on an A100 is not refused
    a100 = {"gpu_model": "NVIDIA A100-SXM4-80GB", "gpu_count": 1, "driver_branch": "580"}
    errors, _ = check(**a100, **overrides(**{TORCH + "archs": no_volta}))
    assert "catalog_overrides" not in errors


def test_an_image_without_a_record_is_unverified_not_refused():
    errors, warnings = check(**overrides(**{"vllm.image": "vllm/vllm-openai:v0.18.0"}))
    assert errors == {}
    message = warnings["catalog_overrides"]
    assert message.startswith("the torch in vllm/vllm-openai:v0.18.0 is unverified")
    assert "records the torch of vllm/vllm-openai:v0.19.1 only" in message
    assert "stops if 7.0 is not there" in message
    # a record with no architectures is no record
    _, warnings = check(**overrides(**{TORCH + "archs": ""}))
    assert "is unverified" in warnings["catalog_overrides"]


def test_a_release_known_to_lack_sm_70_is_refused_by_its_version_alone():
    errors, warnings = check(**overrides(**{"vllm.image": "vllm/vllm-openai:v0.20.0"}))
    assert "ships no kernels for compute capability 7.0" in errors["catalog_overrides"]
    assert "catalog_overrides" not in warnings  # no "unverified" on top of the refusal
