"""What the vLLM stage judges on the box before it starts vLLM: the torch inside the pulled
image (gpubox.knowledge.torch_archs) and the downloaded checkpoint's quantization_config
(gpubox.knowledge.vllm_rules.checkpoint_problems), on recorded output and config.json shapes.

Where each recorded shape comes from is written beside it. The image's CUDA 12.9 torch is not
on PyPI and no V100 is reachable here, so none of these was produced by gpubox's own command
in vLLM's image: the lines are torch's arch list as other people printed it, with the version
and CUDA words TORCH_ARCH_COMMAND prints first."""

from __future__ import annotations

import json

import pytest

from gpubox import catalog
from gpubox.base import compat
from gpubox.knowledge import torch_archs, vllm_rules

V100 = compat.GPU_MODELS["Tesla V100-SXM2-32GB"]
T4 = compat.GPU_MODELS["Tesla T4"]
A100 = compat.GPU_MODELS["NVIDIA A100-SXM4-80GB"]

# torch 2.7.1+cu128, torch.cuda.get_arch_list() printed on an RTX PRO 6000 (a public setup
# note, stored copy read with find_string "'sm_100', 'sm_120', 'compute_120'"):
# ['sm_75', 'sm_80', 'sm_86', 'sm_90', 'sm_100', 'sm_120', 'compute_120']. get_arch_list()
# is _cuda_getArchFlags().split() (torch/cuda/__init__.py), so the flags are these words.
CU128_NO_VOLTA = "2.7.1+cu128 12.8 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120"
# torch 2.7.0+cu128 as a Russian setup guide printed it ("Ожидаемый вывод"): Volta still in.
CU128_WITH_VOLTA = (
    "2.7.0+cu128 12.8 sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120"
)
# A CUDA 11.8 build as a build script's comment recorded it: note the old PTX compute_37.
CU118 = "2.0.1+cu118 11.8 sm_50 sm_60 sm_61 sm_70 sm_75 sm_80 sm_86 sm_37 sm_90 compute_37"
# What the catalog records for vllm/vllm-openai:v0.19.1 (torch 2.10.0+cu129): PyTorch's
# .ci/manywheel/build_cuda.sh builds CUDA 12.9 wheels for "7.0;7.5;8.0;8.6;9.0;10.0;12.0+PTX"
# up to release 2.10. Derived from the build script, not printed by the image.
CU129_2_10 = "2.10.0+cu129 12.9 sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120"
# torch 2.11's cu129 wheel after pytorch/pytorch PR #172598 removed 7.0 (derived likewise).
CU129_2_11 = "2.11.0+cu129 12.9 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120"
# A ROCm torch: _cuda_getArchFlags() lists gfx targets and torch.version.cuda is None (a
# public ROCm report: "torch._C._cuda_getArchFlags(): gfx908 gfx90a gfx942 ...").
ROCM = "2.9.1+rocm7.2.4.git39497456 None gfx908 gfx90a gfx942 gfx1030 gfx1100 gfx1201"
# A CPU-only torch has no _cuda_getArchFlags at all (AttributeError, a recorded session:
# "module 'torch._C' has no attribute '_cuda_getArchFlags'"): the command fails, the stage
# stops with its stderr (tests/ops/test_vllm_plan.py).


@pytest.mark.parametrize(
    ("arch", "cc", "runs"),
    [
        ("sm_70", (7, 0), True),
        ("sm_70", (7, 5), True),  # a binary runs on later GPUs of its major
        ("sm_75", (7, 0), False),  # never on earlier ones
        ("sm_70", (8, 0), False),  # nor across a major
        ("sm_72", (7, 0), False),
        ("compute_70", (7, 0), True),  # PTX: compiled by the driver for X.Y or later
        ("compute_60", (7, 0), True),
        ("compute_37", (7, 0), True),
        ("compute_75", (7, 0), False),
        ("compute_120", (7, 0), False),
        ("compute_70", (9, 0), True),
        ("sm_90a", (9, 0), True),  # "a": exactly that GPU
        ("sm_90a", (10, 0), False),
        ("compute_90a", (10, 0), False),
        ("sm_100f", (10, 3), True),  # "f": its family (same major, later minor)
        ("sm_100f", (12, 0), False),
        ("gfx908", (7, 0), False),
        ("sm_", (7, 0), False),
    ],
)
def test_what_runs_on_a_compute_capability(arch, cc, runs):
    assert torch_archs.runs_on(arch, cc) is runs


