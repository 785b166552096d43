"""The vLLM backend: the vllm/vllm-openai image at the catalog's tag (the last that still runs
on compute capability 7.0), run by a systemd unit, warmed up with one request after a start.
Facts: shared/reference/inference-backends.md §3."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, OperationError, operation
from pyinfra.operations import server, systemd

from gpubox.config import HostConfig
from gpubox.facts import CommandOutput
from gpubox.stages import ManagedFiles, render
from gpubox.stages.backend import VLLM_UNIT, api_key, wait_for_health

CACHE_DIR = "/var/cache/gpubox/vllm"


def vllm_args(config: HostConfig) -> list[str]:
    model = config.catalog["models"][config.model]
    args = [
        model["vllm_repo"],
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
    if config.vllm_enforce_eager:
        args.append("--enforce-eager")
    return args


def unit_text(config: HostConfig) -> str:
    return render(
        "vllm.service.j2",
        image=config.catalog["vllm"]["image"],
        model=config.catalog["models"][config.model]["vllm_repo"],
        alias=config.model_alias,
        unit=VLLM_UNIT,
        host=config.api_host,
        port=config.api_port,
        model_dir=config.model_dir,
        cache_dir=CACHE_DIR,
        api_key_file=config.api_key_file,
        args=" ".join(shlex.quote(a) for a in vllm_args(config)),
    )


@operation(is_idempotent=False)
def warm_up(port: int, alias: str, api_key_file: str):
    """One short chat completion, so that Triton's autotuning is done before users come."""

    def _warm(state, host) -> None:
        body = (
            '{"model": "' + alias + '", "max_tokens": 8, '
            '"messages": [{"role": "user", "content": "Hello"}]}'
        )
        ok, out = host.run_shell_command(
            f'curl -fsS --max-time 900 -H "Authorization: Bearer $(cat {api_key_file})" '
            f"-H 'Content-Type: application/json' -d {shlex.quote(body)} "
            f"http://127.0.0.1:{port}/v1/chat/completions"
        )
        if not ok:
            raise OperationError("the warm-up request failed: " + "\n".join(out.stderr_lines))

    yield FunctionCommand(_warm, (), {})


def vllm(config: HostConfig, model_change) -> None:
    image = config.catalog["vllm"]["image"]
    present = host.get_fact(
        CommandOutput, command=f"docker image inspect --format '{{{{.Id}}}}' {image}"
    ).strip()
    if not present:
        server.shell(name=f"Pull {image} (once)", commands=[f"docker pull {image}"])
    server.shell(
        name="vLLM cache directories on the host",
        commands=[
            f"mkdir -p {CACHE_DIR}/huggingface {CACHE_DIR}/vllm {CACHE_DIR}/triton "
            f"{CACHE_DIR}/torch"
        ],
        _if=lambda: not present,
    )
    key = api_key(config)
    path = f"/etc/systemd/system/{VLLM_UNIT}.service"
    unit = ManagedFiles({path: unit_text(config)}).put("vLLM unit", path)
    changed = [c for c in (unit, model_change, key) if c is not None]
    running = host.get_fact(CommandOutput, command=f"systemctl is-active {VLLM_UNIT}").strip()

    def restart() -> bool:
        return running != "active" or any(c.did_change() for c in changed)

    systemd.daemon_reload(name="Reload systemd units (vLLM)", _if=unit.did_change)
    systemd.service(name="vLLM enabled", service=VLLM_UNIT, enabled=True)
    systemd.service(name="(Re)start vLLM", service=VLLM_UNIT, restarted=True, _if=restart)
    wait_for_health(
        name="Wait for vLLM's /health",
        port=config.api_port,
        unit=VLLM_UNIT,
        timeout=config.health_timeout,
        _if=restart,
    )
    warm_up(
        name="Warm-up request",
        port=config.api_port,
        alias=config.model_alias,
        api_key_file=config.api_key_file,
        _if=restart,
    )
