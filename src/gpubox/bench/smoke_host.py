"""`gpubox bench --smoke` on one host: the prompts measured and judged, and for vLLM the
sequence that stops the deployed unit, runs each configuration as its own container, and
starts the unit again however the run ends (an error, a configuration that does not start,
Ctrl-C). If the connection is lost for good, the unit stays stopped: start it with
`sudo systemctl start gpubox-vllm`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpubox.bench.client import Endpoint, stream_request
from gpubox.bench.health import (
    Clock,
    Say,
    Sleep,
    health_command,
    restore_unit,
    wait_healthy,
)
from gpubox.bench.metrics import tpot
from gpubox.bench.smoke import CONTAINER, ENV_FILE, MAX_TOKENS, Plan, Row
from gpubox.checks import Runner
from gpubox.knowledge import answer_sanity
from gpubox.knowledge.openai_shape import Answer

WARM_UP_TOKENS = 16
LOG_TAIL = 20  # lines of a failed container's log brought back
Measure = Callable[[Row], None]


@dataclass
class HostSmoke:
    name: str
    backend: str
    rows: list[Row] = field(default_factory=list)
    error: str | None = None  # nothing could be measured
    restart_error: str | None = None  # the deployed unit is not back
    interrupted: bool = False


def measure(endpoint: Endpoint, row: Row, max_tokens: int = MAX_TOKENS) -> None:
    """One unmeasured request, then both prompts, streamed one after the other: TTFT of
    each, the decode speed (1 / TPOT, the mean of the two; llama.cpp's own figure beside it),
    and what is wrong with an answer (gpubox.knowledge.answer_sanity)."""
    speeds, server = [], []
    # one request first, not counted: a fresh vLLM compiles kernels on its first requests
    # (the deploy's warm-up does that for the unit; the smoke containers have none)
    stream_request(endpoint, answer_sanity.SHORT, WARM_UP_TOKENS, ignore_eos=False)
    for which, prompt in answer_sanity.PROMPTS.items():
        result, _, _ = stream_request(endpoint, prompt, max_tokens, ignore_eos=False)
        if not result.ok:
            row.problems.append(f"the {which} prompt failed: {result.error}")
            continue
        ttft_ms = None if result.ttft is None else result.ttft * 1000
        if which == "short":
            row.short_ttft_ms = ttft_ms
        else:
            row.long_ttft_ms = ttft_ms
        if result.server_decode_tps:
            server.append(result.server_decode_tps)
        per_token = tpot(result)
        if per_token:
            speeds.append(1 / per_token)
        answer = Answer(
            content=result.content,
            reasoning=result.reasoning,
            finish_reason=result.finish_reason,
            streamed=True,
            done=True,
        )
        problem = answer_sanity.answer_problem(answer)
        if problem:
            row.problems.append(f"the {which} prompt's answer {problem}")
    row.decode_tps = statistics.fmean(speeds) if speeds else None
    row.server_tps = statistics.fmean(server) if server else None


def state_command() -> str:
    """The smoke container's state ("running", "exited 1"), "gone" when there is none."""
    return (
        f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {CONTAINER} "
        "2>/dev/null || echo gone"
    )


def remove_command() -> str:
    return f"docker rm -f {CONTAINER} >/dev/null 2>&1; rm -f {ENV_FILE}; true"


def _container_gone(run: Runner) -> Callable[[], str | None]:
    """Why the smoke container will never answer: it stopped (with its log's last lines)."""

    def gone() -> str | None:
        state = run(state_command()).stdout.strip()
        if state.startswith("running"):
            return None
        log = run(f"docker logs --tail {LOG_TAIL} {CONTAINER} 2>&1").stdout.strip()
        tail = " | ".join(log.splitlines()[-3:]) or "no log"
        return f"the container stopped ({state}) before /health answered: {tail}"

    return gone


def restore(
    run: Runner, plan: Plan, was_running: bool, say: Say, sleep: Sleep, clock: Clock
) -> str | None:
    """Remove the smoke container, start the deployed unit again when it was running, wait for
    its /health; None, or why it is not back."""
    return restore_unit(run, plan, plan.unit, remove_command(), was_running, say, sleep, clock)


def smoke_host(
    run: Runner,
    plan: Plan,
    measure_row: Measure,
    say: Say,
    sleep: Sleep = time.sleep,
    clock: Clock = time.monotonic,
) -> HostSmoke:
    """llama.cpp: the served configuration measured. vLLM: the unit stopped, each
    configuration started, awaited, measured and removed, the unit started again in any case."""
    result = HostSmoke(plan.name, plan.backend)
    try:
        state = run(f"systemctl is-active {plan.unit}").stdout.strip() or "unknown"
    except Exception as exc:
        result.error = f"cannot reach {plan.name}: {exc}"
        return result
    if plan.backend != "vllm":
        why = run(health_command(plan)).stdout.strip()
        if why != "200":
            result.error = (
                f"{plan.unit} is {state} and /health answers {why or 'nothing'}: deploy first"
            )
            return result
        row = Row("served", "(as deployed)")
        say(f"{plan.name}: the served {plan.backend}: the short and the long prompt")
        measure_row(row)
        result.rows.append(row)
        return result
    was_running = state in ("active", "activating", "reloading")
    if was_running:
        say(
            f"{plan.name}: stopping {plan.unit} for the smoke test (it holds the GPUs); it is "
            "started again afterwards, however the run ends"
        )
    try:
        if was_running:
            out = run(f"systemctl stop {plan.unit}")
            if out.rc != 0:
                result.error = f"systemctl stop {plan.unit} failed: {out.first_error_line()}"
                return result
        for number, variant in enumerate(plan.variants, 1):
            row = Row(variant.name, variant.flags, variant.enforce_eager, variant.mamba_float32)
            result.rows.append(row)
            say(
                f"{plan.name}: configuration {number} of {len(plan.variants)}: vLLM with "
                f"{variant.flags}"
            )
            out = run(variant.start)
            if out.rc != 0:
                row.error = f"docker run failed: {out.first_error_line()}"
            else:
                row.error = wait_healthy(
                    run, plan, CONTAINER, say, sleep, clock, gone=_container_gone(run)
                )
            if row.error is None:
                measure_row(row)
            run(remove_command())
    except KeyboardInterrupt:
        result.interrupted = True
        result.error = "interrupted"
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.restart_error = restore(run, plan, was_running, say, sleep, clock)
    return result