def test_the_recorded_lines_are_read():
    build = torch_archs.torch_build(CU128_NO_VOLTA)
    assert (build.version, build.cuda) == ("2.7.1+cu128", "12.8")
    assert build.archs == ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")
    rocm = torch_archs.torch_build(ROCM)
    assert rocm.cuda is None and not rocm.runs_on((9, 0))
    assert torch_archs.torch_build("2.10.0+cu129 12.9 None").archs == ()
    for junk in ("", "Traceback (most recent call last):", "sm_70 sm_75"):
        with pytest.raises(ValueError):
            torch_archs.torch_build(junk)


@pytest.mark.parametrize("line", [CU128_WITH_VOLTA, CU118, CU129_2_10])
def test_an_image_whose_torch_carries_sm_70_runs_on_a_v100(line):
    assert torch_archs.image_arch_problem("vllm/vllm-openai:v0.19.1", line, V100) is None


@pytest.mark.parametrize("line", [CU128_NO_VOLTA, CU129_2_11])
def test_an_image_without_sm_70_is_refused_with_its_line(line):
    problem = torch_archs.image_arch_problem("vllm/vllm-openai:v0.20.0", line, V100)
    assert problem is not None
    assert "vllm/vllm-openai:v0.20.0 cannot run on Tesla V100-SXM2-32GB" in problem
    assert "(compute capability 7.0)" in problem and "no sm_70 binary" in problem
    assert "compute_70 or older" in problem and line in problem  # the image's own line
    # the same builds run on a T4 (sm_75) and an A100 (sm_80)
    assert torch_archs.image_arch_problem("i", line, T4) is None
    assert torch_archs.image_arch_problem("i", line, A100) is None


def test_a_build_without_cuda_or_an_unreadable_line_is_refused():
    assert "no CUDA" in str(torch_archs.image_arch_problem("i", ROCM, A100))
    assert "cannot read the torch of i" in str(torch_archs.image_arch_problem("i", "oops", V100))


def test_the_catalogs_record_of_the_pinned_image_runs_on_a_v100():
    record = catalog.load()["vllm"]["torch"]
    assert record["image"] == catalog.load()["vllm"]["image"]
    line = f"{record['version']} {record['cuda']} {record['archs']}"
    assert line == CU129_2_10
    assert torch_archs.image_arch_problem(record["image"], line, V100) is None


# --- The checkpoint's quantization_config -------------------------------------------------

DIRECTORY = "/srv/models/jart25--Qwen3-Next-80B-A3B-Thinking-Int4-GPTQ"
# Qwen3-Next's own config.json fields that matter here (Qwen/Qwen3-Next-80B-A3B-Instruct's
# config, stored copy: "model_type": "qwen3_next", "num_experts": 512, ...).
QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}
QWEN3_NEXT["num_experts"] = 512
# GPTQ as GPTQModel/AutoGPTQ write it into config.json (the keys of the quantisers' save code
# seen in public repositories: bits, group_size, desc_act, sym, damp_percent, true_sequential,
# quant_method, checkpoint_format, static_groups).
GPTQ = {
    "bits": 4,
    "group_size": 128,
    "damp_percent": 0.01,
    "desc_act": False,
    "static_groups": False,
    "sym": True,
    "true_sequential": True,
    "quant_method": "gptq",
    "checkpoint_format": "gptq",
}
# AutoRound's export (intel/auto-round's model-free export, _build_quantization_config):
# quant_method auto-round, packing auto_round:auto_gptq, no desc_act.
AUTOROUND = {
    "quant_method": "auto-round",
    "packing_format": "auto_round:auto_gptq",
    "bits": 4,
    "group_size": 128,
    "sym": True,
    "data_type": "int",
    "autoround_version": "0.12.2",
}


def config_json(quant: dict | None, **model: object) -> dict[str, str | None]:
    body = {**QWEN3_NEXT, **model}
    if quant is not None:
        body["quantization_config"] = quant
    return {"config.json": json.dumps(body, indent=2), "quantize_config.json": None}


