"""The vLLM backend's rules for `gpubox check`: what the unit will run, read from the catalog
(after the host's overrides), judged against the GPUs and the driver.

* **Version.** The vLLM release is read from the tag of the image the unit runs
  (``vllm.image``: v0.19.1, v0.19.1-cu130), never from a separate setting that an image
  override would leave behind. 0.19.1 is the last release whose images ship sm_70 kernels:
  0.20 moved to CUDA 13 and a torch without Volta. An image whose tag is not a version (a
  digest, "latest") is refused unless ``vllm.version`` names its release, and that release is
  then reported as unverified.
* **CUDA forward compatibility.** v0.19.1's default image is built on CUDA 12.9, driver 570
  supports 12.8: gpubox runs it on the image's cuda-compat libraries (gpubox.plans.vllm says
  why and how), which NVIDIA supports on data-center GPUs only (a GeForce: error 803), within
  one CUDA major here (the -cu130 images need driver 580); the deploy and vllm.compat check it.
* **Torch's architectures.** The catalog records what the pinned image's torch is compiled
  for (``vllm.torch``): refused when it cannot run on the GPUs; any other image is unverified
  (the stage reads the image's own list on the box: gpubox.knowledge.torch_archs).
* **The checkpoint's quantisation.** Below 7.5 (no Marlin) vLLM serves a quantised MoE only
  GPTQ-packed: exllama's gptq_gemm and the Triton MoeWNA16 experts. The stage reads the
  downloaded config.json and refuses what that path cannot serve (``checkpoint_problems``).
* **GPU memory.** Per GPU, the weights / tensor parallel, the KV cache of every slot at full
  context / tensor parallel, and a fixed headroom must fit in vllm_gpu_memory_utilization x
  the GPU's memory (see ``fit``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from gpubox.base import compat
from gpubox.knowledge import torch_archs
from gpubox.knowledge.torch_archs import cc_text

# --- What the image is -------------------------------------------------------------------

_VERSION_TAG = re.compile(r"v?(?P<version>\d+\.\d+\.\d+(?:\.post\d+)?)(?:-cu(?P<cuda>\d{3}))?")


def image_tag(image: str) -> str | None:
    """The tag of an image reference (None: no tag, e.g. name@sha256:...). A registry port
    ("host:5000/vllm/vllm-openai") is not a tag."""
    name = image.split("@", 1)[0]
    head, sep, tag = name.rpartition(":")
    if not sep or not head or "/" in tag:
        return None
    return tag


def _cuda_of_suffix(digits: str) -> str:
    return f"{digits[:-1]}.{digits[-1]}"  # cu129 -> 12.9, cu130 -> 13.0


@dataclass(frozen=True)
class Image:
    """What gpubox knows of the image the unit runs."""

    ref: str
    tag: str | None
    tag_version: str | None  # the release its tag names, None when the tag is not a version
    version: str | None  # the release the rules judge (the tag's, else vllm.version's)
    verified: bool  # the version comes from the tag
    cuda: str | None  # the CUDA it is built on (the tag's -cuXYZ wins over vllm.image_cuda)


def image_info(vllm_catalog: dict[str, Any]) -> Image:
    ref = str(vllm_catalog["image"])
    tag = image_tag(ref)
    m = _VERSION_TAG.fullmatch(tag) if tag else None
    tag_version = m["version"] if m else None
    stated = str(vllm_catalog.get("version") or "") or None
    cuda = _cuda_of_suffix(m["cuda"]) if m and m["cuda"] else None
    cuda = cuda or (str(vllm_catalog.get("image_cuda") or "") or None)
    return Image(ref, tag, tag_version, tag_version or stated, tag_version is not None, cuda)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def driver_cuda(branch: int) -> str | None:
    """The newest CUDA a driver branch supports natively (570 -> 12.8, 580 -> 13.0)."""
    native = [r for r in compat.CUDA_RULES.values() if r.min_driver_branch <= branch]
    return max(native, key=lambda r: version_tuple(r.version)).version if native else None


def needs_forward_compat(image_cuda: str | None, branch: int) -> bool:
    native = driver_cuda(branch)
    return bool(image_cuda and native and version_tuple(image_cuda) > version_tuple(native))


# --- Data-center GPUs (CUDA forward compatibility) ----------------------------------------

# NVIDIA supports CUDA forward compatibility on data-center GPUs only. Every GPU of
# compat.GPU_MODELS is in one of these two sets (tests/unit/test_vllm_rules.py).
DATA_CENTER_GPUS = frozenset(
    {
        "Tesla V100-SXM2-32GB",
        "Tesla V100-SXM2-16GB",
        "Tesla V100-PCIE-32GB",
        "Tesla V100-PCIE-16GB",
        "Tesla V100S-PCIE-32GB",
        "Tesla P100-PCIE-16GB",
        "Tesla P40",
        "Tesla T4",
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA L4",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 PCIe",
    }
)
CONSUMER_GPUS = frozenset({"NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090"})


# --- Quantisation flags -----------------------------------------------------------------

# vLLM --quantization values known to run on compute capability 7.0: `gptq` (exllama
# gptq_gemm, minimum 6.0; its MoE layers fall back to the Triton MoeWNA16 kernels, minimum
# 7.0), `auto-round` with GPTQ packing (vLLM routes it to the same two kernels when Marlin is
# missing) and `moe_wna16`. Marlin (gptq_marlin, awq_marlin) needs 7.5 or 8.0, AWQ 7.5; those
# are refused by compat.QUANT_MIN_CC or, when not listed there, reported as unknown.
VOLTA_QUANTIZATIONS = frozenset({"gptq", "auto-round", "moe_wna16"})
UNQUANTIZED = frozenset({"", "none"})


def quantization_flag(model: dict[str, Any]) -> str | None:
    """The --quantization value for the model's vLLM checkpoint (None: none, unquantized)."""
    flag = str(model.get("vllm_quantization") or "").strip()
    return None if flag.lower() in UNQUANTIZED else flag


