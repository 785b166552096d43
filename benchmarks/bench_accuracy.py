"""Benchmark: how accurately `gpubox bench` measures, against a synthetic OpenAI-compatible
streaming server with a known schedule (the one tests/unit/test_bench.py uses).

Prints figures, asserts nothing:
1. measured against scheduled TTFT and TPOT at concurrency 1 and 8 (first token after 200 ms,
   then one every 20 ms; the server in this process, as in the tests);
2. whether the bench keeps up with a server streaming 5,000 tokens/s (the server in a child
   process, so that it does not share the bench's interpreter lock): one request with a token
   every 0.2 ms, 8 requests with a token every 1.6 ms each, and 5-token chunks every 1 ms; the
   bench's decode rate (1/TPOT) beside the rate the server itself achieved, the E2EL lag behind
   the schedule, and the bench's own CPU time per streamed chunk.

Usage: .venv/bin/python benchmarks/bench_accuracy.py
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from gpubox import bench

ROOT = Path(__file__).resolve().parents[1]


def synthetic() -> ModuleType:
    path = ROOT / "tests" / "unit" / "test_bench.py"
    spec = importlib.util.spec_from_file_location("synthetic_server", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def settings(concurrency: int, requests: int, max_tokens: int) -> bench.Settings:
    return bench.Settings([concurrency], requests, 16, max_tokens, 0, 0, True, 60)


def accuracy(mod: ModuleType) -> None:
    ttft, interval, tokens = 0.2, 0.02, 50
    print(
        f"1. schedule: TTFT {ttft * 1000:.0f} ms, then a token every {interval * 1000:.0f} ms, "
        f"{tokens} tokens (server in this process)"
    )
    print(
        f"{'conc':>5} {'reqs':>5} {'TTFT mean':>10} {'median':>8} {'p99':>8} {'err %':>7}"
        f" {'TPOT mean':>10} {'median':>8} {'p99':>8} {'err %':>7}"
    )
    with mod.SyntheticServer(ttft=ttft, interval=interval) as srv:
        endpoint = bench.Endpoint(srv.url, mod.MODEL, mod.KEY, timeout=60)
        for concurrency, requests in ((1, 10), (8, 32)):
            lv = bench.bench_endpoint(endpoint, settings(concurrency, requests, tokens))
            m = lv["levels"][0]
            ttft_err = (m["mean_ttft_ms"] / (ttft * 1000) - 1) * 100
            tpot_err = (m["mean_tpot_ms"] / (interval * 1000) - 1) * 100
            print(
                f"{concurrency:>5} {m['completed']:>5} {m['mean_ttft_ms']:>10.2f} "
                f"{m['median_ttft_ms']:>8.2f} {m['p99_ttft_ms']:>8.2f} {ttft_err:>+7.2f} "
                f"{m['mean_tpot_ms']:>10.3f} {m['median_tpot_ms']:>8.3f} "
                f"{m['p99_tpot_ms']:>8.3f} {tpot_err:>+7.2f}"
            )


def serve(ttft: float, interval: float, batch: int) -> None:
    mod = synthetic()
    with mod.SyntheticServer(ttft=ttft, interval=interval, batch=batch) as srv:
        print(srv.url, flush=True)
        sys.stdin.read()  # until the parent closes our stdin


def throughput() -> None:
    print("\n2. 5,000 tokens/s (server in a child process)")
    cases = (  # (label, concurrency, interval s, tokens per chunk, tokens per request)
        ("1 stream, 1 token / 0.2 ms", 1, 0.0002, 1, 5000),
        ("8 streams, 1 token / 1.6 ms each", 8, 0.0016, 1, 1000),
        ("1 stream, 5 tokens / 1 ms", 1, 0.001, 5, 5000),
    )
    print(
        f"{'case':<34} {'scheduled':>10} {'server':>10} {'bench':>10} {'E2EL lag':>9} "
        f"{'ITL p99':>8} {'CPU/chunk':>10} {'bench max':>10}"
    )
    print(
        f"{'':<34} {'tok/s':>10} {'tok/s':>10} {'tok/s':>10} {'ms':>9} {'ms':>8} "
        f"{'us':>10} {'chunks/s':>10}"
    )
    for label, concurrency, interval, batch, tokens in cases:
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", "0.05", str(interval), str(batch)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            url = child.stdout.readline().strip()
            mod_model, mod_key = "synthetic-model", "test-key"
            endpoint = bench.Endpoint(url, mod_model, mod_key, timeout=60)
            s = settings(concurrency, concurrency, tokens)
            cpu = time.process_time()
            results, duration = bench.run_level(endpoint, s, concurrency, concurrency)
            cpu = time.process_time() - cpu
        finally:
            if child.stdin:
                child.stdin.close()
            child.wait(timeout=10)
        m = bench.level_metrics(results, duration, concurrency)
        chunks = sum(len(r.token_times) for r in results)
        # One token (or chunk) every `interval` after the first: E2EL = TTFT + (chunks-1) x D.
        scheduled_e2el = 50 + (tokens / batch - 1) * interval * 1000
        lag = (m["mean_e2el_ms"] or 0) - scheduled_e2el
        sched_rate = concurrency * batch / interval
        server_rate = (m["mean_server_decode_tps"] or 0) * concurrency
        bench_rate = (m["mean_decode_tps"] or 0) * concurrency
        per_chunk = cpu / max(1, chunks) * 1e6
        print(
            f"{label:<34} {sched_rate:>10.0f} {server_rate:>10.0f} {bench_rate:>10.0f} "
            f"{lag:>+9.2f} {m['p99_itl_ms'] or 0:>8.3f} {per_chunk:>10.1f} "
            f"{1e6 / per_chunk:>10.0f}   failed {m['failed']}"
        )
    print(
        "server tok/s: the rate the server achieved (its timings); bench tok/s: 1/TPOT as "
        "measured, summed over streams; E2EL lag: measured E2EL minus the schedule's; "
        "CPU/chunk: the bench process's CPU time per streamed chunk (all its threads)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--serve", nargs=3, metavar=("TTFT", "INTERVAL", "BATCH"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve:
        serve(float(args.serve[0]), float(args.serve[1]), int(args.serve[2]))
        return 0
    accuracy(synthetic())
    throughput()
    return 0


if __name__ == "__main__":
    sys.exit(main())
