"""`gpubox deploy INVENTORY`: the full deploy shipped inside the package, run by pyinfra.

Before pyinfra starts, the whole inventory is validated (as ``gpubox check``: a bad one exits 2
and no host is contacted) with the data pyinfra will see: ``--data KEY=VALUE`` over every
host's own, each value read by pyinfra's own parser (``gpubox.remote.inventory``), and the
``--group-data`` files; a problem with a key that ``--data`` set says so. Then every targeted
host is probed over SSH (``gpubox.remote.reach``). When one cannot be reached, nothing is
deployed anywhere: one line per such host (``NAME: unreachable: WHY``) and exit 3; ``--limit``
the others to deploy them. Otherwise pyinfra runs ``gpubox/deploy/full.py`` with every other
option passed through; its output is pyinfra's, and a failed run exits 1 (2 when pyinfra
refuses an option).

``--stage NAME`` (repeatable) runs only the named stages of the full deploy, in the full
deploy's order; the deploy file reads them from ``$GPUBOX_STAGES``.

``--canary N`` (gpubox.commands.canary) deploys N hosts first, judges them by their host
checks and a short bench, and only then deploys the rest: two pyinfra runs, each ``--limit``ed
to its hosts, both with the same ``--stage``, ``--data`` and other options. Not with
``--limit`` nor ``--dry`` (exit 2)."""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from gpubox.commands import canary
from gpubox.infra import outcome
from gpubox.remote import inventory, reach
from gpubox.rules import canary as canary_rules

# The full deploy's stages, in the order they run (gpubox/deploy/full.py maps each name to
# its stage function).
FULL_STAGES = (
    # first: the model's download (the GGUF, or the vLLM checkpoint) starts in the background
    # (a systemd unit, enabled until it is complete, so the driver's reboot does not stop it);
    # the backend waits for it
    "model_download",
    "driver",
    "cuda",
    "docker",
    "container_toolkit",
    # the vLLM image's pull in the background (after the toolkit's restart of Docker, which
    # would abort a pull); the vLLM stage waits for it
    "vllm_image_pull",
    "dcgm",
    "tools",
    "backend",
    # after the server: the timer that restarts it when it hangs (docs/watchdog.md)
    "watchdog",
    # the optional monitoring (docs/monitoring.md): after the backend and its watchdog, whose
    # API key and metrics it reads
    "monitoring",
    # Grafana on the monitor, optional (docs/monitoring.md#the-dashboard), on its Prometheus
    "grafana",
    # the optional server panel (docs/panel.md), on the Docker of the stages above
    "panel",
    "verify",
)
STAGES_ENV = "GPUBOX_STAGES"
DEPLOY_DIR = Path(__file__).resolve().parents[1] / "deploy"

T = TypeVar("T")


def chosen(stages: dict[str, T], env: dict[str, str] | None = None) -> list[T]:
    """The stages to run, in ``FULL_STAGES`` order: all of them, or those named (comma
    separated) in ``$GPUBOX_STAGES``. An unknown name is an error naming the valid ones."""
    value = (os.environ if env is None else env).get(STAGES_ENV, "").strip()
    if not value:
        return [stages[name] for name in FULL_STAGES]
    names = {n.strip() for n in value.split(",") if n.strip()}
    bad = unknown(names)
    if bad:
        raise ValueError(f"{STAGES_ENV}: unknown stage(s) {', '.join(bad)}; {valid_text()}")
    return [stages[name] for name in FULL_STAGES if name in names]


def unknown(names: Sequence[str] | set[str]) -> list[str]:
    return sorted(set(names) - set(FULL_STAGES))


def valid_text() -> str:
    return "the stages are: " + ", ".join(FULL_STAGES)


def probe_all(
    hosts: list[tuple[str, dict[str, Any]]],
    probe: Callable[[str, dict[str, Any]], str | None] | None = None,
) -> dict[str, str | None]:
    """Every host probed at once (one SSH timeout in all, not one per host)."""
    run = probe or reach.probe
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        found = pool.map(lambda host: run(host[0], host[1]), hosts)
        return {name: why for (name, _), why in zip(hosts, found, strict=True)}


