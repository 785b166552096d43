"""llama-bench on one host: its command line per split mode, the commands run on the box (the
run in a process group of its own, its pid kept in a file; the cleanup of an interrupted run;
the preflight; the /health probe), and the sequence that stops gpubox-llama-server, runs each
mode and starts the server again however the run ends."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from gpubox.base import layout
from gpubox.bench.health import Clock, Say, Sleep, restore_unit
from gpubox.bench.llamabench_results import (
    N_GEN,
    N_PROMPT,
    PP,
    REPETITIONS,
    RUN_TIMEOUT,
    TG,
    HostResult,
    ModeResult,
    error_text,
    mode_result,
)
from gpubox.checks import Runner

ERROR_TAIL = 4000  # bytes of llama-bench's stderr brought back


@dataclass
class Plan:
    """What the llama-bench run needs of one host, resolved from its inventory data."""

    name: str
    error: str | None = None
    ssh_config: str = ""  # its ssh_config block
    sudo: bool = False
    binary: str = ""  # .../bin/llama-bench
    model: str = ""  # the served model file
    split_mode: str = "layer"
    gpu_count: int = 1
    cuda: bool = True
    health_url: str = ""  # as reached on the box
    health_timeout: int = 1800
    url: str = ""  # the endpoint `gpubox bench --inventory` benches (its record's key)
    ssh: dict[str, Any] = field(default_factory=dict)  # the host's ssh_* data (reach.probe)


def argv_for(plan: Plan, mode: str, verbose: bool = False) -> list[str]:
    """llama-bench's command line for one split mode (flags as its usage text names them).
    ``verbose``: once, with llama.cpp's log (-v), to learn why a mode failed: without -v
    llama-bench silences the library's log, and a refused model says only "failed to load
    model"; the log is left out of the measured runs."""
    argv = [
        plan.binary,
        "-m", plan.model,
        "-p", str(N_PROMPT),
        "-n", str(N_GEN),
        "-ngl", "999",
        "-fa", "on",
        "-sm", mode,
        "-r", "1" if verbose else str(REPETITIONS),
        "-o", "json",
    ]  # fmt: skip
    if plan.cuda and plan.gpu_count > 1:
        # the server's -ts 1,1: llama-bench separates one test's GPUs with "/", tests with ","
        argv += ["-ts", "/".join(["1"] * plan.gpu_count)]
    if mode == "tensor":
        argv += ["-ctk", "f16", "-ctv", "f16"]
    return argv + (["-v"] if verbose else [])


def env_for(mode: str) -> dict[str, str]:
    """The environment a mode needs; the tensor split wants peer access between the GPUs."""
    return {"GGML_CUDA_P2P": "1"} if mode == "tensor" else {}


def run_command(plan: Plan, mode: str, verbose: bool = False) -> str:
    """One llama-bench run on the box: JSON on stdout, the tail of its stderr on stderr (a
    failing model load says why there), its exit status; bounded by timeout(1), in a process
    group of its own whose id is kept in layout.LLAMA_BENCH_PIDFILE for ``cleanup_command``."""
    q = shlex.quote
    env = " ".join(f"{k}={q(v)}" for k, v in env_for(mode).items())
    cmd = " ".join(q(a) for a in argv_for(plan, mode, verbose))
    pidfile = layout.LLAMA_BENCH_PIDFILE
    return (
        f"e=$(mktemp); setsid env {env + ' ' if env else ''}timeout {RUN_TIMEOUT} {cmd} "
        f'</dev/null 2>"$e" & p=$!; echo "$p" > {pidfile}; wait "$p"; rc=$?; rm -f {pidfile}; '
        f'tail -c {ERROR_TAIL} "$e" >&2; rm -f "$e"; exit "$rc"'
    )


