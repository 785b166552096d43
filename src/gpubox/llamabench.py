"""`gpubox bench --inventory INV --llama-bench [--split-modes layer,row,tensor]`: llama.cpp's own
benchmark (llama-bench, built beside llama-server) on each host, beside the served figures.

llama-bench times the model alone, with no HTTP, tokenizer or sampling in the way: pp512 is
prompt processing of 512 tokens in one batch, tg128 the generation of 128 tokens one at a time
(the single-stream decode speed), each the mean of 3 repetitions after a warm-up run, in tokens
per second with their standard deviation. It runs on the served model file with the server's
settings: every layer on the GPUs (-ngl 999), FlashAttention on (-fa on), the host's
llamacpp_split_mode (-sm), the GPUs weighted evenly (-ts 1/1, llama-bench's separator is "/"),
and for the tensor split what it needs: an f16 KV cache (-ctk f16 -ctv f16) and
GGML_CUDA_P2P=1 (peer access between the GPUs), as in the server's unit.

The server holds the GPUs' memory (and on a CPU build the cores), so gpubox-llama-server is
stopped for the run and started again afterwards however the run ends (an error, a failed
mode, Ctrl-C), then /health is awaited. llama-bench runs in its own process group, its pid in
/run/gpubox-llama-bench.pid, so that an interrupted run is ended on the box before the server
starts again. If the connection is lost for good, the server stays stopped: start it with
`sudo systemctl start gpubox-llama-server`.

With --split-modes, each mode runs in turn and the mode with the fastest tg128 is the one to
set; a mode llama.cpp refuses (row or tensor on one GPU, tensor on a CPU build) is reported
as failed with llama-bench's own error.

The host's data is read in a child process (pyinfra's CLI patches threads with gevent, which
the served bench must not run under); commands reach the host over SSH with its inventory's
ssh_* data, through sudo where the inventory sets _sudo, the way `gpubox doctor` does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubox import bench
from gpubox.config import LLAMA_SPLIT_MODES as SPLIT_MODES

if TYPE_CHECKING:  # doctor imports pyinfra's API: not at `gpubox bench`'s start
    from gpubox.doctor import Output, Runner

UNIT = "gpubox-llama-server"  # the deploy's unit (stages/backend.py LLAMA_UNIT)
N_PROMPT = 512
N_GEN = 128
REPETITIONS = 3
RUN_TIMEOUT = 3600  # seconds per llama-bench run on the box (timeout(1))
PIDFILE = "/run/gpubox-llama-bench.pid"
ERROR_TAIL = 4000  # bytes of llama-bench's stderr brought back
HEALTH_POLL = 2.0
PROGRESS_EVERY = 15.0
Say = Callable[[str], None]
Sleep = Callable[[float], None]
Clock = Callable[[], float]


# ---------------------------------------------------------------- the host's plan


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


def host_plan(name: str, data: dict[str, Any]) -> Plan:
    """The plan of one host, from the same HostConfig the deploy uses (run in the child)."""
    from gpubox import config, doctor, inventory
    from gpubox.stages.llamacpp_build import llama_build
    from gpubox.stages.model import plan as model_plan

    try:
        cfg = config.load_host_config(name, data)
    except config.ConfigError as exc:
        return Plan(name, error=" ".join(str(exc).split()))
    if cfg.backend != "llamacpp":
        return Plan(name, error=f"backend is {cfg.backend}: llama-bench measures llama.cpp only")
    return Plan(
        name=name,
        ssh_config=inventory.ssh_config_entry(name, data),
        sudo=inventory.uses_sudo(data),
        binary=llama_build(cfg).bench,  # the deploy builds it beside llama-server
        model=model_plan(cfg).path,
        split_mode=cfg.llamacpp_split_mode,
        gpu_count=int(cfg.gpu_count),
        cuda=bool(cfg.llamacpp_cuda),
        health_url=f"http://{doctor._api_address(cfg)}:{cfg.api_port}/health",
        health_timeout=int(cfg.health_timeout),
        url=bench.host_url(name, data.get("ssh_hostname"), cfg.api_port),
    )


def plans_json(path: str) -> str:
    """Every host's plan as JSON (the child process prints it); exits with a one-line reason
    when the inventory cannot be read."""
    from gpubox import inventory

    try:
        hosts = inventory.load(path)
    except inventory.InventoryError as exc:
        sys.exit(str(exc))
    return json.dumps([asdict(host_plan(name, data)) for name, data in hosts])


_CHILD = "import sys\nfrom gpubox import llamabench\nprint(llamabench.plans_json(sys.argv[1]))\n"


def load_plans(path: str) -> list[Plan]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, path], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise bench.BenchError(f"cannot read {path}: {lines[-1] if lines else 'unknown error'}")
    return [Plan(**p) for p in json.loads(proc.stdout)]


# ---------------------------------------------------------------- commands run on the box


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
    group of its own whose id is kept in PIDFILE for ``cleanup_command``."""
    q = shlex.quote
    env = " ".join(f"{k}={q(v)}" for k, v in env_for(mode).items())
    cmd = " ".join(q(a) for a in argv_for(plan, mode, verbose))
    return (
        f"e=$(mktemp); setsid env {env + ' ' if env else ''}timeout {RUN_TIMEOUT} {cmd} "
        f'</dev/null 2>"$e" & p=$!; echo "$p" > {PIDFILE}; wait "$p"; rc=$?; rm -f {PIDFILE}; '
        f'tail -c {ERROR_TAIL} "$e" >&2; rm -f "$e"; exit "$rc"'
    )


