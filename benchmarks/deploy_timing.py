"""Benchmark: the first full deploy on a fresh sandbox box against the no-op re-deploy.

Prints wall time and operation counts of each run (figures, not assertions), the ratio
no-op / first deploy, and where the no-op's time goes: per stage, its planning time (the
facts it reads, preflight's included) and the time its operations take when they execute,
then the slowest fact commands (profile_deploy.py puts the clocks on pyinfra). Usage, as root:
    .venv/bin/python benchmarks/deploy_timing.py [--keep] [--boxes N] [--reuse]

--reuse deploys on the sandbox box already up (its caches warm) instead of a fresh one: the
"first deploy" is then not a first one; use it only to profile the no-op again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gpubox.commands import demo

HERE = Path(__file__).resolve().parent


def profiled_deploy(
    profile: Path, extra: tuple[str, ...] = (), env: tuple[str, ...] = ()
) -> tuple[demo.DeployRun, dict[str, Any]]:
    """demo.deploy's run (pyinfra as a user types it, in the sandbox's namespace) under
    profile_deploy.py's clocks; returns the run and its profile."""
    argv = demo.in_netns(
        [
            *(["env", *env] if env else []),
            sys.executable,
            str(HERE / "profile_deploy.py"),
            str(profile),
            "-y",
            "--json",
            *extra,
            demo.INVENTORY,
            "deploy/full.py",
        ]
    )
    start = time.monotonic()
    rc, stdout, stderr = demo.stream(argv)
    run = demo.DeployRun(rc, time.monotonic() - start, output=stderr)
    try:
        results = json.loads(stdout).get("results", {})
    except json.JSONDecodeError:
        run.output += stdout
        results = {}
    for op in results.get("operations", []):
        run.operations += 1
        if op.get("success"):
            run.changed += 1
            run.changed_names.append(op.get("name", "?"))
        run.errors += len(op.get("error", []))
    run.failed_hosts = list(results.get("failed_hosts", []))
    try:
        data = json.loads(profile.read_text())
    except (OSError, json.JSONDecodeError):
        data = {}
    return run, data


