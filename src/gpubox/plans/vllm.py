"""vLLM's plan: the arguments and `docker run` of the unit the vLLM stage (gpubox.stages.vllm)
writes, its caches and their environment, and the CUDA forward compatibility it runs on (the
container's switch and the image's libraries, checked)."""

from __future__ import annotations

import re
import shlex

from gpubox.base import layout
from gpubox.config import HostConfig
from gpubox.knowledge import vllm_rules
from gpubox.plans import checkpoint

CACHE_DIR = layout.VLLM_CACHE_DIR

# Host directory (under CACHE_DIR) -> where the container sees it. TorchInductor's cache
# defaults to /tmp, which a --rm container loses at every restart: it gets a volume and
# TORCHINDUCTOR_CACHE_DIR. Triton keeps compiled kernels in TRITON_CACHE_DIR and, with
# TRITON_CACHE_AUTOTUNING=1, its autotuning results too. vLLM keeps its torch.compile
# artifacts under its cache root. The checkpoint is not in the Hub cache: the model stage
# downloads it into model_dir (mounted on /models) and the Hub stays off (HF_HUB_OFFLINE=1).
CACHES = {
    "huggingface": "/root/.cache/huggingface",
    "vllm": "/root/.cache/vllm",
    "triton": "/root/.triton",
    "torchinductor": "/root/.cache/torchinductor",
    "torch": "/root/.cache/torch",
}
CACHE_ENV = {
    "HF_HOME": CACHES["huggingface"],
    "VLLM_CACHE_ROOT": CACHES["vllm"],
    "TRITON_CACHE_DIR": CACHES["triton"] + "/cache",
    "TRITON_CACHE_AUTOTUNING": "1",
    "TORCHINDUCTOR_CACHE_DIR": CACHES["torchinductor"],
}


def model_repo(config: HostConfig) -> str:
    return config.catalog["models"][config.model]["vllm_repo"]


def vllm_args(config: HostConfig) -> list[str]:
    model = config.catalog["models"][config.model]
    args = [
        checkpoint.plan(config).container_path,  # the repository, downloaded by the model stage
        "--served-model-name", config.model_alias,
        "--tensor-parallel-size", str(config.vllm_tensor_parallel or config.gpu_count),
        "--dtype", "half",  # Volta has no bf16
        "--attention-backend", "TRITON_ATTN",  # no FlashAttention 2 on sm_70
        "--max-model-len", str(config.model_ctx),
        "--max-num-seqs", str(config.model_parallel),
        "--gpu-memory-utilization", str(config.vllm_gpu_memory_utilization),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--reasoning-parser", "deepseek_r1",
    ]  # fmt: skip
    flag = vllm_rules.quantization_flag(model)
    if flag:
        args[1:1] = ["--quantization", flag]
    if config.vllm_enforce_eager:
        args.append("--enforce-eager")
    if config.vllm_mamba_ssm_cache_dtype != "auto":
        args += ["--mamba-ssm-cache-dtype", config.vllm_mamba_ssm_cache_dtype]
    return args