def cleanup_command() -> str:
    """End a llama-bench run still going on the box (an interrupted one): its process group,
    named by PIDFILE, only while that process is still a llama-bench run; TERM, then KILL after
    up to 30 s."""
    return (
        f"p=$(cat {PIDFILE} 2>/dev/null); "
        'if [ -n "$p" ] && grep -qa llama-bench "/proc/$p/cmdline" 2>/dev/null; then '
        'kill -TERM "-$p" 2>/dev/null; i=0; '
        'while kill -0 "$p" 2>/dev/null && [ "$i" -lt 30 ]; do sleep 1; i=$((i+1)); done; '
        'kill -KILL "-$p" 2>/dev/null; fi; '
        f"rm -f {PIDFILE}; true"
    )


def preflight_command(plan: Plan) -> str:
    q = shlex.quote
    return (
        f"if [ -x {q(plan.binary)} ]; then echo binary=yes; else echo binary=no; fi; "
        f"if [ -r {q(plan.model)} ]; then echo model=yes; else echo model=no; fi; "
        f'echo "active=$(systemctl is-active {UNIT})"'
    )


def health_command(plan: Plan) -> str:
    return (
        "curl -s -o /dev/null --max-time 5 -w '%{http_code}' "
        + shlex.quote(plan.health_url)
        + " || true"
    )


# ---------------------------------------------------------------- llama-bench's output


def parse_json(text: str) -> list[dict[str, Any]]:
    """The test records of `llama-bench -o json` (a JSON array of objects). A run that died
    after some tests printed "[" and those objects but no "]": they are kept."""
    text = text.strip()
    if not text:
        return []
    for candidate in (text, text.rstrip(",") + "\n]"):
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, list):
            return [d for d in data if isinstance(d, dict)]
    return []


def name_of(record: dict[str, Any]) -> str:
    """llama-bench's own names: pp512, tg128, pp512+tg128, with " @ d<depth>"."""
    n_prompt = int(record.get("n_prompt") or 0)
    n_gen = int(record.get("n_gen") or 0)
    parts = ([f"pp{n_prompt}"] if n_prompt else []) + ([f"tg{n_gen}"] if n_gen else [])
    depth = int(record.get("n_depth") or 0)
    return "+".join(parts) + (f" @ d{depth}" if depth else "")


