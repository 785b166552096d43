"""GPU generation rules, as data.

Compute capability decides everything that can go wrong on an older GPU: which driver
branches still drive it, which kernel module flavour it needs, which CUDA toolkits can build
for it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    name: str
    # The newest driver branch that still supports it (None: still supported by current ones).
    last_driver_branch: int | None
    # Open kernel modules need GSP, first in Turing.
    open_modules: bool
    # The last CUDA major that can build for it (CUDA 13 dropped Maxwell/Pascal/Volta).
    last_cuda_major: int | None


@dataclass(frozen=True)
class GpuModel:
    name: str  # as nvidia-smi prints it
    compute_capability: tuple[int, int]
    architecture: str
    pci_ids: tuple[str, ...]  # vendor:device as lspci -nn prints it
    memory_mib: int


ARCHITECTURES: dict[str, Architecture] = {
    "Kepler": Architecture(
        "Kepler", last_driver_branch=470, open_modules=False, last_cuda_major=11
    ),
    "Maxwell": Architecture(
        "Maxwell", last_driver_branch=580, open_modules=False, last_cuda_major=12
    ),
    "Pascal": Architecture(
        "Pascal", last_driver_branch=580, open_modules=False, last_cuda_major=12
    ),
    "Volta": Architecture("Volta", last_driver_branch=580, open_modules=False, last_cuda_major=12),
    "Turing": Architecture(
        "Turing", last_driver_branch=None, open_modules=True, last_cuda_major=None
    ),
    "Ampere": Architecture(
        "Ampere", last_driver_branch=None, open_modules=True, last_cuda_major=None
    ),
    "Ada": Architecture("Ada", last_driver_branch=None, open_modules=True, last_cuda_major=None),
    "Hopper": Architecture(
        "Hopper", last_driver_branch=None, open_modules=True, last_cuda_major=None
    ),
}

_GPU_LIST = [
    GpuModel("Tesla V100-SXM2-32GB", (7, 0), "Volta", ("10de:1db5",), 32768),
    GpuModel("Tesla V100-SXM2-16GB", (7, 0), "Volta", ("10de:1db1",), 16384),
    GpuModel("Tesla V100-PCIE-32GB", (7, 0), "Volta", ("10de:1db6",), 32768),
    GpuModel("Tesla V100-PCIE-16GB", (7, 0), "Volta", ("10de:1db4",), 16384),
    GpuModel("Tesla V100S-PCIE-32GB", (7, 0), "Volta", ("10de:1df6",), 32768),
    GpuModel("Tesla P100-PCIE-16GB", (6, 0), "Pascal", ("10de:15f8",), 16384),
    GpuModel("Tesla P40", (6, 1), "Pascal", ("10de:1b38",), 24576),
    GpuModel("Tesla T4", (7, 5), "Turing", ("10de:1eb8",), 15360),
    GpuModel("NVIDIA A100-SXM4-40GB", (8, 0), "Ampere", ("10de:20b0",), 40960),
    GpuModel("NVIDIA A100-SXM4-80GB", (8, 0), "Ampere", ("10de:20b2",), 81920),
    GpuModel("NVIDIA A100-PCIE-40GB", (8, 0), "Ampere", ("10de:20f1",), 40960),
    GpuModel("NVIDIA A100 80GB PCIe", (8, 0), "Ampere", ("10de:20b5",), 81920),
    GpuModel("NVIDIA GeForce RTX 3090", (8, 6), "Ampere", ("10de:2204",), 24576),
    GpuModel("NVIDIA L4", (8, 9), "Ada", ("10de:27b8",), 23034),
    GpuModel("NVIDIA GeForce RTX 4090", (8, 9), "Ada", ("10de:2684",), 24564),
    GpuModel("NVIDIA H100 80GB HBM3", (9, 0), "Hopper", ("10de:2330",), 81559),
    GpuModel("NVIDIA H100 PCIe", (9, 0), "Hopper", ("10de:2331",), 81559),
]
GPU_MODELS: dict[str, GpuModel] = {gpu.name: gpu for gpu in _GPU_LIST}

# NVIDIA cards that are not inference targets but sit beside them (display cards), by PCI id,
# so that preflight can say what the pinned branch does with them.
OTHER_NVIDIA_CARDS: dict[str, tuple[str, str]] = {
    "10de:128b": ("GeForce GT 710", "Kepler"),
    "10de:1288": ("GeForce GT 720", "Kepler"),
    "10de:0f02": ("GeForce GT 730", "Kepler"),
    "10de:1f82": ("GeForce GTX 1650", "Turing"),
    "10de:1c82": ("GeForce GTX 1050 Ti", "Pascal"),
    "10de:1d01": ("GeForce GT 1030", "Pascal"),
}


@dataclass(frozen=True)
class CudaRule:
    version: str
    min_driver_branch: int
    major: int


# CUDA toolkit -> the oldest driver branch that supports it (Toolkit Release Notes, Table 3).
CUDA_RULES: dict[str, CudaRule] = {
    "12.8": CudaRule("12.8", 570, 12),
    "12.9": CudaRule("12.9", 575, 12),
    "13.0": CudaRule("13.0", 580, 13),
}

KERNEL_MODULE_FLAVOURS = ("proprietary", "open")


def pci_id_model(pci_id: str) -> GpuModel | None:
    for gpu in _GPU_LIST:
        if pci_id.lower() in gpu.pci_ids:
            return gpu
    return None


def pci_id_architecture(pci_id: str) -> tuple[str, str] | None:
    """(name, architecture) of any NVIDIA card gpubox knows by PCI id."""
    gpu = pci_id_model(pci_id)
    if gpu:
        return gpu.name, gpu.architecture
    return OTHER_NVIDIA_CARDS.get(pci_id.lower())


def branch_supports(architecture: str, branch: int) -> bool:
    last = ARCHITECTURES[architecture].last_driver_branch
    return last is None or branch <= last


def default_kernel_modules(gpu: GpuModel) -> str:
    return "open" if ARCHITECTURES[gpu.architecture].open_modules else "proprietary"


def cuda_builds_for(cuda_version: str, gpu: GpuModel) -> bool:
    last = ARCHITECTURES[gpu.architecture].last_cuda_major
    return last is None or CUDA_RULES[cuda_version].major <= last


def check(
    gpu_model: str,
    driver_branch: int,
    kernel_modules: str,
    cuda_version: str,
    skip: Collection[str] = (),
) -> list[tuple[str, str]]:
    """Every incompatibility of a GPU/driver/CUDA combination, as (key, message) pairs. A rule
    that reads a key named in ``skip`` (a value already refused) is skipped."""

    def valid(*names: str) -> bool:
        return not any(name in skip for name in names)

    problems: list[tuple[str, str]] = []
    if not valid("gpu_model"):
        return _check_cuda(cuda_version, driver_branch, skip)
    gpu = GPU_MODELS.get(gpu_model)
    if gpu is None:
        known = ", ".join(sorted(GPU_MODELS))
        return [("gpu_model", f"unknown GPU model {gpu_model!r}; known models: {known}")]
    arch = ARCHITECTURES[gpu.architecture]
    cc = "{}.{}".format(*gpu.compute_capability)
    if valid("driver_branch") and not branch_supports(gpu.architecture, driver_branch):
        problems.append(
            (
                "driver_branch",
                f"driver branch {driver_branch} does not support {gpu.name} ({arch.name}, compute "
                f"capability {cc}): R{arch.last_driver_branch} is the last branch for {arch.name}",
            )
        )
    if valid("driver_kernel_modules") and kernel_modules == "open" and not arch.open_modules:
        problems.append(
            (
                "driver_kernel_modules",
                f"open kernel modules do not work on {gpu.name} ({arch.name}, compute capability "
                f"{cc}; they need Turing or newer): use 'proprietary'",
            )
        )
    if (
        valid("cuda_version")
        and cuda_version in CUDA_RULES
        and not cuda_builds_for(cuda_version, gpu)
    ):
        problems.append(
            (
                "cuda_version",
                f"CUDA {cuda_version} cannot build for {gpu.name} (compute capability {cc}): "
                f"CUDA {arch.last_cuda_major}.x is the last toolkit for {arch.name}",
            )
        )
    return problems + _check_cuda(cuda_version, driver_branch, skip)


def _check_cuda(
    cuda_version: str, driver_branch: int, skip: Collection[str]
) -> list[tuple[str, str]]:
    """The rules of ``check`` that do not read the GPU model."""
    if "cuda_version" in skip:
        return []
    rule = CUDA_RULES.get(cuda_version)
    if rule is None:
        return [
            (
                "cuda_version",
                f"unknown CUDA version {cuda_version!r}; known: {', '.join(CUDA_RULES)}",
            )
        ]
    if "driver_branch" not in skip and driver_branch < rule.min_driver_branch:
        return [
            (
                "cuda_version",
                f"CUDA {cuda_version} needs driver branch {rule.min_driver_branch} or newer; "
                f"driver_branch is {driver_branch}",
            )
        ]
    return []


# Quantisations and dtypes whose kernels need a newer GPU than Volta (compute capability 7.0):
# bf16 and the Marlin/AWQ kernels need Ampere (8.0), FP8 Ada (8.9), FP4 Blackwell (10.0).
QUANT_MIN_CC: dict[str, tuple[int, int]] = {
    "bf16": (8, 0),
    "awq": (8, 0),
    "marlin": (8, 0),
    "gptq-marlin": (8, 0),
    "fp8": (8, 9),
    "fp4": (10, 0),
    "nvfp4": (10, 0),
    "mxfp4": (10, 0),
}
# The first vLLM release without sm_70 kernels in its default images (CUDA 13, torch 2.11).
VLLM_LAST_FOR_VOLTA = (0, 19)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.lstrip("v").split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_backend(
    gpu_model: str,
    gpu_count: int,
    backend: str,
    quantization: str,
    vllm_version: str,
    tensor_parallel: int,
    ctx: int,
    model_context: int,
    skip: Collection[str] = (),
) -> list[tuple[str, str]]:
    """Every incompatibility of a backend/model/GPU combination, as (key, message) pairs. A
    rule that reads a key named in ``skip`` (a value already refused) is skipped."""

    def valid(*names: str) -> bool:
        return not any(name in skip for name in names)

    problems: list[tuple[str, str]] = []
    gpu = GPU_MODELS.get(gpu_model)
    if gpu is None or backend == "none" or not valid("gpu_model", "backend"):
        return problems
    cc = "{}.{}".format(*gpu.compute_capability)
    need = QUANT_MIN_CC.get(quantization.lower())
    if valid("model_quantization") and need and gpu.compute_capability < need:
        instead = (
            "fp16 weights (vLLM --dtype half)"
            if backend == "vllm"
            else "a GGUF quantisation such as Q4_K_XL with llama.cpp"
        )
        problems.append(
            (
                "model_quantization",
                f"{quantization} needs compute capability {need[0]}.{need[1]}; "
                f"{gpu.name} has {cc}: use {instead}",
            )
        )
    if backend == "vllm":
        if (
            gpu.compute_capability < (7, 5)
            and _version_tuple(vllm_version)[:2] > VLLM_LAST_FOR_VOLTA
        ):
            problems.append(
                (
                    "catalog_overrides",
                    f"vLLM {vllm_version} ships no kernels for compute capability {cc} "
                    f"({gpu.name}): use vllm/vllm-openai:v0.19.1 or older, or the llamacpp "
                    "backend",
                )
            )
        if valid("vllm_tensor_parallel", "gpu_count") and tensor_parallel > gpu_count:
            problems.append(
                (
                    "vllm_tensor_parallel",
                    f"tensor parallel {tensor_parallel} is larger than gpu_count {gpu_count}: use "
                    f"{gpu_count} or fewer",
                )
            )
    if valid("model_ctx") and ctx > model_context:
        problems.append(
            (
                "model_ctx",
                f"context {ctx} is larger than the model's {model_context}: "
                f"use {model_context} or less",
            )
        )
    return problems