def targeted(
    hosts: list[tuple[str, dict[str, Any]]], limits: list[str]
) -> list[tuple[str, dict[str, Any]]]:
    """The hosts a ``--limit`` selects by name (fnmatch, comma separated as pyinfra takes
    them); every host when there is none, or when a limit names no host (a group)."""
    patterns = [p for limit in limits for p in limit.split(",") if p]
    if not patterns:
        return hosts
    picked = [h for h in hosts if any(fnmatch.fnmatch(h[0], p) for p in patterns)]
    if any(not any(fnmatch.fnmatch(n, p) for n, _ in hosts) for p in patterns):
        return hosts
    return picked


def pyinfra_executable() -> str:
    """The pyinfra beside this Python (the venv gpubox is installed in), else on PATH."""
    beside = Path(sys.executable).parent / "pyinfra"
    return str(beside) if beside.is_file() else shutil.which("pyinfra") or str(beside)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpubox deploy",
        allow_abbrev=False,  # an abbreviation may be one of pyinfra's options
        description=(
            "Validate the inventory, probe its hosts over SSH, then converge them with "
            "pyinfra and the full deploy shipped in gpubox. Options not listed here are "
            "pyinfra's and pass through (pyinfra --help), after the inventory. Exit: 0 done, "
            "1 a deploy failed, 2 bad input (nothing contacted), 3 a host unreachable "
            "(nothing deployed), 4 stopped for the owner (a Secure Boot key to enroll, a "
            "reboot to do or consent to): the work before the stop is kept, run it again after."
        ),
    )
    p.add_argument("inventory", help="a pyinfra inventory file (inventories/example.py)")
    p.add_argument(
        "--stage",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this stage of the full deploy (repeatable); " + valid_text(),
    )
    p.add_argument("--dry", action="store_true", help="pyinfra's --dry: show, change nothing")
    p.add_argument("-y", "--yes", action="store_true", help="pyinfra's -y: do not ask first")
    p.add_argument(
        "--limit", action="append", default=[], help="pyinfra's --limit: only these hosts"
    )
    p.add_argument(
        "--canary",
        type=_canaries,
        metavar="N",
        help="deploy N hosts first (the first N of the inventory's group canary when it has "
        "one, else the first N), run their host checks and a short bench against each one's "
        "last recorded gpubox bench (within canary_bench_tolerance), and only then the rest; "
        "a canary that fails ends the run, exit 1 (not with --limit or --dry)",
    )
    inventory.add_data_arguments(p, "validated as pyinfra will see it, then passed to it")
    return p