# the fields kept of each test record (llama-bench's names)
KEPT = (
    "avg_ts", "stddev_ts", "samples_ts", "n_prompt", "n_gen", "split_mode", "n_gpu_layers",
    "flash_attn", "type_k", "type_v", "tensor_split", "n_threads", "backends", "gpu_info",
    "model_type", "model_size", "model_n_params", "build_commit", "build_number", "test_time",
)  # fmt: skip


def figures(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each test by name, with the fields worth keeping."""
    return {name_of(r): {k: r[k] for k in KEPT if k in r} for r in records}


def error_text(out: Output) -> str:
    """llama-bench's reason for a failure in one line: the error lines of its stderr (the
    last three), else its last line; with the exit status."""
    lines = [ln.strip() for ln in out.stderr.splitlines() if ln.strip()]
    words = ("error", "failed", "not implemented", "requires", "needs", "abort", "assert")
    errors = [ln for ln in lines if any(w in ln.lower() for w in words)]
    chosen = errors[-3:] or lines[-1:]
    if out.rc == 124:
        status = f"timed out after {RUN_TIMEOUT} s"
    elif out.rc == 127:
        status = "not found (exit 127)"
    else:
        status = f"exit status {out.rc}"
    return status + (": " + " | ".join(chosen) if chosen else "")


@dataclass
class ModeResult:
    mode: str
    ok: bool
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None

    def ts(self, test: str) -> float | None:
        value = self.tests.get(test, {}).get("avg_ts")
        return float(value) if isinstance(value, int | float) else None


PP = f"pp{N_PROMPT}"
TG = f"tg{N_GEN}"


def mode_result(mode: str, out: Output) -> ModeResult:
    tests = figures(parse_json(out.stdout))
    if out.rc != 0:
        return ModeResult(mode, False, tests, error_text(out))
    missing = [t for t in (PP, TG) if t not in tests]
    if missing:
        return ModeResult(mode, False, tests, f"no {', '.join(missing)} in llama-bench's output")
    return ModeResult(mode, True, tests)


def _tg_std(result: ModeResult) -> float:
    value = result.tests.get(TG, {}).get("stddev_ts")
    return float(value) if isinstance(value, int | float) else 0.0


def fastest_mode(results: list[ModeResult]) -> ModeResult | None:
    """The mode with the fastest tg128 (the single-stream decode); the first of equals."""
    ran = [r for r in results if r.ok and r.ts(TG) is not None]
    return max(ran, key=lambda r: r.ts(TG) or 0.0) if ran else None


def best_mode(results: list[ModeResult], current: str | None = None) -> ModeResult | None:
    """The mode to set: the fastest, unless its lead over the ``current`` mode (the
    inventory's) is within the noise (no more than their two standard deviations together):
    a switch is not worth a difference the runs cannot tell apart."""
    fastest = fastest_mode(results)
    now = next((r for r in results if r.mode == current and r.ok and r.ts(TG)), None)
    if fastest is None or now is None or now is fastest:
        return fastest
    lead = (fastest.ts(TG) or 0.0) - (now.ts(TG) or 0.0)
    return now if lead <= _tg_std(fastest) + _tg_std(now) else fastest


def advice(results: list[ModeResult], current: str) -> str:
    """'set llamacpp_split_mode: row (tg128 80.1 tok/s vs layer 65.0, tensor failed) (now
    layer)'."""
    best = best_mode(results, current)
    if best is None:
        return f"no split mode ran: keep llamacpp_split_mode: {current}"
    others = [
        f"{r.mode} {r.ts(TG):.1f}" if r.ok and r.ts(TG) is not None else f"{r.mode} failed"
        for r in results
        if r is not best
    ]
    vs = f" vs {', '.join(others)}" if others else ""
    now = " (already set)" if best.mode == current else f" (now {current})"
    fastest = fastest_mode(results)
    if fastest is not None and fastest is not best:
        now += f"; {fastest.mode} is faster by less than the runs' noise"
    return f"set llamacpp_split_mode: {best.mode} (tg128 {best.ts(TG):.1f} tok/s{vs}){now}"


