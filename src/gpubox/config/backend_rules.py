"""The model and backend rules: the model's entry, the vLLM checks, whether the model fits, and
llama.cpp's pinned source, per-slot context and split modes."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from gpubox.base import compat
from gpubox.config.host import Problem
from gpubox.config.keys import MODEL_REPO
from gpubox.knowledge import vllm_rules


def backend_problems(
    host: str, values: dict[str, Any], host_catalog: dict[str, Any], invalid: set[str]
) -> list[Problem]:
    """The model and backend rules (compat.check_backend) and whether the model fits. A rule
    that reads a refused key (``invalid``) is skipped."""

    def valid(*names: str) -> bool:
        return invalid.isdisjoint(names)

    if values["backend"] == "none" or not valid("backend"):
        return []
    models = host_catalog["models"]
    model = models.get(values["model"])
    if not valid("model"):
        return []
    if model is None:
        return [
            Problem(
                host,
                "model",
                f"unknown model {values['model']!r}; known: {', '.join(sorted(models))}",
            )
        ]
    # A refused override of this model's entry (context, weights_gib, ...): the rules that read
    # the entry's numbers would judge the catalog's instead of the host's.
    entry = f"catalog_overrides:models.{values['model']}."
    if any(name.startswith(entry) for name in invalid):
        invalid = invalid | {"model_ctx"}
    problems: list[Problem] = []
    if (
        valid("model_source", "model_url")
        and values["model_source"] == "url"
        and not values["model_url"]
    ):
        problems.append(Problem(host, "model_url", "model_source is 'url' but model_url is unset"))
    if valid("model_repo") and values["model_repo"] is not None:
        if not MODEL_REPO.fullmatch(values["model_repo"]):
            problems.append(
                Problem(
                    host,
                    "model_repo",
                    f"must be a repository id like 'owner/name', got {values['model_repo']!r}",
                )
            )
        elif valid("model_source") and values["model_source"] == "url":
            problems.append(
                Problem(
                    host,
                    "model_repo",
                    "is not used with model_source 'url' (model_url is)",
                    severity="warning",
                )
            )
    problems += _download_problems(host, values, valid)
    quantization = values["model_quantization"] or model["quantization"]
    vllm_version = ""
    if values["backend"] == "vllm":
        # What the vLLM unit runs: the image's tag, its CUDA, the checkpoint and whether it
        # fits (gpubox.knowledge.vllm_rules); compat judges the version and quantisation it reports.
        vllm_version, findings = vllm_rules.check(values, host_catalog, model, skip=invalid)
        problems += [Problem(host, f.key, f.message, f.severity) for f in findings]
        flag = vllm_rules.quantization_flag(model)
        quantization = values["model_quantization"] or (flag.replace("_", "-") if flag else "fp16")
    tensor_parallel = values["vllm_tensor_parallel"] or values["gpu_count"]
    for key, message in compat.check_backend(
        values["gpu_model"],
        values["gpu_count"],
        values["backend"],
        quantization,
        vllm_version,
        tensor_parallel,
        values["model_ctx"],
        model["context"],
        skip=invalid,
    ):
        problems.append(Problem(host, key, message))
    if values["backend"] == "llamacpp":
        problems += [
            Problem(host, k, m) for k, m in _llamacpp_problems(values, host_catalog, valid)
        ]
    gpu = compat.GPU_MODELS.get(values["gpu_model"])
    if (
        gpu
        and valid("gpu_model", "gpu_count", "model_ctx", "llamacpp_cuda")
        and values["backend"] == "llamacpp"
        and values["llamacpp_cuda"]
    ):
        found = llamacpp_memory(values, model, gpu)
        if found:
            problems.append(Problem(host, *found))
    return problems


# The share of each GPU's memory llama.cpp's weights and KV cache may take (the rest: the
# CUDA context and compute buffers).
USABLE = 0.95


def llamacpp_memory(
    values: dict[str, Any], model: dict[str, Any], gpu: compat.GpuModel
) -> tuple[str, str] | None:
    """Whether llama.cpp's weights and KV cache fit the GPUs, as (key, message) when they do
    not. The KV cache is the whole pool: model_parallel slots of model_ctx tokens each, all
    full at once. Weights that do not fit alone are gpu_count's problem, with the fixes that
    can work (more GPUs, fewer bits); weights that fit with a pool that does not, model_ctx's,
    with the largest per-slot context that fits at this model_parallel."""
    count, ctx, slots = values["gpu_count"], values["model_ctx"], values["model_parallel"]
    pool = ctx * slots
    per_gpu = gpu.memory_mib * USABLE
    have = per_gpu * count
    weights = model["weights_gib"] * 1024
    kv_per_token = model["kv_mib_per_1k_ctx"] / 1024
    need = weights + kv_per_token * pool
    if need <= have:
        return None
    what = f"{count}x {gpu.name} {'has' if count == 1 else 'have'} {have / 1024:.0f} GiB usable"
    if weights >= have:
        gpus = math.ceil(need / per_gpu)
        room = per_gpu * count - kv_per_token * pool
        fewer = (
            f", or fewer bits per weight: a quantisation of at most {room / 1024:.0f} GiB at "
            f"model_ctx {ctx} x model_parallel {slots} (its GGUF as model_file and "
            f"model_sha256, its size as catalog_overrides models.{values['model']}.weights_gib)"
            if room >= 1024
            else ""
        )
        return (
            "gpu_count",
            f"{values['model']}'s weights alone are about {model['weights_gib']} GiB "
            f"({model['quantization']}); {what}, so no model_ctx fits: use more GPUs "
            f"(gpu_count {gpus}: {gpus * per_gpu / 1024:.0f} GiB, room for model_ctx {ctx} "
            f"x model_parallel {slots}){fewer}",
        )
    fits = int((have - weights) / kv_per_token / slots) // 1024 * 1024
    return (
        "model_ctx",
        f"{values['model']} with {slots} slot(s) of {ctx} tokens (a KV pool of {pool} tokens: "
        f"every slot may hold its whole context at once) needs about {need / 1024:.0f} GiB of "
        f"GPU memory ({model['weights_gib']} GiB of weights + the KV cache); {what}: lower "
        f"model_ctx to {fits} or less, or lower model_parallel",
    )


# systemd's MemoryMax=: bytes with an optional K, M, G or T suffix (infinity: no cap)
MEMORY_MAX = re.compile(r"[1-9][0-9]*[KMGT]?|infinity")
# a revision as both hubs take it: a commit, a branch or a tag, no spaces or shell characters
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


def _download_problems(
    host: str, values: dict[str, Any], valid: Callable[..., bool]
) -> list[Problem]:
    """The model download's own keys (gpubox.stages.model)."""
    problems = []
    memory = values.get("download_memory_max")
    if valid("download_memory_max") and memory is not None and not MEMORY_MAX.fullmatch(memory):
        problems.append(
            Problem(
                host,
                "download_memory_max",
                f"must be bytes with an optional K, M, G or T suffix (or infinity), got {memory!r}",
            )
        )
    for key in ("model_revision", "vllm_revision"):
        value = values.get(key)
        if valid(key) and value is not None and (not REVISION.fullmatch(value) or ".." in value):
            problems.append(
                Problem(host, key, f"must be a commit, branch or tag name, got {value!r}")
            )
    bundle = values.get("modelscope_ca_bundle")
    if valid("modelscope_ca_bundle") and bundle is not None and not bundle.startswith("/"):
        problems.append(
            Problem(
                host,
                "modelscope_ca_bundle",
                f"must be an absolute path on the box, got {bundle!r}",
            )
        )
    revision = values.get("model_revision")
    if (
        valid("model_revision", "model_source")
        and revision is not None
        and not problems_for(problems, "model_revision")
        and values["model_source"] == "url"
    ):
        problems.append(
            Problem(
                host,
                "model_revision",
                "is not used with model_source 'url' (model_url is)",
                severity="warning",
            )
        )
    return problems