def problems(files, flag="gptq", cc=(7, 0)):
    return vllm_rules.checkpoint_problems(files, DIRECTORY, flag, cc)


def test_a_symmetric_gptq_checkpoint_without_desc_act_is_served():
    assert problems(config_json(GPTQ)) == []
    assert problems(config_json({**GPTQ, "bits": 8})) == []
    assert problems(config_json(AUTOROUND), flag="auto-round") == []
    # older AutoRound exports name the packing in "backend"
    old = {**AUTOROUND, "quant_method": "intel/auto-round", "backend": "auto_round:gptq:exllamav2"}
    del old["packing_format"]
    assert problems(config_json(old), flag="auto-round") == []


def test_the_catalogs_recorded_estimate_is_a_config_the_stage_accepts():
    model = catalog.load()["models"]["qwen3-next-80b-a3b-thinking"]
    recorded = {**model["vllm_quantization_config"], "quant_method": model["vllm_quantization"]}
    assert problems(config_json(recorded), flag=model["vllm_quantization"]) == []


def test_an_asymmetric_checkpoint_is_refused_naming_the_file_and_field():
    (problem,) = problems(config_json({**GPTQ, "sym": False}))
    assert problem.startswith(f"{DIRECTORY}/config.json: quantization_config.sym is false: ")
    assert "on compute capability 7.0 (no Marlin)" in problem
    assert "MoeWNA16" in problem and "symmetric" in problem
    missing = {k: v for k, v in GPTQ.items() if k != "sym"}
    assert "quantization_config.sym is null" in problems(config_json(missing))[0]


def test_desc_act_is_refused_where_the_expert_kernel_cannot_take_it():
    (problem,) = problems(config_json({**GPTQ, "desc_act": True}))
    assert f"{DIRECTORY}/config.json: quantization_config.desc_act is true" in problem
    assert "MoeWNA16 expert kernel cannot reorder by activation" in problem
    both = problems(config_json({**GPTQ, "desc_act": True, "sym": False}))
    assert len(both) == 2


def test_marlin_gpus_take_asymmetric_and_act_order_checkpoints():
    act_order = config_json({**GPTQ, "desc_act": True, "sym": False})
    assert problems(act_order, cc=(7, 5)) == [] and problems(act_order, cc=(8, 0)) == []


def test_without_experts_only_the_method_and_bits_count():
    """A dense model's linear layers run on exllama's gptq_gemm, which takes both."""
    dense = config_json({**GPTQ, "desc_act": True, "sym": False}, num_experts=0)
    assert problems(dense) == []
    assert "bits is 3" in problems(config_json({**GPTQ, "bits": 3}, num_experts=0))[0]


def test_awq_and_other_methods_are_refused_on_volta():
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    assert "quant_method is 'awq'" in problems(config_json(awq), flag="awq")[0]
    awq_packed = {**AUTOROUND, "packing_format": "auto_round:auto_awq"}
    (problem,) = problems(config_json(awq_packed), flag="auto-round")
    assert "auto_round:auto_awq" in problem and "AWQ needs compute capability 7.5" in problem


def test_a_missing_or_broken_config_and_an_unquantised_one_are_refused():
    assert problems({"config.json": None}) == [
        f"{DIRECTORY}/config.json is missing: the checkpoint is incomplete"
    ]
    assert "is no JSON object" in problems({"config.json": "{not json"})[0]
    assert "is no JSON object" in problems({"config.json": "[1, 2]"})[0]
    (problem,) = problems(config_json(None))
    assert problem.startswith(f"{DIRECTORY}/config.json has no quantization_config")
    assert "--quantization gptq" in problem
    # served unquantised (no flag): nothing to judge
    assert problems(config_json(None), flag=None) == []


def test_an_old_gptq_checkpoint_keeps_its_config_in_quantize_config_json():
    files = {"config.json": json.dumps(QWEN3_NEXT), "quantize_config.json": json.dumps(GPTQ)}
    assert problems(files) == []
    files["quantize_config.json"] = json.dumps({**GPTQ, "desc_act": True})
    (problem,) = problems(files)
    assert problem.startswith(f"{DIRECTORY}/quantize_config.json: desc_act is true")