# ---------------------------------------------------------------- one host, stop/run/start


@dataclass
class HostResult:
    name: str
    split_mode: str  # the one the inventory sets
    modes: list[ModeResult] = field(default_factory=list)
    error: str | None = None  # nothing measured, or the run stopped early
    restart_error: str | None = None  # the server could not be brought back
    interrupted: bool = False
    stopped: bool = False  # the server was stopped for the run


@contextlib.contextmanager
def _deferred_interrupt(say: Say) -> Iterator[list[bool]]:
    """Ctrl-C waits until the block ends (the server's restart is not cut short); the list
    says whether one came."""
    pressed = [False]
    try:
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum: int, frame: Any) -> None:
            pressed[0] = True
            say(f"starting {UNIT} again first; it will not be left stopped")

        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: nothing to defer
        yield pressed
        return
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


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
    try:
        with _deferred_interrupt(say) as pressed:
            run(cleanup_command())
            if not was_running:
                say(f"{plan.name}: {UNIT} was not running before; it is left stopped")
                return None
            say(f"{plan.name}: starting {UNIT} again")
            out = run(f"systemctl start {UNIT}")
        if out.rc != 0:
            return f"systemctl start {UNIT} failed: {out.first_error_line()}"
        if pressed[0]:
            return f"{UNIT} started, /health not awaited (interrupted)"
        start = last = clock()
        while True:
            code = run(health_command(plan)).stdout.strip()
            if code == "200":
                say(f"{plan.name}: {UNIT} healthy again after {clock() - start:.0f} s")
                return None
            now = clock()
            if now - start >= plan.health_timeout:
                return (
                    f"{UNIT} did not answer /health within {plan.health_timeout} s "
                    f"(health_timeout): journalctl -u {UNIT} -n 50"
                )
            if now - last >= PROGRESS_EVERY:
                say(f"{plan.name}: waiting for {UNIT} (/health {code or 'no answer'})")
                last = now
            sleep(HEALTH_POLL)
    except KeyboardInterrupt:
        return f"{UNIT} started, /health not awaited (interrupted)"
    except Exception as exc:  # the connection, most likely
        return f"{type(exc).__name__}: {exc}"


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
            f"{plan.name}: stopping {UNIT} for llama-bench (it holds the GPU memory); it is "
            "started again afterwards, however the run ends"
        )
    try:
        if was_running:
            out = run(f"systemctl stop {UNIT}")
            result.stopped = out.rc == 0
            if out.rc != 0:
                result.error = f"systemctl stop {UNIT} failed: {out.first_error_line()}"
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


# ---------------------------------------------------------------- output


def _served(report: dict[str, Any] | None) -> dict[str, Any]:
    """The served figures of the level with the fewest streams (1 by default)."""
    levels = (report or {}).get("levels") or []
    if not levels:
        return {}
    level = min(levels, key=lambda lv: lv["max_concurrency"])
    prompt = None
    median_ttft = level.get("median_ttft_ms")
    if level.get("completed") and median_ttft:
        per_request = level["total_input_tokens"] / level["completed"]
        prompt = per_request / (median_ttft / 1000.0)
    return {
        "concurrency": level["max_concurrency"],
        "prompt_tps": prompt,
        "decode_tps": level.get("mean_decode_tps"),
        "server_decode_tps": level.get("mean_server_decode_tps"),
    }


def _cell(mode: ModeResult, test: str) -> str:
    if test not in mode.tests:
        return "failed" if not mode.ok else "-"
    t = mode.tests[test]
    std = t.get("stddev_ts")
    return f"{t['avg_ts']:.1f}" + (f" ± {std:.1f}" if isinstance(std, int | float) else "")


