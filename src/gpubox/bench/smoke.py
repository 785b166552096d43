"""`gpubox bench --smoke INVENTORY`: the first run on a box, which server flags to keep.

For vLLM it starts the server in four configurations, one at a time: with and without
``--enforce-eager`` (CUDA graphs off or on), with ``--mamba-ssm-cache-dtype float32`` (the
recurrent state of Qwen3-Next's gated-delta-net layers kept in float32 rather than the
``--dtype half`` the unit runs) and without. Each is the deployed unit's own ``docker run``
(gpubox.stages.vllm.docker_argv: image, volumes, caches, key file) with those two flags
varied, run as the container gpubox-vllm-smoke while gpubox-vllm is stopped. For each, once
/health answers (progress lines while it loads), it sends gpubox.knowledge.answer_sanity's short
and long
prompts as streamed chat completions and measures the time to the first token and the decode
speed; an answer that is not text (empty, ``!!!!!``, control bytes) marks the configuration
failed. Then the deployed unit is started again, however the run ends, and /health awaited.
It prints a table, the configuration to keep (the fastest decode among those that answered
text) and the inventory keys that select it.

For llama.cpp nothing of the kind varies: it measures the served configuration as it is.

This module holds the plan (read in a child process, as llamabench does: the stages import
pyinfra, whose CLI patches threads with gevent), the choice and the table; the run on the box
is gpubox.bench.smoke_host.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from gpubox import config
from gpubox.base import layout
from gpubox.bench.client import BenchError
from gpubox.checks.facts import api_base
from gpubox.plans import vllm as stage
from gpubox.remote import inventory

CONTAINER = "gpubox-vllm-smoke"
ENV_FILE = "/run/gpubox-vllm-smoke.env"  # root only (umask 077), removed at the end
EAGER = "--enforce-eager"
MAMBA = "--mamba-ssm-cache-dtype"
# per prompt: enough decode to time (about 22 s at the 11.7 tok/s of the first user's vLLM)
MAX_TOKENS = 256
INVENTORY_KEYS = ("api_host", "api_port", "api_key_file", "model_alias")


@dataclass
class Variant:
    """One vLLM configuration: the two flags, and the command that starts it on the box."""

    enforce_eager: bool
    mamba_float32: bool
    start: str = ""

    @property
    def name(self) -> str:
        return (
            f"{'eager' if self.enforce_eager else 'graphs'}, "
            f"ssm {'float32' if self.mamba_float32 else 'half'}"
        )

    @property
    def flags(self) -> str:
        words = ([EAGER] if self.enforce_eager else []) + (
            [MAMBA, "float32"] if self.mamba_float32 else []
        )
        return " ".join(words) or "(neither)"


@dataclass
class Plan:
    """What the smoke test needs of one host, from the same HostConfig the deploy uses."""

    name: str
    error: str | None = None
    backend: str = ""
    unit: str = ""
    ssh_config: str = ""
    sudo: bool = False
    health_url: str = ""  # as reached on the box
    health_timeout: int = 1800
    api_key_file: str = ""
    deployed_eager: bool = False
    deployed_mamba: str = "auto"  # vllm_mamba_ssm_cache_dtype
    variants: list[Variant] = field(default_factory=list)  # vLLM's four; none for llama.cpp
    data: dict[str, Any] = field(default_factory=dict)  # ssh_* and the API's keys (the tunnel)


def variant_args(args: list[str], enforce_eager: bool, mamba_float32: bool) -> list[str]:
    """vLLM's arguments with the two flags set as asked (whatever ``args`` had)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == MAMBA:
            skip = True
        elif arg != EAGER and not arg.startswith(MAMBA + "="):
            out.append(arg)
    return out + ([EAGER] if enforce_eager else []) + ([MAMBA, "float32"] if mamba_float32 else [])


def variant_argv(docker: list[str], args: list[str], eager: bool, mamba: bool) -> list[str]:
    """The unit's ``docker run`` (``docker``, ending with vLLM's ``args``) as the smoke
    container: detached, kept after it exits (its log says why), its own name and key file."""
    if docker[-len(args) :] != args:
        raise ValueError("the unit's docker run does not end with vLLM's arguments")
    head = docker[: -len(args)]
    out: list[str] = []
    words = iter(head)
    for word in words:
        if word == "--rm":
            continue
        out.append(word)
        if word == "--name":
            next(words)
            out.append(CONTAINER)
        elif word == "--env-file":
            next(words)
            out.append(ENV_FILE)
    out.insert(out.index("run") + 1, "-d")
    return out + variant_args(args, eager, mamba)


def start_command(argv: list[str], api_key_file: str) -> str:
    """Write the smoke container's key file from the key file (sed reads it: the key is on no
    command line), remove an old smoke container, start this one."""
    q = shlex.quote
    return (
        f"umask 077 && sed -n '1s/^/VLLM_API_KEY=/p' {q(api_key_file)} > {ENV_FILE} && "
        f"{{ docker rm -f {CONTAINER} >/dev/null 2>&1; true; }} && " + " ".join(q(a) for a in argv)
    )