def _canaries(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of hosts: {text}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("the number of canaries must be 1 or more")
    return value


def refused_with_canary(args: argparse.Namespace) -> str | None:
    """Why these options cannot go with --canary, or None."""
    if args.limit:
        return (
            "--canary picks the hosts to deploy first and then deploys the rest: it cannot be "
            "combined with --limit (run --limit alone, or name the hosts to go first in the "
            "inventory's group canary)"
        )
    if args.dry:
        return (
            "--canary deploys its canaries for real and judges them: it cannot be combined "
            "with --dry (run --dry alone to see every host's plan)"
        )
    return None


def main(
    argv: list[str],
    load_hosts: Callable[..., list[tuple[str, dict[str, Any]]] | None],
    report: Callable[..., int],
    probe: Callable[[str, dict[str, Any]], str | None] | None = None,
    phases: Callable[..., canary.Phases] | None = None,
    load_group: Callable[[str, str, list[str]], list[str] | None] | None = None,
) -> int:
    """``phases`` (canary.real_phases' arguments -> the canary's phases) and ``load_group``
    (inventory.group_members) are the test seams of --canary."""
    args, rest = parser().parse_known_args(argv)
    stages = [n for s in args.stage for n in s.split(",") if n]
    bad = unknown(stages)
    if bad:
        print(f"gpubox deploy: unknown stage(s) {', '.join(bad)}; {valid_text()}", file=sys.stderr)
        return reach.BAD_INPUT
    refused = refused_with_canary(args) if args.canary else None
    if refused:
        print(f"gpubox deploy: {refused}", file=sys.stderr)
        return reach.BAD_INPUT
    try:
        overrides = inventory.data_overrides(args.data)
    except ValueError as exc:
        print(f"gpubox deploy: {exc}", file=sys.stderr)
        return reach.BAD_INPUT
    # the hosts' data as pyinfra will merge it: --data over each host's own, over its groups'
    hosts = load_hosts("deploy", args.inventory, overrides, args.group_data)
    if hosts is None:
        return reach.BAD_INPUT
    origins = inventory.data_origins(args.data)
    errors = report(hosts, overrides, warnings=False, origins=origins)
    if errors:
        with_data = "".join(f" --data {pair}" for pair in args.data)
        print(
            f"{errors} problem(s) in {args.inventory}{with_data}; no host was contacted",
            file=sys.stderr,
        )
        return reach.BAD_INPUT
    canaries: list[str] = []
    if args.canary:
        try:
            group = (load_group or inventory.group_members)(
                args.inventory, canary_rules.GROUP, args.group_data
            )
            canaries = canary_rules.pick([name for name, _ in hosts], group, args.canary)
        except (ValueError, inventory.InventoryError) as exc:
            print(f"gpubox deploy: {exc}; no host was contacted", file=sys.stderr)
            return reach.BAD_INPUT
    found = probe_all(targeted(hosts, args.limit), probe)
    down = {name: why for name, why in found.items() if why is not None}
    if down:
        for name, why in down.items():
            print(reach.unreachable_line(name, why))
        up = [name for name in found if name not in down]
        hint = f"; to deploy the others: --limit {','.join(up)}" if up else ""
        print(
            f"gpubox deploy: {len(down)} of {len(found)} host(s) unreachable, nothing was "
            f"deployed{hint}",
            file=sys.stderr,
        )
        return reach.UNREACHABLE
    if not args.canary:
        return run_pyinfra(args, rest, stages, args.limit)[0]

    def deploy(names: list[str]) -> tuple[int, list[str]]:  # --stage passes to both phases
        return run_pyinfra(args, rest, stages, names)

    make = phases or canary.real_phases
    return canary.run(hosts, canaries, make(deploy, args.inventory, args.data, args.group_data))


def run_pyinfra(
    args: argparse.Namespace, rest: list[str], stages: list[str], limits: list[str]
) -> tuple[int, list[str]]:
    """pyinfra on the full deploy, for the hosts ``limits`` names (every host when none):
    (gpubox deploy's exit code, the hosts that failed)."""
    command = [pyinfra_executable()]
    command += ["--dry"] * args.dry + ["-y"] * args.yes
    command += [f"--limit={limit}" for limit in limits]
    command += [arg for pair in args.data for arg in ("--data", pair)]
    command += [arg for path in args.group_data for arg in ("--group-data", path)]
    command += [*rest, args.inventory, str(DEPLOY_DIR / "full.py")]
    env = dict(os.environ)
    env.pop(STAGES_ENV, None)
    if stages:
        env[STAGES_ENV] = ",".join(stages)
    with tempfile.TemporaryDirectory(prefix="gpubox-deploy-") as tmp:
        # which hosts stopped on purpose, waiting for their owner (gpubox.infra.outcome): exit 4
        env[outcome.ENV] = os.path.join(tmp, "outcome.json")
        rc = subprocess.run(command, env=env, check=False).returncode
        # pyinfra (click) exits 2 for an option it does not take: bad input, nothing run
        return outcome.exit_code(env[outcome.ENV], rc), outcome.failed_hosts(env[outcome.ENV])