def format_table(result: HostResult, report: dict[str, Any] | None) -> str:
    """One table per host: llama-bench per split mode beside the served figures."""
    lines = []
    first = next((t for m in result.modes for t in m.tests.values()), {})
    about = ", ".join(
        str(x)
        for x in (
            first.get("model_type"),
            first.get("backends"),
            first.get("gpu_info") or None,
            f"build {first['build_number']} ({first['build_commit']})"
            if "build_commit" in first
            else None,
        )
        if x
    )
    lines.append(f"{result.name}: llama-bench" + (f" ({about})" if about else ""))
    served = _served(report)
    heads = [f"-sm {m.mode}" for m in result.modes]
    if served:
        heads.append(f"served, {served['concurrency']} stream")

    def num(value: Any) -> str:
        return "-" if value is None else f"{value:.1f}"

    rows: list[tuple[str, list[str]]] = []
    for label, test, key in (
        (f"prompt ({PP})", PP, "prompt_tps"),
        (f"decode ({TG})", TG, "decode_tps"),
    ):
        cells = [_cell(m, test) for m in result.modes]
        rows.append((label, cells + ([num(served[key])] if served else [])))
    if served and served.get("server_decode_tps") is not None:
        rows.append(
            ("decode, server timing", [""] * len(result.modes) + [num(served["server_decode_tps"])])
        )
    width = 2 + max(len(c) for c in heads + [c for _, cells in rows for c in cells])
    lines.append(f"{'tok/s':<22}" + "".join(f"{h:>{width}}" for h in heads))
    lines += [f"{label:<22}" + "".join(f"{c:>{width}}" for c in cells) for label, cells in rows]
    if served:
        lines.append(
            "  served: prompt = prompt tokens / median TTFT, decode = 1 / TPOT (gpubox bench); "
            "llama-bench: mean ± stddev of "
            f"{REPETITIONS} runs, no HTTP, tokenizer or sampling"
        )
    for m in result.modes:
        if m.error:
            lines.append(f"  -sm {m.mode} failed: {m.error}")
    if result.error:
        lines.append(f"  {result.error}")
    return "\n".join(lines)


def record_entry(result: HostResult, date: str | None = None) -> dict[str, Any]:
    """The llama-bench figures kept in the host's bench record (doctor's "last bench")."""
    best = best_mode(result.modes, result.split_mode)
    return {
        "date": date or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "split_mode": result.split_mode,
        "modes": {
            m.mode: (
                {
                    t: {k: v[k] for k in ("avg_ts", "stddev_ts") if k in v}
                    for t, v in m.tests.items()
                }
                | ({"error": m.error} if m.error else {})
            )
            for m in result.modes
        },
        "best": best.mode if best and len(result.modes) > 1 else None,
        "model_type": next(
            (t.get("model_type") for m in result.modes for t in m.tests.values()), None
        ),
    }


def summary_line(entry: dict[str, Any]) -> str:
    """A record's llama-bench figures in one line, for doctor's "last bench":
    'llama-bench 2026-03-02 -sm layer: pp512 3000 tok/s, tg128 65.0 tok/s'."""
    parts = []
    for mode, tests in (entry.get("modes") or {}).items():
        if not isinstance(tests, dict):
            continue
        pp, tg = tests.get(PP, {}).get("avg_ts"), tests.get(TG, {}).get("avg_ts")
        if pp is None or tg is None:
            parts.append(f"-sm {mode} failed")
        else:
            parts.append(f"-sm {mode}: {PP} {pp:.0f} tok/s, {TG} {tg:.1f} tok/s")
    best = f" (best: {entry['best']})" if entry.get("best") else ""
    date = str(entry.get("date") or "?")[:10]
    return f"llama-bench {date} " + ("; ".join(parts) or "no mode measured") + best


