"""The vLLM backend: the vllm/vllm-openai image at the catalog's tag (the last release that
still runs on compute capability 7.0), run by a systemd unit that never pulls, its compile
caches on host volumes, warmed up at several prompt lengths after each start.

On Volta (see gpubox.knowledge.vllm_rules and the catalog's comments):

* a 4-bit checkpoint: the original BF16 weights (about 149 GiB) cannot fit 2x 32 GB. Marlin
  needs compute capability 7.5/8.0, so vLLM runs GPTQ-packed int4 with the exllama gptq_gemm
  kernel and the Triton MoeWNA16 kernels for the experts (AWQ needs 7.5);
* --dtype half (no bf16) and the TRITON_ATTN attention backend (no FlashAttention on sm_70);
* the default image (CUDA 12.9) runs on driver 570 (CUDA 12.8) through CUDA forward
  compatibility: the deploy checks the image carries the compat libraries;
* before vLLM (re)starts, the deploy reads what the pulled image's torch is compiled for
  (gpubox.knowledge.torch_archs, no GPU needed) and the downloaded checkpoint's quantization_config
  (gpubox.knowledge.vllm_rules.checkpoint_problems), and stops, changing nothing more, when either
  cannot run on the GPUs.

Triton compiles and autotunes Qwen3-Next's kernels (gated DeltaNet, attention, MoE) lazily: the
project's first user waited 240 s for a first answer. 0.19.1 warms the DeltaNet kernels up at
start and keeps autotuning results on disk; the caches below live on the host, so a restart
reuses them, and the warm-up sends prompts of several lengths, so what is left compiles
before a user comes.

The checkpoint is downloaded in the background (gpubox.plans.checkpoint) into
<model_dir>/<org>--<name>/, and the image pulled in the background (gpubox.stages.vllm_image);
this stage waits for both (long steps with bytes and rate) before vLLM starts. vLLM serves that
directory (/models/<org>--<name> in the container) with HF_HUB_OFFLINE=1, so it never
downloads at start, and serves it under model_alias (--served-model-name).

Tool calls are parsed by vLLM (--enable-auto-tool-choice --tool-call-parser hermes) and the
reasoning is split from the answer (--reasoning-parser deepseek_r1: the Thinking model's
template opens <think> itself). vLLM names the reasoning field `reasoning` (newer releases)
where llama.cpp says `reasoning_content`: clients should read both.
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, OperationError, operation
from pyinfra.operations import server

from gpubox.base import compat, layout
from gpubox.base.rendering import render
from gpubox.config import HostConfig
from gpubox.infra.host_facts import CommandOutput
from gpubox.infra.operations import ManagedFiles
from gpubox.knowledge import torch_archs, vllm_rules
from gpubox.ops import serving, units
from gpubox.plans import checkpoint
from gpubox.plans.vllm import (
    cache_dirs,
    compat_check_command,
    docker_argv,
    model_repo,
    systemd_quote,
)
from gpubox.stages import vllm_image

# Warm-up: prompts of about 16, 512 and 2,048 tokens and a long one (half the context, at most
# WARM_UP_LONGEST), each answered with WARM_UP_TOKENS tokens (the end of sequence ignored) so
# decode runs too, then model_parallel short requests at once (decode batches above one).
WARM_UP_LENGTHS = (16, 512, 2048)
WARM_UP_LONGEST = 16384
WARM_UP_TOKENS = 64
WARM_UP_MAX_TIME = 900  # seconds per request: a cold first request took 240 s


def unit_text(config: HostConfig) -> str:
    """The unit: docker's arguments straight in ExecStart= (no shell), each quoted for systemd."""
    argv = docker_argv(config)
    return render(
        "vllm.service.j2",
        image=config.catalog["vllm"]["image"],
        model=model_repo(config),
        alias=json.dumps(config.model_alias),  # a comment line: no newline may get through
        unit=layout.VLLM,
        api_key_file=config.api_key_file.replace("%", "%%"),
        runtime_dir=layout.VLLM_RUNTIME_DIR,
        env_file=layout.VLLM_ENV_FILE,
        exec_start=" ".join(systemd_quote(a) for a in argv),
    )


# --- Before vLLM starts: the image's torch, the checkpoint's quantisation ------------------

CHECKPOINT_CONFIGS = ("config.json", "quantize_config.json")


def torch_arch_command(image: str) -> str:
    """torch_archs.TORCH_ARCH_COMMAND in the image without a GPU: plain runc (no NVIDIA hook),
    no network, its entrypoint replaced by python3. It prints one line."""
    return (
        "docker run --rm --pull never --runtime runc --network none --entrypoint python3 "
        f"{shlex.quote(image)} -c {shlex.quote(torch_archs.TORCH_ARCH_COMMAND)}"
    )