def host_plan(name: str, data: dict[str, Any]) -> Plan:
    """One host's plan (run in the child process)."""
    try:
        cfg = config.load_host_config(name, data)
    except config.ConfigError as exc:
        return Plan(name, error=" ".join(str(exc).split()))
    if cfg.backend == "none":
        return Plan(name, error="backend is none: nothing is served")
    keys = {k: getattr(cfg, k) for k in INVENTORY_KEYS}
    ssh = {k: v for k, v in data.items() if k.startswith("ssh_") or k == "_sudo"}
    plan = Plan(
        name=name,
        backend=cfg.backend,
        unit=layout.BACKEND_UNITS[cfg.backend],
        ssh_config=inventory.ssh_config_entry(name, data),
        sudo=inventory.uses_sudo(data),
        health_url=f"{api_base(cfg)}/health",
        health_timeout=int(cfg.health_timeout),
        api_key_file=cfg.api_key_file,
        deployed_eager=bool(getattr(cfg, "vllm_enforce_eager", False)),
        deployed_mamba=str(getattr(cfg, "vllm_mamba_ssm_cache_dtype", "auto")),
        data={**ssh, **keys},
    )
    if cfg.backend == "vllm":
        docker, args = stage.docker_argv(cfg), stage.vllm_args(cfg)
        plan.variants = [
            Variant(
                eager,
                mamba,
                start_command(variant_argv(docker, args, eager, mamba), cfg.api_key_file),
            )
            for eager in (False, True)
            for mamba in (False, True)
        ]
    return plan


def plans_json(path: str) -> str:
    """Every host's plan as JSON (the child process prints it)."""
    return inventory.plans_json(path, host_plan)


def load_plans(path: str) -> list[Plan]:
    try:
        raw = inventory.plans_in_child(__name__, path)
    except inventory.InventoryError as exc:
        raise BenchError(f"cannot read {path}: {exc}") from None
    plans = []
    for p in raw:
        p["variants"] = [Variant(**v) for v in p["variants"]]
        plans.append(Plan(**p))
    return plans


# --- the figures, the choice, the table -----------------------------------------------------


@dataclass
class Row:
    """One configuration's outcome: it did not start (``error``), or its figures and what was
    wrong with its answers (``problems``)."""

    name: str
    flags: str
    enforce_eager: bool | None = None  # None: llama.cpp's served configuration
    mamba_float32: bool | None = None
    short_ttft_ms: float | None = None
    long_ttft_ms: float | None = None
    decode_tps: float | None = None
    server_tps: float | None = None  # llama.cpp's own figure (timings), None for vLLM
    problems: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def sane(self) -> bool:
        return self.error is None and not self.problems

    @property
    def verdict(self) -> str:
        if self.error:
            return "did not start"
        return "text" if self.sane else "GARBAGE" if self.garbage else "failed"

    @property
    def garbage(self) -> bool:
        return any(" prompt's answer " in p for p in self.problems)


def keep(rows: list[Row]) -> Row | None:
    """The fastest configuration (decode tok/s, then the long prompt's TTFT) among those that
    answered both prompts with text; None when none did."""
    sane = [r for r in rows if r.sane]
    if not sane:
        return None
    return max(sane, key=lambda r: (r.decode_tps or 0.0, -(r.long_ttft_ms or float("inf"))))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _tps(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(host: str, backend: str, rows: list[Row]) -> str:
    """The rows side by side, then each failure's reason."""
    header = (
        "configuration",
        "flags",
        "answers",
        "TTFT short",
        "TTFT long",
        "decode tok/s",
        "server's tok/s",
    )
    lines = [header] + [
        (
            r.name,
            r.flags,
            r.verdict,
            _ms(r.short_ttft_ms),
            _ms(r.long_ttft_ms),
            _tps(r.decode_tps),
            _tps(r.server_tps),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = [f"smoke test of {host} ({backend}):"]
    for line in lines:
        text.append(
            "  " + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        )
    for r in rows:
        for why in ([r.error] if r.error else []) + r.problems:
            text.append(f"  {r.name}: {why}")
    return "\n".join(text)


def advice(
    plan_backend: str, deployed_eager: bool, rows: list[Row], deployed_mamba: str = "auto"
) -> str:
    """Which configuration to keep, and the inventory keys that select it."""
    best = keep(rows)
    if best is None:
        return (
            "keep: none -- no configuration answered both prompts with text; see the reasons "
            "above (docs/tools.md: the first-run smoke test)"
        )
    if best.enforce_eager is None:
        return f"keep: {best.name} (the deployed configuration; nothing to set)"
    lines = [f"keep: {best.name} ({best.flags}, {_tps(best.decode_tps)} tok/s)"]
    eager = "True" if best.enforce_eager else "False"
    change = " (the deployed value)" if best.enforce_eager == deployed_eager else ""
    lines.append(f'  set in the inventory: "vllm_enforce_eager": {eager}{change}')
    mamba = "float32" if best.mamba_float32 else "auto"
    change = " (the deployed value)" if mamba == deployed_mamba else ""
    lines.append(f'  set in the inventory: "vllm_mamba_ssm_cache_dtype": "{mamba}"{change}')
    return "\n".join(lines)
