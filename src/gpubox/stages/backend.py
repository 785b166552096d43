"""Stage: the OpenAI-compatible API: llama.cpp built on the box for its GPUs (the default on
Volta) or vLLM in Docker, serving the configured model with an API key. Switching the backend
stops and disables the other one. llama.cpp's build (pinned source, all or nothing) is
llamacpp_build.py; here are its server's flags and unit."""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, deploy, operation
from pyinfra.operations import server, systemd

from gpubox.config import HostConfig
from gpubox.facts import CommandOutput
from gpubox.stages import ManagedFiles, current_config, llamacpp_build, render
from gpubox.stages.llamacpp_build import BUILD_FILES as BUILD_FILES
from gpubox.stages.llamacpp_build import BUILD_INFO as BUILD_INFO
from gpubox.stages.llamacpp_build import LlamaBuild as LlamaBuild
from gpubox.stages.llamacpp_build import build_commands as build_commands
from gpubox.stages.llamacpp_build import llama_build as llama_build
from gpubox.stages.model import model as model_stage
from gpubox.stages.model import plan as model_plan

LLAMA_UNIT = "gpubox-llama-server"
VLLM_UNIT = "gpubox-vllm"


def llama_args(config: HostConfig, model_path: str) -> list[str]:
    sampling = config.catalog["models"][config.model]["sampling"]
    args = [
        "-m", model_path,
        "--alias", config.model_alias,
        "--host", config.api_host,
        "--port", str(config.api_port),
        "-c", str(config.model_ctx),
        "-np", str(config.model_parallel),
        # one KV cache shared by the slots: each may use all of -c, and a slot costs no memory
        "-kvu",
        "-ngl", "999",  # every layer on the GPUs
        "-sm", config.llamacpp_split_mode,
        "-ts", ",".join(["1"] * config.gpu_count),
        "-fa", "on",
        "--jinja",
        "--reasoning-format", "deepseek",
        "--temp", str(sampling["temp"]),
        "--top-p", str(sampling["top_p"]),
        "--top-k", str(sampling["top_k"]),
        "--min-p", str(sampling["min_p"]),
        "--api-key-file", "${CREDENTIALS_DIRECTORY}/api-key",
        "--metrics",
    ]  # fmt: skip
    if config.llamacpp_split_mode == "tensor":
        # the tensor split runs only with an f16 KV cache (and -fa on, an explicit -c)
        args += ["-ctk", "f16", "-ctv", "f16"]
    return args + [str(a) for a in config.llamacpp_extra_args]


def llama_environment(config: HostConfig) -> list[str]:
    """The unit's Environment= lines. The tensor split copies activations between the GPUs
    at every layer; ggml's CUDA backend turns peer access (NVLink) on only when
    GGML_CUDA_P2P is set."""
    return ["GGML_CUDA_P2P=1"] if config.llamacpp_split_mode == "tensor" else []


def flag_check_command(binary: str, args: list[str], split_mode: str = "layer") -> str:
    """Fail with the flags `llama-server --help` does not know (they change between tags),
    or when its -sm does not offer ``split_mode``."""
    flags = sorted({a for a in args if a.startswith("-") and not a[1:2].isdigit()})
    mode = shlex.quote(split_mode)
    return (
        f"help=$({binary} --help 2>&1); missing=; for f in {' '.join(flags)}; do "
        'echo "$help" | grep -qE -- "(^|[ ,])$f([ ,=]|$)" || missing="$missing $f"; done; '
        'if [ -n "$missing" ]; then echo "gpubox: this llama-server does not know:$missing '
        '(llama.cpp flags change between tags)" >&2; exit 1; fi; '
        f'if ! echo "$help" | grep -- "--split-mode" | grep -qw -- {mode}; then '
        f'echo "gpubox: this llama-server offers no -sm {split_mode}" >&2; exit 1; fi'
    )