# --- GPU memory --------------------------------------------------------------------------

# Per GPU, on top of the weights and the KV cache: the activations of one prefill chunk, the
# sampler's buffers, the CUDA context, NCCL and cuBLAS workspaces (2 GiB); the captured CUDA
# graphs (1 GiB, none with --enforce-eager). vLLM's own profile run measures these at start;
# this is the budget gpubox holds them to.
ACTIVATION_HEADROOM_GIB = 2.0
CUDA_GRAPHS_GIB = 1.0


@dataclass(frozen=True)
class Fit:
    """GPU memory per GPU, in GiB."""

    weights: float
    kv_cache: float
    headroom: float
    budget: float  # vllm_gpu_memory_utilization x the GPU's memory
    memory: float  # the GPU's memory

    @property
    def need(self) -> float:
        return self.weights + self.kv_cache + self.headroom

    def text(self) -> str:
        return (
            f"{self.weights:.1f} GiB of weights + {self.kv_cache:.1f} GiB of KV cache + "
            f"{self.headroom:.1f} GiB of headroom = {self.need:.1f} GiB per GPU"
        )


def fit(
    weights_gib: float,
    kv_mib_per_1k_ctx: float,
    ctx: int,
    slots: int,
    tensor_parallel: int,
    utilization: float,
    gpu_memory_mib: int,
    eager: bool,
) -> Fit:
    """Every slot may hold a full context at once: KV cache = ctx x slots, split over the
    tensor-parallel GPUs like the weights (each GPU holds its share of the KV heads)."""
    kv_gib = kv_mib_per_1k_ctx * ctx / 1024 * slots / 1024
    memory = gpu_memory_mib / 1024
    return Fit(
        weights=weights_gib / tensor_parallel,
        kv_cache=kv_gib / tensor_parallel,
        headroom=ACTIVATION_HEADROOM_GIB + (0.0 if eager else CUDA_GRAPHS_GIB),
        budget=utilization * memory,
        memory=memory,
    )


# --- The checkpoint's quantisation config (read on the box) --------------------------------

