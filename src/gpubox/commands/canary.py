"""`gpubox deploy INVENTORY --canary N` after the validation and the probe (gpubox.commands.
deploying): the canaries deployed first, then each one's full host checks (`gpubox verify
--limit HOST`) and its short bench against its own baseline (gpubox.rules.canary), and only
when every canary passed, the rest of the inventory. A canary that fails ends the run: exit 1
and one line per failure naming the host and what failed; the rest is not contacted. The
deploy, the checks and the bench are ``Phases``, so that tests replace them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpubox.bench import canary as canary_bench
from gpubox.bench.records import host_url, load_record
from gpubox.config import load_host_config
from gpubox.remote import reach
from gpubox.rules import canary


@dataclass
class Phases:
    """What a canary run does to hosts, each a function of the host names it acts on."""

    # pyinfra's deploy limited to these hosts: (gpubox deploy's exit code, the failed hosts)
    deploy: Callable[[list[str]], tuple[int, list[str]]]
    # `gpubox verify` limited to one host: its exit code
    checks: Callable[[str], int]
    # the short bench of one host: {"output_throughput": tok/s} or {"error": why}
    bench: Callable[[str, dict[str, Any], dict[str, Any]], dict[str, Any]]
    # the host's last recorded `gpubox bench` on this machine, or None
    record: Callable[[str, dict[str, Any]], dict[str, Any] | None]


def say(text: str) -> None:
    print(text, flush=True)


def verify_command(inventory: str, data: list[str], group_data: list[str]) -> list[str]:
    """`gpubox verify` as the canary's checks run it, but for the host (``--limit``)."""
    command = [sys.executable, "-m", "gpubox.cli", "verify", inventory]
    command += [arg for pair in data for arg in ("--data", pair)]
    command += [arg for path in group_data for arg in ("--group-data", path)]
    return command


def real_phases(
    deploy: Callable[[list[str]], tuple[int, list[str]]],
    inventory: str,
    data: list[str],
    group_data: list[str],
) -> Phases:
    """The phases of a real run: ``deploy`` (gpubox.commands.deploying's pyinfra run),
    `gpubox verify` in a child process, the bench of gpubox.bench.canary, and the records of
    gpubox.bench.records."""
    verify = verify_command(inventory, data, group_data)

    def checks(host: str) -> int:
        return subprocess.run([*verify, f"--limit={host}"], check=False).returncode

    def record(host: str, host_data: dict[str, Any]) -> dict[str, Any] | None:
        port = host_data.get("api_port", 8080)
        return load_record(host, host_url(host, host_data.get("ssh_hostname"), int(port)))

    return Phases(deploy, checks, canary_bench.measure_in_child, record)


def bench_host(host: str, data: dict[str, Any], phases: Phases) -> str | None:
    """A canary's short bench against its baseline: what failed, or None (passed, or skipped
    with a note)."""
    config = load_host_config(host, data)
    if config.backend == "none":
        say(f"canary: no bench on {host}: its backend is none (it serves nothing)")
        return None
    base = canary.baseline(phases.record(host, data))
    if base is None:
        say(
            f"canary: no bench on {host}: no gpubox bench recorded for it on this machine; "
            f"record one with: gpubox bench --inventory INVENTORY (it keeps each host's "
            f"figures under {os.environ.get('GPUBOX_STATE_DIR') or '~/.local/state/gpubox'}"
            f"/bench)"
        )
        return None
    if base.model != config.model_alias:
        say(
            f"canary: no bench on {host}: its baseline ({base.date}) measured model "
            f"{base.model!r}, it now serves {config.model_alias!r}; record a new one with "
            f"gpubox bench --inventory INVENTORY"
        )
        return None
    if base.assumed:
        say(
            f"canary: {host}'s baseline ({base.date}) does not say its settings: gpubox "
            f"bench's defaults assumed ({canary.DEFAULT_SETTINGS})"
        )
    result = phases.bench(host, data, canary.short_bench(base))
    if "error" in result or "output_throughput" not in result:
        return f"bench: {result.get('error', 'no figure')}"
    verdict = canary.judge(
        float(result["output_throughput"]),
        base.output_throughput,
        float(config.canary_bench_tolerance),
    )
    say(canary.bench_line(host, verdict))
    return None if verdict.passed else canary.bench_failure(verdict)


def run(
    hosts: list[tuple[str, dict[str, Any]]],
    canaries: list[str],
    phases: Phases,
) -> int:
    """Deploy ``canaries``, judge them, then deploy the rest of ``hosts``: gpubox deploy's
    exit code."""
    data = dict(hosts)
    rest = [name for name, _ in hosts if name not in canaries]
    say(f"canary: deploying {', '.join(canaries)}")
    rc, failed = phases.deploy(canaries)
    failures: dict[str, list[str]] = {}
    if rc != reach.OK:
        if rc in (reach.BAD_INPUT, reach.WAITING):  # pyinfra refused an option; the owner's turn
            what = "refused its options" if rc == reach.BAD_INPUT else "stopped for its owner"
            say(f"canary: the deploy of {', '.join(canaries)} {what} (exit {rc})")
            say(f"canary: the rest was not deployed: {', '.join(rest) or 'none'}")
            return rc
        for name in failed or canaries:
            failures[name] = [f"deploy: failed (exit {rc}; pyinfra's output above says why)"]
    else:
        for name in canaries:
            say(f"canary: checks on {name}")
            code = phases.checks(name)
            if code != reach.OK:
                failures.setdefault(name, []).append(
                    f"checks: gpubox verify --limit {name} exited {code} (its output above)"
                )
        for name in canaries:
            if name in failures:
                continue
            problem = bench_host(name, data[name], phases)
            if problem:
                failures.setdefault(name, []).append(problem)
    if failures:
        for name, whats in failures.items():
            for what in whats:
                say(f"canary: FAILED on {name}: {what}")
        say(f"canary: the rest was not deployed: {', '.join(rest) or 'none'}")
        return reach.DEVIATES
    if not rest:
        say("canary: passed; no host left to deploy")
        return reach.OK
    say(f"canary: passed; deploying the rest: {', '.join(rest)}")
    return phases.deploy(rest)[0]
