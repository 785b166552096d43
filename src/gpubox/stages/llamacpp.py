"""The llama.cpp backend: llama-server, built on the box for its GPUs (the default on Volta;
the build, from a pinned source, all or nothing, is gpubox.stages.llamacpp_build), run by a
systemd unit as the system user llama; its flags, checked against the build's --help."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from pyinfra import host
from pyinfra.operations import server

from gpubox.base import layout
from gpubox.base.rendering import render
from gpubox.config import HostConfig
from gpubox.infra.host_facts import CommandOutput
from gpubox.infra.operations import ManagedFiles
from gpubox.ops import serving, units
from gpubox.plans import llamacpp as plan_llamacpp
from gpubox.plans.model import plan as model_plan
from gpubox.stages import llamacpp_build


def llama_args(config: HostConfig, model_path: str) -> list[str]:
    sampling = config.catalog["models"][config.model]["sampling"]
    args = [
        "-m", model_path,
        "--alias", config.model_alias,
        "--host", config.api_host,
        "--port", str(config.api_port),
        # Every slot its whole context, at once: without the unified KV cache llama.cpp gives
        # each of the -np slots -c / -np tokens of its own, so no request is longer than
        # model_ctx and model_parallel requests of model_ctx each fit side by side; one more
        # request waits for a free slot. -no-kvu is explicit: llama-server turns the unified
        # cache on by itself when the slot count is automatic.
        "-c", str(config.model_ctx * config.model_parallel),
        "-np", str(config.model_parallel),
        "-no-kvu",
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


NOLOGIN = "/usr/sbin/nologin"


def service_user_in_place() -> bool:
    """Whether the llama user is there as server.user would leave it (a system account with
    its home and no login shell), read with one getent; pyinfra's Users fact, which
    server.user reads, lists every account with its groups (the no-op's slowest fact)."""
    q = shlex.quote
    line = host.get_fact(
        CommandOutput,
        command=f"getent passwd {q(layout.LLAMA_USER)} && test -d {q(layout.LLAMA_HOME)} "
        "&& echo home; true",
    ).strip()
    fields = line.splitlines()[0].split(":") if line else []
    return (
        len(fields) == 7
        and line.endswith("\nhome")
        and fields[2].isdigit()
        and int(fields[2]) < 1000
        and fields[5] == layout.LLAMA_HOME
        and fields[6] == NOLOGIN
    )


def llamacpp(config: HostConfig, wait_for_model: Callable[[], Any]) -> None:
    """llama.cpp built, then the model waited for (its download runs in the background while
    the build does), then llama-server (re)started when either changed."""
    build = llamacpp_build.build(config)
    model_change = wait_for_model()
    b = plan_llamacpp.llama_build(config)
    if not service_user_in_place():
        server.user(
            name="System user llama",
            user=layout.LLAMA_USER,
            system=True,
            home=layout.LLAMA_HOME,
            shell=NOLOGIN,
            create_home=True,
        )
    key = serving.api_key(config)
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
        user=layout.LLAMA_USER,
    )
    unit_path = layout.unit_file(layout.LLAMA_SERVER)
    unit = ManagedFiles({unit_path: unit_text}).put("llama-server unit", unit_path)
    server.shell(
        name="Check the flags against llama-server --help",
        commands=[flag_check_command(b.binary, args, config.llamacpp_split_mode)],
        _if=units.changed(build, unit, model_change, key),
    )
    serving.start(
        config,
        layout.LLAMA_SERVER,
        "llama-server",
        unit,
        build,
        model_change,
        key,
        running=serving.is_running(layout.LLAMA_SERVER),
        restart_name="(Re)start llama-server (not running, or binary, model or flags changed)",
        health_name="Wait for the API's /health",
    )