MARLIN_MIN_CC = (7, 5)  # vLLM's Marlin kernels (gptq_marlin, awq_marlin) need Turing or later
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def checkpoint_problems(
    files: dict[str, str | None], directory: str, flag: str | None, cc: tuple[int, int]
) -> list[str]:
    """Why vLLM cannot serve the checkpoint in ``directory`` with --quantization ``flag`` on
    compute capability ``cc``, from the text of its config.json and quantize_config.json
    (older GPTQ checkpoints keep it there), as ``files`` maps them (None: no such file)."""
    if files.get("config.json") is None:
        return [f"{directory}/config.json is missing: the checkpoint is incomplete"]
    try:
        config = json.loads(files["config.json"] or "")
        quant, source = config.get("quantization_config"), f"{directory}/config.json"
        if not isinstance(quant, dict) and files.get("quantize_config.json"):
            source = f"{directory}/quantize_config.json"
            quant = json.loads(files["quantize_config.json"] or "")
    except (ValueError, AttributeError) as e:
        return [f"{directory}/config.json or quantize_config.json is no JSON object: {e}"]
    if not flag or cc >= MARLIN_MIN_CC:
        return []  # Marlin serves asymmetric and act-order checkpoints alike
    if not isinstance(quant, dict):
        return [
            f"{directory}/config.json has no quantization_config: the checkpoint is not "
            f"quantised, but the unit would run --quantization {flag}"
        ]
    field = "quantization_config." if source.endswith("/config.json") else ""
    where = f"on compute capability {cc_text(cc)} (no Marlin)"
    method = str(quant.get("quant_method", "")).lower()
    packing = str(quant.get("packing_format") or quant.get("backend") or "").lower()
    if method not in ("gptq", "auto-round", "intel/auto-round") or "awq" in packing:
        return [
            f"{source}: {field}quant_method is {quant.get('quant_method')!r} {packing}: "
            f"{where} vLLM serves only GPTQ-packed checkpoints (gptq, or auto-round with GPTQ "
            "packing); AWQ needs compute capability 7.5"
        ]
    problems = []
    if quant.get("bits") not in (4, 8):
        problems.append(
            f"{source}: {field}bits is {quant.get('bits')!r}: {where} vLLM's GPTQ "
            "path serves 4-bit and 8-bit weights only"
        )
    if not any(isinstance(config.get(k), int) and config[k] > 0 for k in _EXPERT_KEYS):
        return problems  # no experts: exllama's gptq_gemm takes what follows
    if quant.get("sym") is not True:
        problems.append(
            f"{source}: {field}sym is {json.dumps(quant.get('sym'))}: {where} vLLM runs the "
            "experts with its MoeWNA16 kernel, which assumes symmetric weights there (sym: "
            "true); serve a symmetric checkpoint"
        )
    if quant.get("desc_act") is True:
        problems.append(
            f"{source}: {field}desc_act is true: {where} vLLM's MoeWNA16 expert kernel cannot "
            "reorder by activation (vLLM counts GPTQ with desc_act as incompatible with it and "
            "drops the experts' g_idx); serve a checkpoint quantised with desc_act false"
        )
    return problems


# --- The rules ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    key: str
    message: str
    severity: str = "error"


def check(
    values: dict[str, Any],
    host_catalog: dict[str, Any],
    model: dict[str, Any],
    skip: Collection[str] = (),
) -> tuple[str, list[Finding]]:
    """The vLLM rules for one host: (the vLLM version compat.check_backend judges against the
    GPU, every finding). A rule that reads a refused key (``skip``) is skipped."""

    def valid(*names: str) -> bool:
        return not any(name in skip for name in names)

    found: list[Finding] = []
    # A refused override of the vllm section: the image rules would judge the catalog's image.
    image_rules = not any(str(s).startswith("catalog_overrides:vllm.") for s in skip)
    image = image_info(host_catalog["vllm"])
    version = ""
    if image_rules:
        found += _version_findings(image, host_catalog["vllm"])
        # compat's Volta rule judges the newest release anything claims (tag, vllm.version).
        claimed = [v for v in (image.tag_version, host_catalog["vllm"].get("version")) if v]
        version = max(claimed, key=version_tuple) if claimed else ""
    gpu = compat.GPU_MODELS.get(values["gpu_model"])
    if gpu is None or not valid("gpu_model"):
        return version, found
    if image_rules and valid("driver_branch"):
        found += _cuda_findings(image, gpu, values["driver_branch"])
    if (
        image_rules
        and image.verified
        and not (
            gpu.compute_capability < (7, 5)
            and version_tuple(version or "0")[:2] > compat.VLLM_LAST_FOR_VOLTA
        )
    ):  # (an unversioned tag is unverified already; compat.check_backend refuses >= 0.20)
        found += _torch_findings(image, host_catalog["vllm"].get("torch") or {}, gpu)
    flag = quantization_flag(model)
    if (
        flag
        and flag.lower() not in VOLTA_QUANTIZATIONS
        and gpu.compute_capability < (7, 5)
        and flag.lower().replace("_", "-") not in compat.QUANT_MIN_CC
    ):
        found.append(
            Finding(
                "catalog_overrides",
                f"vLLM --quantization {flag} is not known to run on compute capability "
                f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}; known to: "
                f"{', '.join(sorted(VOLTA_QUANTIZATIONS))}",
                "warning",
            )
        )
    if valid("gpu_count", "vllm_tensor_parallel", "model_ctx", "model_parallel") and valid(
        "vllm_gpu_memory_utilization", "vllm_enforce_eager"
    ):
        found += _memory_findings(values, model, gpu)
    return version, found