def problems_for(problems: list[Problem], key: str) -> bool:
    return any(p.key == key for p in problems)


def _arg_values(args: list[Any], *names: str) -> list[str]:
    """The values given to any of ``names`` in an argument list ("-c 0" or "-c=0")."""
    found = []
    for i, arg in enumerate(str(a) for a in args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found.append(str(args[i + 1]))
            elif arg.startswith(name + "="):
                found.append(arg[len(name) + 1 :])
    return found


# llama.cpp rounds the KV cache, and each slot's share of it, up to a multiple of 256 tokens.
SLOT_STEP = 256

# Flags of llamacpp_extra_args that would change what a slot holds, and why each is refused.
SLOT_FLAGS = (
    (
        ("-kvu", "--kv-unified", "--kv-unified-per-slot"),
        "a unified KV cache lets one request take the whole pool and leaves the other slots "
        'short ("Context size has been exceeded" mid-answer); gpubox gives every slot its own '
        "model_ctx instead",
    ),
    (
        ("-no-kvu", "--no-kv-unified"),
        "gpubox already runs llama-server without the unified KV cache; remove it",
    ),
    (("-c", "--ctx-size"), "use model_ctx (each slot's context) instead"),
    (("-np", "--parallel"), "use model_parallel instead"),
)


def _llamacpp_problems(
    values: dict[str, Any], host_catalog: dict[str, Any], valid: Callable[..., bool]
) -> list[tuple[str, str]]:
    """llama.cpp's rules: a pinned source, a per-slot context that holds a thinking answer,
    and what each split mode needs. (key, message) pairs."""
    found: list[tuple[str, str]] = []
    llama = host_catalog["llamacpp"]
    sha256 = str(llama["sha256"])
    if not sha256:
        found.append(
            (
                "catalog_overrides",
                "llamacpp.sha256 is empty: set it to the sha256 its publisher gives for the "
                "file at llamacpp.url (nothing is downloaded unverified)",
            )
        )
    elif len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        found.append(
            (
                "catalog_overrides",
                f"llamacpp.sha256 must be 64 lowercase hex digits, got {sha256!r}",
            )
        )
    extra = [str(a) for a in values["llamacpp_extra_args"]]
    # gpubox sizes the slots itself (gpubox.stages.llamacpp.llama_args): -np model_parallel,
    # -c model_ctx x model_parallel and no unified KV cache, so each slot holds exactly
    # model_ctx tokens and all of them can be full at once. These flags would undo that.
    for flags, why in SLOT_FLAGS:
        given = [f for f in flags if f in extra or any(a.startswith(f + "=") for a in extra)]
        if given:
            found.append(("llamacpp_extra_args", f"sets {given[0]}: {why}"))
    if valid("model_ctx") and values["model_ctx"] % SLOT_STEP:
        ctx = values["model_ctx"]
        low, high = ctx // SLOT_STEP * SLOT_STEP, (ctx // SLOT_STEP + 1) * SLOT_STEP
        found.append(
            (
                "model_ctx",
                f"llama.cpp sizes each slot in steps of {SLOT_STEP} tokens, so {ctx} would "
                f"become {high}: use {low or SLOT_STEP} or {high}",
            )
        )
    model = host_catalog["models"][values["model"]]
    thinking = model.get("thinking_output_tokens") or 0
    # The sandbox's tiny model (a model_file of its own) is not the catalog's thinking model.
    serves_catalog_file = values["model_file"] in (None, model["file"])
    if serves_catalog_file and valid("model_ctx") and values["model_ctx"] < thinking:
        found.append(
            (
                "model_ctx",
                f"{values['model']} may think for {thinking} tokens (its model card's output "
                f"budget), but a slot holds model_ctx = {values['model_ctx']} tokens: raise "
                "model_ctx",
            )
        )
    if not valid("llamacpp_split_mode", "llamacpp_extra_args", "gpu_count"):
        return found
    mode = values["llamacpp_split_mode"]
    if _arg_values(extra, "-sm", "--split-mode"):
        found.append(("llamacpp_extra_args", "sets -sm: use llamacpp_split_mode instead"))
    if mode in ("row", "tensor") and values["gpu_count"] < 2:
        found.append(
            (
                "llamacpp_split_mode",
                f"{mode!r} splits each layer across the GPUs: it needs gpu_count 2 or more "
                f"(got {values['gpu_count']}); use 'layer'",
            )
        )
    if mode == "tensor":
        # llama.cpp's tensor split refuses to start without FlashAttention and needs an f16
        # KV cache and an explicit context; gpubox passes -fa on -ctk f16 -ctv f16 -c model_ctx.
        fa = [v for v in _arg_values(extra, "-fa", "--flash-attn") if v != "on"]
        if fa:
            found.append(
                (
                    "llamacpp_extra_args",
                    f"llamacpp_split_mode 'tensor' needs FlashAttention on; the extra args set "
                    f"-fa {fa[-1]}",
                )
            )
        kv = [
            v
            for v in _arg_values(extra, "-ctk", "--cache-type-k", "-ctv", "--cache-type-v")
            if v != "f16"
        ]
        if kv:
            found.append(
                (
                    "llamacpp_extra_args",
                    f"llamacpp_split_mode 'tensor' needs an f16 KV cache; the extra args ask for "
                    f"{kv[-1]}",
                )
            )
        if values["model_ctx"] <= 0 or "0" in _arg_values(extra, "-c", "--ctx-size"):
            found.append(
                (
                    "model_ctx",
                    "llamacpp_split_mode 'tensor' needs an explicit context: set model_ctx, "
                    "and no -c 0 in llamacpp_extra_args",
                )
            )
    return found