def per_stage(profile: dict[str, Any]) -> list[dict[str, Any]]:
    """Per stage of run_stages: planning seconds, its facts (count, seconds), and the seconds
    its operations took to execute (operations are named 'STAGE LABEL | ...')."""
    rows: dict[str, dict[str, Any]] = {}
    for stage in profile.get("stages", []):
        row = rows.setdefault(stage["stage"], {"stage": stage["stage"], "plan_s": 0.0})
        row["plan_s"] += stage["seconds"]
    for fact in profile.get("facts", []):
        if fact["phase"] != "prepare":
            continue
        row = rows.setdefault(fact["stage"], {"stage": fact["stage"], "plan_s": 0.0})
        row["facts"] = row.get("facts", 0) + 1
        row["facts_s"] = row.get("facts_s", 0.0) + fact["seconds"]
    for op in profile.get("operations", []):
        label = op["names"][0].split(" | ")[0] if op["names"] else "?"
        row = rows.setdefault(f"ops: {label}", {"stage": f"ops: {label}", "plan_s": 0.0})
        row["ops"] = row.get("ops", 0) + 1
        row["exec_s"] = row.get("exec_s", 0.0) + op["seconds"]
    return [
        {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
        for row in rows.values()
    ]


def show_profile(title: str, seconds: float, profile: dict[str, Any]) -> None:
    print(f"\n{title}: {seconds:.1f} s wall")
    for key, label in (
        ("start_to_first_stage_s", "start (imports, inventory, connect)"),
        ("planning_s", "planning (all stages, facts included)"),
        ("execute_s", "executing the operations"),
    ):
        if key in profile:
            print(f"  {label:<40} {profile[key]:6.2f} s")
    print(f"  {'stage':<40} {'plan s':>7} {'facts':>5} {'facts s':>7} {'ops':>4} {'exec s':>7}")
    for row in per_stage(profile):
        print(
            f"  {row['stage']:<40} {row['plan_s']:7.2f} {row.get('facts', 0):5d} "
            f"{row.get('facts_s', 0.0):7.2f} {row.get('ops', 0):4d} {row.get('exec_s', 0.0):7.2f}"
        )
    facts = sorted(profile.get("facts", []), key=lambda f: -f["seconds"])[:12]
    print("  slowest fact commands:")
    for fact in facts:
        print(
            f"    {fact['seconds']:6.3f} s  {fact['stage']:<18} {fact['fact']} {fact['args'][:70]}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the box up afterwards")
    parser.add_argument(
        "--boxes", type=int, default=1, help="boot this many sandbox boxes (1 to 4) and deploy all"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="deploy on the box already up (profiling only)"
    )
    args = parser.parse_args()

    out = HERE / "results"
    out.mkdir(exist_ok=True)
    suffix = "" if args.boxes == 1 else f"_{args.boxes}boxes"
    boot = 0.0
    if not args.reuse:
        demo.sandbox("down", check=False)
        start = time.monotonic()
        demo.sandbox("up", "--boxes", str(args.boxes))
        boot = time.monotonic() - start
    first, first_profile = profiled_deploy(out / f"profile_first{suffix}.json")
    second, noop_profile = profiled_deploy(out / f"profile_noop{suffix}.json")
    # the same no-op run without the final quick checks: what verify_after_deploy costs
    unchecked, _ = profiled_deploy(
        out / f"profile_noop_unchecked{suffix}.json", ("--data", "verify_after_deploy=false")
    )
    # and without the read-ahead (gpubox.infra.readahead): every fact read on the box as it comes
    unread, _ = profiled_deploy(
        out / f"profile_noop_no_readahead{suffix}.json", env=("GPUBOX_READAHEAD=0",)
    )
    if not args.keep and not args.reuse:
        demo.sandbox("down", check=False)
    runs = (first, second, unchecked, unread)
    if any(run.rc != 0 for run in runs):
        print("a deploy failed:", *(run.output[-2000:] for run in runs), file=sys.stderr)
        return 1
    ratio = second.seconds / first.seconds if first.seconds else float("nan")
    figures = {
        "boxes": args.boxes,
        "reused_box": args.reuse,
        "sandbox_up_s": round(boot, 1),
        "first_deploy_s": round(first.seconds, 1),
        "first_deploy_operations": first.operations,
        "first_deploy_changed": first.changed,
        "noop_deploy_s": round(second.seconds, 1),
        "noop_deploy_operations": second.operations,
        "noop_deploy_changed": second.changed,
        "noop_over_first": round(ratio, 3),
        "noop_deploy_without_checks_s": round(unchecked.seconds, 1),
        "noop_deploy_without_readahead_s": round(unread.seconds, 1),
        "noop_readahead": noop_profile.get("readahead", {}),
        "noop_per_stage": per_stage(noop_profile),
        "first_per_stage": per_stage(first_profile),
    }
    show_profile("first deploy, per stage", first.seconds, first_profile)
    show_profile("no-op re-deploy, per stage", second.seconds, noop_profile)
    print()
    print(f"boxes:                         {args.boxes:6d}")
    print(f"sandbox up (fresh copy, boot):  {boot:6.1f} s")
    print(
        f"first deploy/full.py:          {first.seconds:6.1f} s  "
        f"{first.operations} operations, {first.changed} changed"
        + ("  (reused box: not a first deploy)" if args.reuse else "")
    )
    print(
        f"no-op re-deploy:               {second.seconds:6.1f} s  "
        f"{second.operations} operations, {second.changed} changed"
    )
    print(f"no-op / first:                 {ratio:6.1%}")
    print(
        f"no-op, verify_after_deploy off: {unchecked.seconds:5.1f} s  "
        f"(the quick checks cost {second.seconds - unchecked.seconds:.1f} s)"
    )
    print(
        f"no-op, read-ahead off:         {unread.seconds:6.1f} s  "
        f"(the read-ahead saves {unread.seconds - second.seconds:.1f} s)"
    )
    for name, seen in sorted(noop_profile.get("readahead", {}).items()):
        print(
            f"  read-ahead on {name}: {seen.get('served', 0)} of {seen.get('read', 0)} fact "
            f"commands answered from one round trip ({seen.get('fill_s', 0.0):.2f} s); "
            f"{seen.get('live', 0)} read on the box"
            + (f" (after: {seen['ended_by']})" if seen.get("ended_by") else "")
        )
    (out / f"deploy_timing{suffix}.json").write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