def cleanup_command() -> str:
    """End a llama-bench run still going on the box (an interrupted one): its process group,
    named by layout.LLAMA_BENCH_PIDFILE, only while that process is still a llama-bench run;
    TERM, then KILL after up to 30 s."""
    return (
        f"p=$(cat {layout.LLAMA_BENCH_PIDFILE} 2>/dev/null); "
        'if [ -n "$p" ] && grep -qa llama-bench "/proc/$p/cmdline" 2>/dev/null; then '
        'kill -TERM "-$p" 2>/dev/null; i=0; '
        'while kill -0 "$p" 2>/dev/null && [ "$i" -lt 30 ]; do sleep 1; i=$((i+1)); done; '
        'kill -KILL "-$p" 2>/dev/null; fi; '
        f"rm -f {layout.LLAMA_BENCH_PIDFILE}; true"
    )


def preflight_command(plan: Plan) -> str:
    q = shlex.quote
    return (
        f"if [ -x {q(plan.binary)} ]; then echo binary=yes; else echo binary=no; fi; "
        f"if [ -r {q(plan.model)} ]; then echo model=yes; else echo model=no; fi; "
        f'echo "active=$(systemctl is-active {layout.LLAMA_SERVER})"'
    )


def restore(
    run: Runner,
    plan: Plan,
    was_running: bool,
    say: Say,
    sleep: Sleep = time.sleep,
    clock: Clock = time.monotonic,
) -> str | None:
    """End any llama-bench run left on the box, start the server again (when it was running
    before) and wait for its /health; None, or why the server is not back."""
    return restore_unit(
        run, plan, layout.LLAMA_SERVER, cleanup_command(), was_running, say, sleep, clock
    )


def run_mode(run: Runner, plan: Plan, mode: str, say: Say) -> ModeResult:
    """One mode's figures; a failed mode (not a timeout) runs once more with llama.cpp's log,
    whose error lines are the reason reported."""
    result = mode_result(mode, run(run_command(plan, mode)))
    if result.ok or not result.error or result.error.startswith("timed out"):
        return result
    say(f"{plan.name}: -sm {mode} failed; once more with -v, for llama.cpp's reason")
    again = run(run_command(plan, mode, verbose=True))
    if again.rc != 0:
        result.error = error_text(again)
    return result


def bench_host(
    run: Runner,
    plan: Plan,
    modes: list[str],
    say: Say,
    sleep: Sleep = time.sleep,
    clock: Clock = time.monotonic,
) -> HostResult:
    """Stop the server, run llama-bench once per mode, start the server again in any case."""
    unit = layout.LLAMA_SERVER
    result = HostResult(plan.name, plan.split_mode)
    try:
        pre = run(preflight_command(plan))
    except Exception as exc:
        result.error = f"cannot reach {plan.name}: {exc}"
        return result
    facts = dict(ln.split("=", 1) for ln in pre.stdout.splitlines() if "=" in ln)
    if facts.get("binary") != "yes":
        result.error = (
            f"no llama-bench at {plan.binary}: deploy again (gpubox builds it beside llama-server)"
        )
        return result
    if facts.get("model") != "yes":
        result.error = f"the model file {plan.model} is not there: deploy first"
        return result
    state = facts.get("active", "unknown")
    was_running = state in ("active", "activating", "reloading")
    if was_running:
        say(
            f"{plan.name}: stopping {unit} for llama-bench (it holds the GPU memory); it is "
            "started again afterwards, however the run ends"
        )
    try:
        if was_running:
            out = run(f"systemctl stop {unit}")
            result.stopped = out.rc == 0
            if out.rc != 0:
                result.error = f"systemctl stop {unit} failed: {out.first_error_line()}"
        if result.error is None:
            for mode in modes:
                say(
                    f"{plan.name}: llama-bench -sm {mode}: {PP} and {TG}, {REPETITIONS} repetitions"
                )
                result.modes.append(run_mode(run, plan, mode, say))
    except KeyboardInterrupt:
        result.interrupted = True
        result.error = "interrupted"
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.restart_error = restore(run, plan, was_running, say, sleep, clock)
    return result
