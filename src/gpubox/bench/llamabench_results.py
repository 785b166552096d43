"""What llama-bench's runs give: its JSON output read (tests named as llama-bench names them:
pp512, tg128), a failed run's reason from its stderr, the best split mode and the advice, the
table beside the served figures, and the entry kept in the host's bench record (with the line
`gpubox doctor` shows of it)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from gpubox.checks import Output

N_PROMPT = 512
N_GEN = 128
REPETITIONS = 3
RUN_TIMEOUT = 3600  # seconds per llama-bench run on the box (timeout(1))
PP = f"pp{N_PROMPT}"
TG = f"tg{N_GEN}"


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
    """'set "llamacpp_split_mode": "row" (tg128 80.1 tok/s vs layer 65.0, tensor failed) (now
    layer)'."""
    best = best_mode(results, current)
    if best is None:
        return f'no split mode ran: keep "llamacpp_split_mode": "{current}"'
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
    return f'set "llamacpp_split_mode": "{best.mode}" (tg128 {best.ts(TG):.1f} tok/s{vs}){now}'


@dataclass
class HostResult:
    name: str
    split_mode: str  # the one the inventory sets
    modes: list[ModeResult] = field(default_factory=list)
    error: str | None = None  # nothing measured, or the run stopped early
    restart_error: str | None = None  # the server could not be brought back
    interrupted: bool = False
    stopped: bool = False  # the server was stopped for the run


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
    if not result.modes:  # nothing ran: the reason, not an empty table
        return f"{lines[0]}: {result.error or 'no split mode ran'}"
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
