"""Layer 11, entry points: gpubox bench, the served API's speed and llama-bench's.

gpubox bench: measure an OpenAI-compatible endpoint the way `vllm bench serve` does, and
with --llama-bench llama.cpp's own benchmark on each host of an inventory.

The modules, each one job:

- metrics: the figures of one concurrency level (TTFT, TPOT, ITL, E2EL, percentiles, tok/s)
- client: the endpoint, its probe and one streamed (SSE) chat completion; BenchError
- runner: seeded prompts, the warm-up and the concurrency sweep of one endpoint
- output: the printed table and the --plot figure
- records: the last figures per URL and host, kept on this machine for `gpubox doctor`
- cli: `gpubox bench`'s command line (``main``), with the inventory read in a child process
- llamabench: --llama-bench and --split-modes: the hosts' plans, the run per host, the record
- llamabench_host: llama-bench's commands on one box, and the server stopped and started again
- llamabench_results: llama-bench's output read, the best split mode, its table and record line
- canary: `gpubox deploy --canary`'s short bench of one host, in a child process, not recorded

Run as ``python -m gpubox.bench`` (the same as ``gpubox bench``).
"""

from __future__ import annotations

from gpubox.bench.cli import build_parser, main
from gpubox.bench.client import (
    KEY_ENV,
    KEY_HINT,
    BenchError,
    Endpoint,
    normalize_url,
    probe,
    stream_request,
)
from gpubox.bench.metrics import (
    RequestResult,
    level_metrics,
    peak_output_throughput,
    percentile,
    summarize,
    tpot,
)
from gpubox.bench.output import format_comparison, format_table, write_plot
from gpubox.bench.records import (
    host_url,
    load_record,
    record_paths,
    record_url,
    records_dir,
    save_record,
    summary_record,
)
from gpubox.bench.runner import WORDS, Progress, Settings, bench_endpoint, make_prompt, run_level

__all__ = [
    "KEY_ENV",
    "KEY_HINT",
    "WORDS",
    "BenchError",
    "Endpoint",
    "Progress",
    "RequestResult",
    "Settings",
    "bench_endpoint",
    "build_parser",
    "format_comparison",
    "format_table",
    "host_url",
    "level_metrics",
    "load_record",
    "main",
    "make_prompt",
    "normalize_url",
    "peak_output_throughput",
    "percentile",
    "probe",
    "record_paths",
    "record_url",
    "records_dir",
    "run_level",
    "save_record",
    "stream_request",
    "summarize",
    "summary_record",
    "tpot",
    "write_plot",
]
