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
settings (testinfra's paramiko backend).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import testinfra

from gpubox import config
from gpubox.base import layout
from gpubox.bench.client import BenchError
from gpubox.bench.llamabench_host import Plan, bench_host
from gpubox.bench.llamabench_results import (
    HostResult,
    advice,
    best_mode,
    format_table,
    record_entry,
)
from gpubox.bench.records import host_url, load_record, record_url, save_record
from gpubox.checks import Output, Runner
from gpubox.checks.facts import api_base
from gpubox.config import LLAMA_SPLIT_MODES as SPLIT_MODES
from gpubox.plans.llamacpp import llama_build
from gpubox.plans.model import plan as model_plan
from gpubox.remote import inventory, reach


def host_plan(name: str, data: dict[str, Any]) -> Plan:
    """The plan of one host, from the same HostConfig the deploy uses (run in the child)."""
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
        health_url=f"{api_base(cfg)}/health",
        health_timeout=int(cfg.health_timeout),
        url=host_url(name, data.get("ssh_hostname"), cfg.api_port),
        ssh={k: v for k, v in data.items() if k.startswith("ssh_") or k == "_sudo"},
    )


def plans_json(path: str) -> str:
    """Every host's plan as JSON (the child process prints it)."""
    return inventory.plans_json(path, host_plan)


def load_plans(path: str) -> list[Plan]:
    try:
        return [Plan(**p) for p in inventory.plans_in_child(__name__, path)]
    except inventory.InventoryError as exc:
        raise BenchError(f"cannot read {path}: {exc}") from None


def save(result: HostResult, plan: Plan, date: str | None = None) -> None:
    """Add the figures to the host's bench record (made when the served bench kept none)."""
    record = load_record(plan.name, plan.url) or {
        "date": date or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "url": record_url(plan.url),
        "model": None,
        "levels": [],
        "failed": 0,
    }
    record["llama_bench"] = record_entry(result, date)
    save_record(record, plan.name)


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
    def run(command: str) -> Output:
        result = host.run(command)
        return Output(result.rc, result.stdout, result.stderr, command)

    return run


def _say(text: str) -> None:
    print(f"gpubox bench: {text}", file=sys.stderr, flush=True)


def main_hook(
    args: argparse.Namespace,
    reports: dict[str, dict[str, Any]],
    unreachable: set[str] | frozenset[str] = frozenset(),
) -> tuple[int, Any]:
    """Run llama-bench on every host of args.inventory, print its table beside the served
    figures (``reports``, by host name), keep the figures; (exit status, JSON-able results).
    Hosts in ``unreachable`` (already reported) and hosts whose SSH cannot be reached (one
    line each, NAME: unreachable: WHY) are skipped. Exit status (gpubox.remote.reach's codes
    combined): 0 measured, 1 a run failed or the server is not back, 2 nothing could be
    run, 3 a host unreachable; 130 interrupted."""
    if not (args.llama_bench or args.split_modes):
        return 0, None
    try:
        plans = load_plans(args.inventory)
    except BenchError as exc:
        _say(str(exc))
        return 2, None
    codes: list[int] = []
    results: dict[str, Any] = {}
    for name in unreachable:
        results[name] = {"error": "unreachable"}
        codes.append(reach.UNREACHABLE)
    plans = [p for p in plans if p.name not in unreachable]
    found = reach.probe_all([(p.name, p.ssh) for p in plans if not p.error])
    for name, why in found.items():
        print(reach.unreachable_line(name, why), file=sys.stderr, flush=True)
        results[name] = {"error": f"unreachable: {why}"}
        codes.append(reach.UNREACHABLE)
    plans = [p for p in plans if p.name not in found]
    with tempfile.TemporaryDirectory(prefix="gpubox-llama-bench-") as tmp:
        ssh_config = Path(tmp) / "ssh_config"
        ssh_config.write_text("".join(p.ssh_config for p in plans if not p.error))
        for plan in plans:
            if plan.error:
                _say(f"{plan.name}: no llama-bench: {plan.error}")
                results[plan.name] = {"error": plan.error}
                codes.append(reach.BAD_INPUT)
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
                unit = layout.LLAMA_SERVER
                _say(
                    f"{plan.name}: {unit} IS NOT BACK: {result.restart_error}; start it with "
                    f"sudo systemctl start {unit}"
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
                codes.append(reach.BAD_INPUT)
            elif not measured or result.restart_error:
                codes.append(reach.DEVIATES)
    return reach.combine(codes), results
