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
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import testinfra

from gpubox import config
from gpubox.bench import llamabench, smoke, smoke_host
from gpubox.bench.client import KEY_ENV, BenchError, Endpoint, EndpointUnreachable, normalize_url
from gpubox.bench.llamabench import _runner
from gpubox.bench.output import format_comparison, format_table, write_plot
from gpubox.bench.records import host_url, save_record, summary_record
from gpubox.bench.runner import Settings, bench_endpoint
from gpubox.remote import reach, tunnel


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
            "The API key: --api-key-file FILE, else the GPUBOX_API_KEY environment variable; "
            "with --inventory and neither, each host's api_key_file (/etc/gpubox/api-key, "
            "root-only) is read over the inventory's SSH connection (with sudo when the "
            "inventory uses it), never printed. With --inventory, an API bound to loopback "
            "(api_host 127.0.0.1, the default) is reached through an SSH tunnel over that "
            "connection (this machine's 127.0.0.1, an ephemeral port, closed at the end). "
            "Exit status: 0 all requests completed, 1 some failed, 2 nothing could be measured "
            "(refused key, unknown model, bad arguments), 3 a host or endpoint unreachable "
            "(one line each: NAME: unreachable: WHY); across hosts the first of 2, 3, 1, 0."
        ),
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("url", nargs="?", help="the endpoint's base URL, e.g. http://box:8080")
    target.add_argument(
        "--inventory",
        metavar="INV",
        help="bench every host of a gpubox inventory, model model_alias: through an SSH "
        "tunnel when api_host is loopback (the default), else http://{ssh_hostname}:{api_port}",
    )
    target.add_argument(
        "--smoke",
        metavar="INV",
        help="the first-run smoke test of every host of a gpubox inventory (docs/tools.md): "
        "for vLLM, the server started with and without --enforce-eager and with and without "
        "--mamba-ssm-cache-dtype float32 (the deployed unit stopped meanwhile, started again "
        "afterwards), each answering a short and a long prompt; for llama.cpp, the served "
        "configuration. Prints TTFT, decode tok/s, whether the answers are text, and the "
        "configuration to keep",
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
        help="let the model stop early (default: ignore_eos, every request writes max-tokens, "
        "as `vllm bench serve` does for random prompts)",
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


SSH_KEYS = (
    "ssh_hostname",
    "ssh_port",
    "ssh_user",
    "ssh_key",
    "ssh_password",
    "ssh_config_file",
    "ssh_known_hosts_file",
    "ssh_strict_host_key_checking",
    "_sudo",
)
INVENTORY_KEYS = (*SSH_KEYS, "api_host", "api_port", "api_key_file", "model_alias")
_LOAD_INVENTORY = """
import json, sys
from gpubox.remote import inventory
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


@dataclass
class Target:
    """One endpoint to bench: its label (the host's name, "" for a URL), URL and model; with
    --inventory the host's data (for the SSH tunnel and the key)."""

    label: str
    url: str
    model: str
    data: dict[str, Any] | None = None


def _targets(args: argparse.Namespace) -> list[Target]:
    """Every endpoint to bench."""
    if args.url:
        if not args.model:
            raise BenchError("--model NAME is required with a URL (see /v1/models)")
        return [Target("", normalize_url(args.url), args.model)]
    hosts = _load_inventory(args.inventory)
    if not hosts:
        raise BenchError(f"{args.inventory} defines no hosts")
    targets = []
    for name, data in hosts:
        full = {k: data.get(k, config.KEYS_BY_NAME[k].default) for k in INVENTORY_KEYS[-4:]}
        data = {**data, **full}
        url = host_url(name, data.get("ssh_hostname"), data["api_port"])
        targets.append(Target(name, url, args.model or data["model_alias"], data))
    return targets


class Unreachable(Exception):
    """A host or endpoint that cannot be reached (exit 3); the message is why. ``ssh``: the
    host itself (no SSH session), so nothing else is tried on it."""

    def __init__(self, why: str, ssh: bool = False) -> None:
        super().__init__(why)
        self.ssh = ssh


def inventory_sudo(data: dict[str, Any]) -> bool:
    """The inventory's sudo (_sudo for a user other than root), as testinfra uses it."""
    return bool(data.get("_sudo")) and data.get("ssh_user") not in (None, "root")


@contextlib.contextmanager
def _reach(
    target: Target, key: str | None, timeout: float
) -> Iterator[tuple[str, str | None, tunnel.Tunnel | None]]:
    """(URL to bench, key, tunnel) for one target: with --inventory, through an SSH tunnel
    when the API listens on the box's loopback, and the key read from the box when none was
    given. Raises Unreachable (no SSH session) or BenchError (the key cannot be read)."""
    data = target.data
    loopback = data is not None and tunnel.is_loopback(str(data["api_host"]))
    if data is None or (key is not None and not loopback):
        yield target.url, key, None
        return
    try:
        client = reach.connect(target.label, data, timeout)
    except reach.Unreachable as exc:
        raise Unreachable(str(exc), ssh=True) from None
    client.get_transport().set_keepalive(30)  # a long bench: keep NATs and firewalls open
    try:
        if key is None:
            try:
                key = tunnel.read_key(client, str(data["api_key_file"]), inventory_sudo(data))
            except tunnel.ApiKeyError as exc:
                raise BenchError(f"{target.label}: {exc}; or pass --api-key-file") from None
        if not loopback:
            yield target.url, key, None
            return
        address, port = tunnel.api_address(str(data["api_host"])), int(data["api_port"])
        with tunnel.Tunnel(tunnel.ssh_opener(client, address, port)) as forward:
            print(
                f"gpubox bench: {target.label}: the API at {address}:{port} on the box, "
                f"through an SSH tunnel from {forward.url}",
                file=sys.stderr,
                flush=True,
            )
            yield forward.url, key, forward
    finally:
        client.close()


def bench_target(
    target: Target, key: str | None, settings: Settings
) -> tuple[int, dict[str, Any] | None, str | None, bool]:
    """(exit code, report, problem, whether SSH could not reach the host) of one target;
    prints its one line when it fails."""
    name = target.label or target.url
    try:
        with _reach(target, key, min(settings.timeout, reach.DEFAULT_TIMEOUT_S)) as reached:
            url, given, forward = reached
            endpoint = Endpoint(url, target.model, given, settings.timeout)
            try:
                report = bench_endpoint(endpoint, settings, target.label)
            except EndpointUnreachable as exc:
                why = str(exc) if not target.label else f"{url}: {exc}"
                if forward is not None:  # through the tunnel: the API on the box
                    said = "; ".join(dict.fromkeys(forward.errors)) or why
                    why = f"the API on the box, through the SSH tunnel: {said}"
                raise Unreachable(why) from None
    except Unreachable as exc:
        print(reach.unreachable_line(name, str(exc)), file=sys.stderr, flush=True)
        return reach.UNREACHABLE, None, f"unreachable: {exc}", exc.ssh
    except BenchError as exc:
        print(f"gpubox bench: {exc}", file=sys.stderr)
        return reach.BAD_INPUT, None, str(exc), False
    if forward is not None:  # the record and the table name the host's endpoint
        report["endpoint"]["via"] = f"SSH tunnel {url}"
        report["endpoint"]["url"] = target.url
    failed = any(lv["failed"] for lv in report["levels"])
    return (reach.DEVIATES if failed else reach.OK), report, None, False


def smoke_main(args: argparse.Namespace) -> int:
    """`gpubox bench --smoke INV`: each host's configurations, its table and advice. Exit
    status: 0 a configuration to keep and the server back, 1 none answered text or the
    server is not back, 2 nothing could be run, 3 a host unreachable; 130 interrupted."""

    def say(text: str) -> None:
        print(f"gpubox bench --smoke: {text}", file=sys.stderr, flush=True)

    try:
        key = _read_key(args.api_key_file)
        plans = smoke.load_plans(args.smoke)
    except BenchError as exc:
        say(str(exc))
        return reach.BAD_INPUT
    if not plans:
        say(f"{args.smoke} defines no hosts")
        return reach.BAD_INPUT
    codes: list[int] = []
    found = reach.probe_all([(p.name, p.data) for p in plans if not p.error])
    for name, why in found.items():
        print(reach.unreachable_line(name, why), file=sys.stderr, flush=True)
        codes.append(reach.UNREACHABLE)
    with tempfile.TemporaryDirectory(prefix="gpubox-smoke-") as tmp:
        ssh_config = Path(tmp) / "ssh_config"
        ssh_config.write_text("".join(p.ssh_config for p in plans if not p.error))
        for plan in plans:
            if plan.name in found:
                continue
            if plan.error:
                say(f"{plan.name}: {plan.error}")
                codes.append(reach.BAD_INPUT)
                continue
            host = testinfra.get_host(
                f"paramiko://{plan.name}", ssh_config=str(ssh_config), sudo=plan.sudo
            )
            model = str(plan.data["model_alias"])
            url = host_url(plan.name, plan.data.get("ssh_hostname"), plan.data["api_port"])
            target = Target(plan.name, url, model, plan.data)
            try:
                with _reach(target, key, reach.DEFAULT_TIMEOUT_S) as (base, given, _):
                    endpoint = Endpoint(base, model, given, args.timeout)
                    result = smoke_host.smoke_host(
                        _runner(host),
                        plan,
                        functools.partial(smoke_host.measure, endpoint),
                        say,
                    )
            except Unreachable as exc:
                print(reach.unreachable_line(plan.name, str(exc)), file=sys.stderr, flush=True)
                codes.append(reach.UNREACHABLE)
                continue
            except BenchError as exc:
                say(str(exc))
                codes.append(reach.BAD_INPUT)
                continue
            if result.rows:
                print("\n" + smoke.format_table(plan.name, plan.backend, result.rows))
                print(
                    smoke.advice(
                        plan.backend, plan.deployed_eager, result.rows, plan.deployed_mamba
                    )
                )
            if result.error:
                say(f"{plan.name}: {result.error}")
            if result.restart_error:
                say(
                    f"{plan.name}: {plan.unit} IS NOT BACK: {result.restart_error}; start it "
                    f"with sudo systemctl start {plan.unit}"
                )
            if result.interrupted:
                return 130
            if not result.rows:
                codes.append(reach.BAD_INPUT)
            elif smoke.keep(result.rows) is None or result.restart_error or result.error:
                codes.append(reach.DEVIATES)
            else:
                codes.append(reach.OK)
    return reach.combine(codes)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke_main(args)
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
        return reach.BAD_INPUT
    reports: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    codes: list[int] = []
    unreachable: set[str] = set()
    for target in targets:
        label = target.label or target.url
        code, report, problem, no_ssh = bench_target(target, key, settings)
        codes.append(code)
        if no_ssh:
            unreachable.add(target.label)
        if report is None:
            problems[label] = problem or "not measured"
            continue
        reports[label] = report
        print(("" if len(reports) == 1 else "\n") + format_table(report))
        try:
            save_record(summary_record(report, settings=settings), target.label or None)
        except OSError as exc:
            print(f"gpubox bench: cannot keep the figures for doctor: {exc}", file=sys.stderr)
    if len(reports) > 1:  # --inventory: the hosts side by side
        print("\nside by side (the same seeded prompts on every host):")
        print(format_comparison(reports))
    # --llama-bench, --split-modes (not on a host found unreachable above)
    llama_rc, llama = llamabench.main_hook(args, reports, unreachable)
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
    if llama_rc == 130:
        return 130
    return reach.combine([*codes, llama_rc])