@operation(is_idempotent=False)
def wait_for_health(port: int, unit: str, timeout: int):
    """Wait until the API answers /health with 200 (model loading takes minutes)."""

    def _wait(state, host) -> None:
        import time

        from gevent import sleep

        start = time.monotonic()
        last = start
        while time.monotonic() - start < timeout:
            _, out = host.run_shell_command(
                f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health || true"
            )
            code = "".join(out.stdout_lines).strip()
            if code == "200":
                logger.info(f"{host.name}: {unit} healthy after {time.monotonic() - start:.0f}s")
                return
            if time.monotonic() - last > 15:
                logger.info(
                    f"{host.name}: waiting for {unit} (/health {code or 'no answer'}, "
                    f"{time.monotonic() - start:.0f}s)"
                )
                last = time.monotonic()
            sleep(1)
        _, out = host.run_shell_command(f"journalctl -u {unit} -n 30 --no-pager")
        raise OperationError(
            f"{unit} did not answer /health within {timeout}s (health_timeout); its last log "
            "lines:\n" + "\n".join(out.stdout_lines)
        )

    yield FunctionCommand(_wait, (), {})


def api_key(config: HostConfig):
    """A key generated on the box at the first deploy, root-only; never in the repository."""
    q = shlex.quote(config.api_key_file)
    present = host.get_fact(CommandOutput, command=f"test -s {q} && echo yes").strip()
    if present == "yes":
        return None
    return server.shell(
        name=f"Generate the API key ({config.api_key_file}, root only)",
        commands=[
            f"mkdir -p $(dirname {q}) && umask 077 && "
            f"head -c 32 /dev/urandom | base64 | tr -d '/+=\\n' > {q} && chmod 600 {q}"
        ],
    )


def stop_other(unit: str) -> None:
    present = host.get_fact(
        CommandOutput, command=f"systemctl list-unit-files {unit}.service --no-legend"
    ).strip()
    if present:
        systemd.service(
            name=f"Stop and disable {unit} (another backend is configured)",
            service=unit,
            running=False,
            enabled=False,
        )


def llamacpp(config: HostConfig, model_change) -> None:
    build = llamacpp_build.build(config)
    b = llama_build(config)
    server.user(
        name="System user llama",
        user="llama",
        system=True,
        home="/var/lib/llama",
        shell="/usr/sbin/nologin",
        create_home=True,
    )
    key = api_key(config)
    args = llama_args(config, model_plan(config).path)
    unit_text = render(
        "llama-server.service.j2",
        tag=b.tag,
        commit=b.short_commit,
        environment=llama_environment(config),
        model_file=model_plan(config).file,
        alias=config.model_alias,
        binary=b.binary,
        args=" ".join(shlex.quote(a) if "$" not in a else a for a in args),
        api_key_file=config.api_key_file,
    )
    unit_path = f"/etc/systemd/system/{LLAMA_UNIT}.service"
    unit = ManagedFiles({unit_path: unit_text}).put("llama-server unit", unit_path)
    changed = [c for c in (build, unit, model_change, key) if c is not None]

    def any_change() -> bool:
        return any(c.did_change() for c in changed)

    server.shell(
        name="Check the flags against llama-server --help",
        commands=[flag_check_command(b.binary, args, config.llamacpp_split_mode)],
        _if=any_change,
    )
    systemd.daemon_reload(name="Reload systemd units (llama-server)", _if=unit.did_change)
    systemd.service(name="llama-server enabled", service=LLAMA_UNIT, enabled=True)
    running = (
        host.get_fact(CommandOutput, command=f"systemctl is-active {LLAMA_UNIT}").strip()
        == "active"
    )
    systemd.service(
        name="(Re)start llama-server (not running, or binary, model or flags changed)",
        service=LLAMA_UNIT,
        restarted=True,
        _if=lambda: (not running) or any_change(),
    )
    wait_for_health(
        name="Wait for the API's /health",
        port=config.api_port,
        unit=LLAMA_UNIT,
        timeout=config.health_timeout,
        _if=lambda: (not running) or any_change(),
    )


@deploy("Backend")
def backend() -> None:
    config = current_config()
    if config.backend == "none":
        stop_other(LLAMA_UNIT)
        stop_other(VLLM_UNIT)
        return
    model_change = model_stage()
    if config.backend == "llamacpp":
        stop_other(VLLM_UNIT)
        llamacpp(config, model_change)
    else:
        stop_other(LLAMA_UNIT)
        from gpubox.stages.vllm import vllm

        vllm(config, model_change)