def _as_deploy(host) -> dict[str, bool]:
    """A function command's own commands run as the deploy's do: with sudo when it uses it
    (docker and the models' directory need root)."""
    return {"_sudo": True} if host.data.get("_sudo") else {}


def _image_archs(state, host, image: str, gpu_model: str) -> None:
    ok, out = host.run_shell_command(torch_arch_command(image), **_as_deploy(host))
    lines = [line for line in out.stdout_lines if line.strip()] if ok else []
    if not lines:
        raise OperationError(
            f"vLLM is not started: cannot read what the torch in {image} is compiled for: "
            + " ".join(out.stderr_lines[-3:] or ["no output"])
        )
    problem = torch_archs.image_arch_problem(image, lines[-1], compat.GPU_MODELS[gpu_model])
    if problem:
        raise OperationError(f"vLLM is not started: {problem}")


@operation(is_idempotent=False)
def image_archs(image: str, gpu_model: str):
    """Stop the deploy when the torch in the pulled image cannot run on the GPUs."""
    yield FunctionCommand(_image_archs, (image, gpu_model), {})


def _checkpoint_config(state, host, directory: str, flag: str | None, gpu_model: str) -> None:
    files: dict[str, str | None] = {}
    for name in CHECKPOINT_CONFIGS:
        command = f"cat -- {shlex.quote(directory + '/' + name)}"
        ok, out = host.run_shell_command(command, **_as_deploy(host))
        files[name] = out.stdout if ok else None
    cc = compat.GPU_MODELS[gpu_model].compute_capability
    problems = vllm_rules.checkpoint_problems(files, directory, flag, cc)
    if problems:
        raise OperationError("vLLM is not started: " + "; ".join(problems))


@operation(is_idempotent=False)
def checkpoint_config(directory: str, flag: str | None, gpu_model: str):
    """Stop the deploy when vLLM's kernels for the GPUs cannot serve the checkpoint's
    quantisation (its config.json, read on the box once downloaded)."""
    yield FunctionCommand(_checkpoint_config, (directory, flag, gpu_model), {})


def before_start(config: HostConfig, due) -> None:
    """The two checks, ``_if`` vLLM is going to be (re)started (``due``)."""
    gpu = compat.GPU_MODELS.get(config.gpu_model)
    if gpu is None:
        return  # gpubox check warns of an unknown GPU; nothing to judge against
    image, cc = config.catalog["vllm"]["image"], torch_archs.cc_text(gpu.compute_capability)
    image_archs(
        name=f"The torch in {image} runs on compute capability {cc}",
        image=image,
        gpu_model=gpu.name,
        _if=due,
    )
    flag = vllm_rules.quantization_flag(config.catalog["models"][config.model])
    checkpoint_config(
        name=f"The checkpoint's quantization_config suits vLLM on {gpu.name}",
        directory=checkpoint.plan(config).directory,
        flag=flag,
        gpu_model=gpu.name,
        _if=due,
    )


# --- Warm-up ------------------------------------------------------------------------------