_SYSTEMD_BARE = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_SYSTEMD_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def systemd_quote(arg: str) -> str:
    """One word of a systemd command line (ExecStart=) that systemd turns back into ``arg``:
    double-quoted with C escapes where needed, "%%" for "%" (specifiers), "$$" for "$"
    (environment variables). No shell is involved."""
    if _SYSTEMD_BARE.fullmatch(arg):
        return arg
    out = []
    for c in arg:
        if c in _SYSTEMD_ESCAPES:
            out.append(_SYSTEMD_ESCAPES[c])
        elif c in "%$":
            out.append(c + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def cache_dirs() -> list[str]:
    """The host directories of the caches (CACHES), in a stable order."""
    return [f"{CACHE_DIR}/{name}" for name in CACHES]


def container_env(config: HostConfig) -> dict[str, str]:
    env = dict(CACHE_ENV)
    # the checkpoint is a local directory: vLLM (transformers, huggingface_hub) asks no Hub
    env["HF_HUB_OFFLINE"] = "1"
    if config.hf_endpoint:
        env["HF_ENDPOINT"] = config.hf_endpoint  # a Hub mirror, as for the model stage
    env.update(compat_env(config))
    return env


def docker_argv(config: HostConfig) -> list[str]:
    """The unit's `docker run`. The API key reaches the container through --env-file, a file
    the unit writes from its credential at each start (runtime directory, root only). It never
    pulls (--pull never): the deploy pulls the image once (gpubox.stages.vllm_image)."""
    image = config.catalog["vllm"]["image"]
    volumes = [f"{config.model_dir}:/models"] + [
        f"{CACHE_DIR}/{name}:{path}" for name, path in CACHES.items()
    ]
    return [
        "/usr/bin/docker", "run", "--rm", "--name", layout.VLLM, "--pull", "never",
        "--runtime", "nvidia", "--gpus", "all", "--ipc=host",
        "-p", f"{config.api_host}:{config.api_port}:8000",
        *[w for v in volumes for w in ("-v", v)],
        *[w for k, v in container_env(config).items() for w in ("-e", f"{k}={v}")],
        "--env-file", layout.VLLM_ENV_FILE,
        image,
        *vllm_args(config),
    ]  # fmt: skip


# --- CUDA forward compatibility ------------------------------------------------------------

# vLLM's switch for the image's cuda-compat libraries (PR #33992, in 0.19.1): off unless "1" or
# "true" (vllm/envs.py); its Dockerfile sets it to 0. With it on, vllm/env_override.py puts
# VLLM_CUDA_COMPATIBILITY_PATH (else /usr/local/cuda-<torch's CUDA>/compat) first in
# LD_LIBRARY_PATH before torch is imported. Where the driver's CUDA is older than the image's
# (570 and the 12.9 image), gpubox takes this path rather than minor-version compatibility:
# vLLM's Dockerfile names it for data-center GPUs with older drivers; the image ships nvcc and
# NVRTC 12.9 for run-time compiling, and a 12.8 driver cannot JIT 12.9 PTX; the pinned
# container toolkit (1.17.8) puts these libraries first anyway when newer than the driver.
# docs/serving.md has the sources.
COMPAT_ENV = "VLLM_ENABLE_CUDA_COMPATIBILITY"


def compat_dir(cuda: str) -> str:
    """Where the image's cuda-compat user-mode driver is (NVIDIA's CUDA base images install
    cuda-compat-X-Y there)."""
    return f"/usr/local/cuda-{cuda}/compat"


def compat_env(config: HostConfig) -> dict[str, str]:
    """The container's CUDA compatibility switch, said either way. On where the driver's CUDA
    is older than the image's (570's 12.8, the image's 12.9): vLLM runs on the image's
    forward-compatibility libraries, at the path the deploy checks. Their directory reaches
    LD_LIBRARY_PATH only in os.environ, which ld.so reads when a program starts: a process
    forked afterwards (vLLM's default start for its engine and workers) keeps the host's
    libcuda, so the processes are spawned. Off ("0") otherwise, so an image whose own default
    is on cannot load libraries older than the host's driver (CUDA error 803)."""
    cuda = vllm_rules.image_info(config.catalog["vllm"]).cuda
    if not vllm_rules.needs_forward_compat(cuda, config.branch):
        return {COMPAT_ENV: "0"}
    return {
        COMPAT_ENV: "1",
        "VLLM_CUDA_COMPATIBILITY_PATH": compat_dir(str(cuda)),
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    }


def compat_check_command(image: str, cuda: str, driver_cuda: str) -> str:
    """Whether the image carries the cuda-compat user-mode driver of its CUDA (``compat_dir``);
    a clear error otherwise. Runs the image without a GPU, its entrypoint replaced by sh."""
    path = compat_dir(cuda)
    inner = f"ls {path}/libcuda.so.*"
    message = (
        f"{image} has no {path}/libcuda.so.*: it is built on CUDA {cuda}, newer than the "
        f"CUDA {driver_cuda} of the driver, so gpubox runs it on the image's CUDA "
        "forward-compatibility libraries, and it lacks them. Use an image built on CUDA "
        f"{driver_cuda} or older, or a driver branch for CUDA {cuda}."
    )
    return (
        f"docker run --rm --pull never --entrypoint sh {shlex.quote(image)} -c "
        f"{shlex.quote(inner)} >/dev/null 2>&1 || {{ echo {shlex.quote(message)} >&2; exit 1; }}"
    )
