"""The vLLM backend: the vllm/vllm-openai image at the catalog's tag (the last that still runs
on compute capability 7.0), run by a systemd unit, warmed up with one request after a start.
"""

from __future__ import annotations

import json
import re
import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, OperationError, operation
from pyinfra.operations import server, systemd

from gpubox.config import HostConfig
from gpubox.facts import CommandOutput
from gpubox.stages import ManagedFiles, render
from gpubox.stages.backend import VLLM_UNIT, api_key, wait_for_health

CACHE_DIR = "/var/cache/gpubox/vllm"
# The unit's runtime directory (RuntimeDirectory=, root only, gone when the unit stops) and
# the env file (VLLM_API_KEY=...) it writes there from its credential at each start.
RUNTIME_DIR = VLLM_UNIT
ENV_FILE = f"/run/{RUNTIME_DIR}/env"


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


def docker_argv(config: HostConfig) -> list[str]:
    """The unit's `docker run`. The API key reaches the container through --env-file, a file
    the unit writes from its credential at each start (runtime directory, root only)."""
    image = config.catalog["vllm"]["image"]
    volumes = [
        f"{config.model_dir}:/models",
        f"{CACHE_DIR}/huggingface:/root/.cache/huggingface",
        f"{CACHE_DIR}/vllm:/root/.cache/vllm",
        f"{CACHE_DIR}/triton:/root/.triton",
        f"{CACHE_DIR}/torch:/root/.cache/torch",
    ]
    return [
        "/usr/bin/docker", "run", "--rm", "--name", VLLM_UNIT, "--pull", "never",
        "--runtime", "nvidia", "--gpus", "all", "--ipc=host",
        "-p", f"{config.api_host}:{config.api_port}:8000",
        *[w for v in volumes for w in ("-v", v)],
        "-e", "TRITON_CACHE_AUTOTUNING=1",
        "--env-file", ENV_FILE,
        image,
        *vllm_args(config),
    ]  # fmt: skip


def unit_text(config: HostConfig) -> str:
    """The unit: docker's arguments straight in ExecStart= (no shell), each quoted for systemd."""
    argv = docker_argv(config)
    return render(
        "vllm.service.j2",
        image=config.catalog["vllm"]["image"],
        model=config.catalog["models"][config.model]["vllm_repo"],
        alias=json.dumps(config.model_alias),  # a comment line: no newline may get through
        unit=VLLM_UNIT,
        api_key_file=config.api_key_file.replace("%", "%%"),
        runtime_dir=RUNTIME_DIR,
        env_file=ENV_FILE,
        exec_start=" ".join(systemd_quote(a) for a in argv),
    )


def warm_up_command(port: int, alias: str, api_key_file: str) -> str:
    """The warm-up request as the shell command that runs on the host. The key never enters
    an argument list (ps shows those): sed reads it from the root-only file and hands curl the
    header as configuration on its standard input (curl --config -)."""
    body = json.dumps(
        {"model": alias, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}]}
    )
    # curl's config syntax: a double-quoted value with \\ and \" escaped.
    header = r"""-e 's/[\\"]/\\&/g' -e '1s/.*/header = "Authorization: Bearer &"/p'"""
    return (
        f"sed -n {header} {shlex.quote(api_key_file)} | "
        f"curl -fsS --max-time 900 --config - -H 'Content-Type: application/json' "
        f"-d {shlex.quote(body)} http://127.0.0.1:{int(port)}/v1/chat/completions"
    )


@operation(is_idempotent=False)
def warm_up(port: int, alias: str, api_key_file: str):
    """One short chat completion, so that Triton's autotuning is done before users come."""

    def _warm(state, host, command: str) -> None:
        ok, out = host.run_shell_command(command)
        if not ok:
            raise OperationError("the warm-up request failed: " + "\n".join(out.stderr_lines))

    yield FunctionCommand(_warm, (warm_up_command(port, alias, api_key_file),), {})


def vllm(config: HostConfig, model_change) -> None:
    image = config.catalog["vllm"]["image"]
    present = host.get_fact(
        CommandOutput, command=f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}"
    ).strip()
    if not present:
        server.shell(name=f"Pull {image} (once)", commands=[f"docker pull {shlex.quote(image)}"])
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