def save(result: HostResult, plan: Plan, date: str | None = None) -> None:
    """Add the figures to the host's bench record (made when the served bench kept none)."""
    record = bench.load_record(plan.name, plan.url) or {
        "date": date or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "url": bench.record_url(plan.url),
        "model": None,
        "levels": [],
        "failed": 0,
    }
    record["llama_bench"] = record_entry(result, date)
    bench.save_record(record, plan.name)


# ---------------------------------------------------------------- command line (bench.py's hook)


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    wrong = [m for m in modes if m not in SPLIT_MODES]
    if not modes or wrong:
        raise argparse.ArgumentTypeError(
            f"split modes are {', '.join(SPLIT_MODES)}, comma separated"
            + (f" (not {', '.join(wrong)})" if wrong else "")
        )
    return list(dict.fromkeys(modes))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--llama-bench",
        action="store_true",
        help="with --inventory: also run llama.cpp's llama-bench (pp512, tg128) on each host, "
        "with its llamacpp_split_mode; gpubox-llama-server is stopped during the run and "
        "started again afterwards",
    )
    parser.add_argument(
        "--split-modes",
        type=_modes,
        metavar="layer,row,tensor",
        help="with --inventory: llama-bench with each split mode, and the one to set "
        "(implies --llama-bench)",
    )


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if (args.llama_bench or args.split_modes) and not args.inventory:
        parser.error("--llama-bench and --split-modes need --inventory (they run over ssh)")


def _runner(host: Any) -> Runner:
    from gpubox.doctor import Output

    def run(command: str) -> Output:
        result = host.run(command)
        return Output(result.rc, result.stdout, result.stderr, command)

    return run


def _say(text: str) -> None:
    print(f"gpubox bench: {text}", file=sys.stderr, flush=True)


def main_hook(args: argparse.Namespace, reports: dict[str, dict[str, Any]]) -> tuple[int, Any]:
    """Run llama-bench on every host of args.inventory, print its table beside the served
    figures (``reports``, by host name), keep the figures; (exit status, JSON-able results).
    Exit status: 0 measured, 1 a run failed or the server is not back, 2 nothing could be
    run, 130 interrupted."""
    if not (args.llama_bench or args.split_modes):
        return 0, None
    import testinfra

    try:
        plans = load_plans(args.inventory)
    except bench.BenchError as exc:
        _say(str(exc))
        return 2, None
    rc = 0
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpubox-llama-bench-") as tmp:
        ssh_config = Path(tmp) / "ssh_config"
        ssh_config.write_text("".join(p.ssh_config for p in plans if not p.error))
        for plan in plans:
            if plan.error:
                _say(f"{plan.name}: no llama-bench: {plan.error}")
                results[plan.name] = {"error": plan.error}
                rc = max(rc, 2)
                continue
            modes = args.split_modes or [plan.split_mode]
            host = testinfra.get_host(
                f"paramiko://{plan.name}", ssh_config=str(ssh_config), sudo=plan.sudo
            )
            try:
                result = bench_host(_runner(host), plan, modes, _say)
            except KeyboardInterrupt:  # before anything was stopped
                _say(f"{plan.name}: interrupted before llama-bench ran")
                return 130, results
            print("\n" + format_table(result, reports.get(plan.name)))
            if args.split_modes:
                print(advice(result.modes, plan.split_mode))
            if result.restart_error:
                _say(
                    f"{plan.name}: {UNIT} IS NOT BACK: {result.restart_error}; start it with "
                    f"sudo systemctl start {UNIT}"
                )
            results[plan.name] = asdict(result)
            if result.modes:
                try:
                    save(result, plan)
                except OSError as exc:
                    _say(f"cannot keep the llama-bench figures for doctor: {exc}")
            if result.interrupted:
                return 130, results
            measured = (
                best_mode(result.modes) is not None
                if args.split_modes
                else bool(result.modes) and all(m.ok for m in result.modes)
            )
            if not result.modes:
                rc = max(rc, 2)
            elif not measured or result.restart_error:
                rc = max(rc, 1)
    return rc, results
