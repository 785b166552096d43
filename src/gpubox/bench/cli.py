"""gpubox bench: measure an OpenAI-compatible endpoint the way `vllm bench serve` does.

Streams /v1/chat/completions (stream_options.include_usage) from a bounded pool of threads,
one per concurrent request, and reports per concurrency level, with vLLM's names and
definitions: TTFT, TPOT (excluding the first token), ITL, E2EL (mean, median, p99 in ms),
request, output and total token throughput. Token counts come from the server's usage chunk;
llama.cpp's own `timings.predicted_per_second` is shown beside the decode speed we measure.

After each run a small summary (date, URL, model, per level the output tok/s, median TTFT and
TPOT, failures) is kept on this machine under $GPUBOX_STATE_DIR or ~/.local/state/gpubox, in
bench/url-<URL>.json (e.g. url-http_box_8080.json) and, with --inventory, also in
bench/host-<name>.json: `gpubox doctor` shows it.

Prompts are made of words drawn from a fixed list with a seeded generator, one word standing
for about one token (the server's usage reports the real prompt length), so two boxes or two
backends given the same settings do the same work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

from gpubox.bench import llamabench
from gpubox.bench.client import KEY_ENV, BenchError, Endpoint, normalize_url
from gpubox.bench.output import format_comparison, format_table, write_plot
from gpubox.bench.records import host_url, save_record, summary_record
from gpubox.bench.runner import Settings, bench_endpoint


def _concurrency_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return values


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpubox bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "The API key: --api-key-file FILE, else the GPUBOX_API_KEY environment variable. "
            "On a gpubox box the key lives root-only at the host's api_key_file "
            "(/etc/gpubox/api-key); with --inventory the bench does not read it over ssh, so "
            "copy it to a local file (one key, used for every host). "
            "Exit status: 0 all requests completed, 1 some failed, 2 nothing could be measured "
            "(unreachable endpoint, refused key, unknown model, bad arguments)."
        ),
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("url", nargs="?", help="the endpoint's base URL, e.g. http://box:8080")
    target.add_argument(
        "--inventory",
        metavar="INV",
        help="bench every host of a gpubox inventory: http://{ssh_hostname}:{api_port}, "
        "model model_alias (the API must listen on an address this machine reaches: api_host)",
    )
    parser.add_argument("--model", help="the model id to request (required with a URL)")
    parser.add_argument("--api-key-file", metavar="F", help=f"file with the API key ({KEY_ENV})")
    parser.add_argument(
        "--concurrency",
        type=_concurrency_list,
        default=[1, 2, 4],
        metavar="1,2,4",
        help="concurrency levels, comma separated (default 1,2,4)",
    )
    parser.add_argument(
        "--requests",
        type=_positive,
        metavar="N",
        help="requests per level (default max(8, 4 x concurrency))",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=_positive,
        default=256,
        metavar="N",
        help="prompt length, approximated as N words from a fixed list (default 256)",
    )
    parser.add_argument(
        "--max-tokens",
        type=_positive,
        default=256,
        metavar="N",
        help="output tokens per request (default 256)",
    )
    parser.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let the model stop early (default: ignore_eos, every request writes max-tokens)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        metavar="N",
        help="requests before the first level, not counted (default 1)",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="prompt seed (default 0)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds without data before a request fails (default 600)",
    )
    parser.add_argument("--json", metavar="OUT", help="write every figure and the settings")
    parser.add_argument(
        "--plot",
        metavar="OUT.png",
        help="throughput and TPOT against concurrency (needs matplotlib)",
    )
    llamabench.add_arguments(parser)
    return parser


def _read_key(path: str | None) -> str | None:
    if path:
        try:
            with open(os.path.expanduser(path)) as f:
                lines = [ln.strip() for ln in f if ln.strip()]
        except OSError as exc:
            raise BenchError(f"cannot read --api-key-file {path}: {exc}") from exc
        if not lines:
            raise BenchError(f"--api-key-file {path} is empty")
        return lines[0]
    return os.environ.get(KEY_ENV) or None


INVENTORY_KEYS = ("ssh_hostname", "api_port", "model_alias")
_LOAD_INVENTORY = """
import json, sys
from gpubox import inventory
keys = sys.argv[2:]
try:
    hosts = inventory.load(sys.argv[1])
except inventory.InventoryError as exc:
    sys.exit(str(exc))
print(json.dumps([[n, {k: d[k] for k in keys if k in d}] for n, d in hosts]))
"""


def _load_inventory(path: str) -> list[tuple[str, dict[str, Any]]]:
    """(host, the keys the bench needs) of every host, read in a child process: importing
    pyinfra's CLI monkey-patches threads and sockets with gevent, which the bench's threads and
    clocks must not run under."""
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_INVENTORY, path, *INVENTORY_KEYS],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise BenchError(f"cannot read {path}: {lines[-1] if lines else 'unknown error'}")
    return [(name, data) for name, data in json.loads(proc.stdout)]


def _targets(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(label, url, model) of every endpoint to bench."""
    if args.url:
        if not args.model:
            raise BenchError("--model NAME is required with a URL (see /v1/models)")
        return [("", normalize_url(args.url), args.model)]
    from gpubox import config

    hosts = _load_inventory(args.inventory)
    if not hosts:
        raise BenchError(f"{args.inventory} defines no hosts")

    def value(data: dict[str, Any], key: str) -> Any:
        return data.get(key, config.KEYS_BY_NAME[key].default)

    targets = []
    for name, data in hosts:
        url = host_url(name, data.get("ssh_hostname"), value(data, "api_port"))
        targets.append((name, url, args.model or value(data, "model_alias")))
    return targets


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    llamabench.check_arguments(parser, args)
    settings = Settings(
        concurrency=args.concurrency,
        requests=args.requests,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        warmup=max(0, args.warmup),
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        timeout=args.timeout,
    )
    try:
        key = _read_key(args.api_key_file)
        targets = _targets(args)
    except BenchError as exc:
        print(f"gpubox bench: {exc}", file=sys.stderr)
        return 2
    reports: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    for label, url, model in targets:
        endpoint = Endpoint(url, model, key, settings.timeout)
        try:
            report = bench_endpoint(endpoint, settings, label)
        except BenchError as exc:
            problems[label or url] = str(exc)
            print(f"gpubox bench: {exc}", file=sys.stderr)
            continue
        reports[label or url] = report
        print(("" if len(reports) == 1 else "\n") + format_table(report))
        try:
            save_record(summary_record(report), label or None)
        except OSError as exc:
            print(f"gpubox bench: cannot keep the figures for doctor: {exc}", file=sys.stderr)
    if len(reports) > 1:  # --inventory: the hosts side by side
        print("\nside by side (the same seeded prompts on every host):")
        print(format_comparison(reports))
    llama_rc, llama = llamabench.main_hook(args, reports)  # --llama-bench, --split-modes
    if args.json:
        document = {
            "settings": asdict(settings) | {"key_given": key is not None},
            "tool": "gpubox bench",
            "prompt_tokens_note": "prompts are words from a fixed list, one word ~ one token; "
            "total_input_tokens comes from the server's usage",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "results": reports,
            "problems": problems,
            "llama_bench": llama,
        }
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    if args.plot and reports:
        message = write_plot(reports, args.plot)
        if message:
            print(f"gpubox bench: {message}", file=sys.stderr)
    failed = any(lv["failed"] for r in reports.values() for lv in r["levels"])
    return max(llama_rc, 2 if problems else (1 if failed else 0))