def warm_up_lengths(ctx: int, max_tokens: int = WARM_UP_TOKENS) -> list[int]:
    """Prompt lengths (in words, about one token each) that fit the context with the answer and
    the chat template: 16, 512, 2048 and half the context up to WARM_UP_LONGEST."""
    wanted = {*WARM_UP_LENGTHS, min(ctx // 2, WARM_UP_LONGEST)}
    fitting = sorted(n for n in wanted if n >= 1 and n + max_tokens + 64 <= ctx)
    return fitting or [1]


def warm_up_command(
    port: int,
    alias: str,
    api_key_file: str,
    lengths: list[int] | tuple[int, ...] = WARM_UP_LENGTHS,
    max_tokens: int = WARM_UP_TOKENS,
    parallel: int = 1,
) -> str:
    """The warm-up as one POSIX shell command that runs on the host: one chat completion per
    prompt length (``hello`` repeated, about one token a word), each decoding ``max_tokens``
    tokens, then ``parallel`` short ones at once. The key never enters an argument list (ps
    shows those): sed reads it from the root-only file and hands curl the header as
    configuration on its standard input (curl --config -). The body goes through a private
    temporary file (mktemp), so a long prompt is no argument either. No command substitution."""
    head = json.dumps(
        {
            "model": alias,
            "max_tokens": max_tokens,
            "ignore_eos": True,  # vLLM's extension: decode all max_tokens
            "messages": [{"role": "user", "content": "@"}],
        }
    )
    prefix, suffix = head.split('"@"')
    prefix, suffix = prefix + '"', '"' + suffix
    # curl's config syntax: a double-quoted value with \\ and \" escaped.
    header = r"""-e 's/[\\"]/\\&/g' -e '1s/.*/header = "Authorization: Bearer &"/p'"""
    request = (
        f"sed -n {header} {shlex.quote(api_key_file)} | "
        f"curl -fsS -o /dev/null --max-time {WARM_UP_MAX_TIME} --config - "
        "-H 'Content-Type: application/json' "
        f'--data-binary @"$f" http://127.0.0.1:{int(port)}/v1/chat/completions'
    )

    def body(words: str) -> str:
        return (
            f"{{ printf '%s' {shlex.quote(prefix)}; yes hello | head -n {words} | "
            f"tr '\\n' ' '; printf '%s' {shlex.quote(suffix)}; }} >\"$f\""
        )

    sizes = " ".join(str(int(n)) for n in lengths)
    script = [
        "mktemp | {",
        "  IFS= read -r f || exit 1",
        "  rc=0",
        f"  for n in {sizes}; do",
        f"    {body(chr(34) + '$n' + chr(34))} || {{ rc=1; break; }}",
        f'    {request} || {{ echo "warm-up: the request of $n words failed" >&2; rc=1; break; }}',
        "  done",
    ]
    if parallel > 1:
        script += [
            '  if [ "$rc" = 0 ]; then',
            f"    {body(str(WARM_UP_LENGTHS[0]))} || rc=1",
            "    pids=",
            f"    for i in {' '.join(str(i) for i in range(1, parallel + 1))}; do",
            f"      {request} &",
            '      pids="$pids $!"',
            "    done",
            '    for p in $pids; do wait "$p" || rc=1; done',
            f'    [ "$rc" = 0 ] || echo "warm-up: {parallel} requests at once failed" >&2',
            "  fi",
        ]
    script += ['  rm -f "$f"', '  exit "$rc"', "}"]
    return "\n".join(script)


@operation(is_idempotent=False)
def warm_up(
    port: int,
    alias: str,
    api_key_file: str,
    lengths: list[int] | tuple[int, ...] = WARM_UP_LENGTHS,
    parallel: int = 1,
):
    """Chat completions at several prompt lengths (and a few at once), so that Triton's
    compiling and autotuning are done before users come."""

    def _warm(state, host, command: str) -> None:
        ok, out = host.run_shell_command(command)
        if not ok:
            raise OperationError("the warm-up failed: " + "\n".join(out.stderr_lines))

    command = warm_up_command(port, alias, api_key_file, lengths=lengths, parallel=parallel)
    yield FunctionCommand(_warm, (command,), {})


# --- The stage ----------------------------------------------------------------------------


def missing_dirs_command(dirs: list[str]) -> str:
    return (
        "for d in " + " ".join(shlex.quote(d) for d in dirs) + '; do [ -d "$d" ] || echo "$d"; done'
    )


def vllm(config: HostConfig, model_change) -> None:
    q = shlex.quote
    image = config.catalog["vllm"]["image"]
    present = host.get_fact(
        CommandOutput, command=f"docker image inspect --format '{{{{.Id}}}}' {q(image)}"
    ).strip()
    if not present:
        # Once: the unit never pulls. Several GB, pulled in the background by
        # gpubox-vllm-pull (gpubox.stages.vllm_image): a progress line every 10 s.
        vllm_image.wait_for_pull(config)
    # Before anything of vLLM's own changes: its image and checkpoint can run on the GPUs.
    path = layout.unit_file(layout.VLLM)
    managed = ManagedFiles({path: unit_text(config)})
    running = serving.is_running(layout.VLLM)
    due = units.changed(model_change, stopped=not (present and running) or managed.differs(path))
    before_start(config, due)
    # The caches' host directories, every deploy (docker would create a missing one itself,
    # but gpubox does not leave that to it).
    missing = host.get_fact(CommandOutput, command=missing_dirs_command(cache_dirs())).split()
    if missing:
        server.shell(
            name="vLLM cache directories on the host",
            commands=["mkdir -p " + " ".join(q(d) for d in missing)],
        )
    key = serving.api_key(config)
    unit = managed.put("vLLM unit", path)
    restart = units.changed(unit, model_change, key, stopped=not running)

    cuda = vllm_rules.image_info(config.catalog["vllm"]).cuda
    if vllm_rules.needs_forward_compat(cuda, config.branch):
        server.shell(
            name=f"{image} carries CUDA {cuda}'s forward-compatibility libraries",
            commands=[
                compat_check_command(image, str(cuda), str(vllm_rules.driver_cuda(config.branch)))
            ],
            _if=lambda: not present or restart(),
        )
    serving.start(
        config,
        layout.VLLM,
        "vLLM",
        unit,
        model_change,
        key,
        running=running,
        restart_name="(Re)start vLLM",
        health_name="Wait for vLLM's /health",
    )
    warm_up(
        name="Warm-up requests",
        port=config.api_port,
        alias=config.model_alias,
        api_key_file=config.api_key_file,
        lengths=warm_up_lengths(config.model_ctx),
        parallel=config.model_parallel,
        _if=restart,
    )