def _torch_findings(image: Image, record: dict[str, Any], gpu: compat.GpuModel) -> list[Finding]:
    """The catalog's record of the torch in the image (vllm.torch) against the GPUs."""
    cc, archs = gpu.compute_capability, tuple(str(record.get("archs") or "").split())
    build = torch_archs.TorchBuild(str(record.get("version")), str(record.get("cuda")), archs)
    if record.get("image") != image.ref or not archs:
        why = (
            f"the torch in {image.ref} is unverified: the catalog records the torch of "
            f"{record.get('image') or 'no image'} only; before vLLM starts, the deploy reads "
            f"what the image's torch is compiled for and stops if {cc_text(cc)} is not there"
        )
        return [Finding("catalog_overrides", why, "warning")]
    if build.runs_on(cc):
        return []
    why = (
        f"{image.ref} carries {build.text()}: none of these runs on compute capability "
        f"{cc_text(cc)} ({gpu.name}); use an image whose torch carries sm_{cc[0]}{cc[1]} "
        "(vllm/vllm-openai:v0.19.1 for Volta)"
    )
    return [Finding("catalog_overrides", why)]


def _version_findings(image: Image, vllm_catalog: dict[str, Any]) -> list[Finding]:
    stated = str(vllm_catalog.get("version") or "")
    if image.tag_version:
        if stated and version_tuple(stated) != version_tuple(image.tag_version):
            return [
                Finding(
                    "catalog_overrides",
                    f"vllm.version {stated} contradicts vllm.image {image.ref}, whose tag "
                    f"says {image.tag_version}: the unit runs the image; leave vllm.version "
                    "empty",
                )
            ]
        return []
    what = f"its tag {image.tag!r}" if image.tag else "it has no tag"
    if stated:
        return [
            Finding(
                "catalog_overrides",
                f"vLLM {stated} for {image.ref} is unverified: {what} is not a version "
                "(vX.Y.Z[-cuXYZ]); gpubox takes vllm.version's word for it",
                "warning",
            )
        ]
    return [
        Finding(
            "catalog_overrides",
            f"cannot tell which vLLM {image.ref} holds: {what} is not a version "
            "(vX.Y.Z[-cuXYZ]); use a versioned tag such as vllm/vllm-openai:v0.19.1, or "
            "state the release with {'vllm.version': 'X.Y.Z'} (reported as unverified)",
        )
    ]


def _cuda_findings(image: Image, gpu: compat.GpuModel, branch_text: str) -> list[Finding]:
    try:
        branch = int(branch_text)
    except ValueError:
        return []  # config.validate reports it
    native = driver_cuda(branch)
    if not image.cuda:
        return [
            Finding(
                "catalog_overrides",
                f"the CUDA version of {image.ref} is unknown: its tag has no -cuXYZ suffix; "
                "set {'vllm.image_cuda': 'X.Y'}",
            )
        ]
    found: list[Finding] = []
    last = compat.ARCHITECTURES[gpu.architecture].last_cuda_major
    if last is not None and version_tuple(image.cuda)[0] > last:
        # CUDA 13 builds nothing for Maxwell, Pascal or Volta: such an image has no kernels.
        found.append(
            Finding(
                "catalog_overrides",
                f"{image.ref} is built on CUDA {image.cuda}, which has no kernels for "
                f"{gpu.name} ({gpu.architecture}): CUDA {last}.x is the last for it; use "
                "vllm/vllm-openai:v0.19.1",
            )
        )
    if native is None or not needs_forward_compat(image.cuda, branch):
        return found
    why = (
        f"{image.ref} is built on CUDA {image.cuda}, newer than the CUDA {native} of driver "
        f"branch {branch}, so it runs only through CUDA forward compatibility"
    )
    if version_tuple(image.cuda)[0] != version_tuple(native)[0]:
        found.append(
            Finding(
                "catalog_overrides",
                f"{why}, which does not cross a CUDA major version: use an image built on "
                f"CUDA {version_tuple(native)[0]}.x (vllm/vllm-openai:v0.19.1) or a driver "
                f"branch for CUDA {image.cuda}",
            )
        )
    if gpu.name not in DATA_CENTER_GPUS:
        rule = compat.CUDA_RULES.get(image.cuda)
        driver = f"driver branch {rule.min_driver_branch} or newer" if rule else "a driver"
        found.append(
            Finding(
                "gpu_model",
                f"{why}: the deploy runs it on the image's forward-compatibility libraries "
                "(VLLM_ENABLE_CUDA_COMPATIBILITY=1), which NVIDIA supports on data-center GPUs "
                f"only; {gpu.name} is not one (CUDA error 803): use {driver} (CUDA "
                f"{image.cuda}), or an image built on CUDA {native} or older",
            )
        )
    return found


def _memory_findings(
    values: dict[str, Any], model: dict[str, Any], gpu: compat.GpuModel
) -> list[Finding]:
    weights = model.get("vllm_weights_gib")
    if not weights:
        return [
            Finding(
                "catalog_overrides",
                f"the model's vLLM checkpoint has no size (vllm_weights_gib): gpubox cannot "
                f"tell whether it fits {values['gpu_count']}x {gpu.name}",
                "warning",
            )
        ]
    tp = values["vllm_tensor_parallel"] or values["gpu_count"]
    ctx, slots = values["model_ctx"], values["model_parallel"]
    utilization = values["vllm_gpu_memory_utilization"]
    f = fit(
        weights,
        model["kv_mib_per_1k_ctx"],
        ctx,
        slots,
        tp,
        utilization,
        gpu.memory_mib,
        values["vllm_enforce_eager"],
    )
    if f.need <= f.budget:
        return []
    intro = (
        f"vLLM needs {f.text()} ({model.get('vllm_repo')}, {ctx} tokens x {slots} slots, "
        f"tensor parallel {tp}); "
    )
    fixed = f.weights + f.headroom
    if fixed > f.memory:
        gpus = math.ceil(weights / (f.memory - f.headroom)) if f.memory > f.headroom else 0
        more = f" (at least {gpus} for the weights alone)" if gpus else ""
        return [
            Finding(
                "gpu_count",
                f"{intro}a {gpu.name} has {f.memory:.1f} GiB: the weights do not fit; serve a "
                f"smaller (4-bit) checkpoint or spread it over more GPUs{more}",
            )
        ]
    if fixed > f.budget:
        at_least = math.ceil(f.need / f.memory * 100) / 100
        fix = (
            f"raise it to at least {at_least:.2f}"
            if at_least <= 1
            else f"raise it to at least {math.ceil(fixed / f.memory * 100) / 100:.2f} (the "
            "weights and headroom alone) and lower model_ctx"
        )
        return [
            Finding(
                "vllm_gpu_memory_utilization",
                f"{intro}vllm_gpu_memory_utilization {utilization} of {f.memory:.1f} GiB "
                f"gives {f.budget:.1f} GiB: {fix}",
            )
        ]
    kv_room = (f.budget - fixed) * tp  # GiB of KV cache all GPUs together can hold
    max_ctx = int(kv_room * 1024 * 1024 / model["kv_mib_per_1k_ctx"] / slots) // 1024 * 1024
    return [
        Finding(
            "model_ctx",
            f"{intro}{utilization} x {f.memory:.1f} GiB = {f.budget:.1f} GiB: lower model_ctx "
            f"to {max_ctx} or less at model_parallel {slots}, lower model_parallel, or raise "
            "vllm_gpu_memory_utilization",
        )
    ]
