"""Benchmark: the first full deploy on a fresh sandbox box against the no-op re-deploy.

Prints wall time and operation counts of each run (figures, not assertions). Usage, as root:
    .venv/bin/python benchmarks/deploy_timing.py [--keep] [--boxes N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gpubox import demo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the box up afterwards")
    parser.add_argument(
        "--boxes", type=int, default=1, help="boot this many sandbox boxes (1 to 4) and deploy all"
    )
    args = parser.parse_args()

    demo.sandbox("down", check=False)
    start = time.monotonic()
    demo.sandbox("up", "--boxes", str(args.boxes))
    boot = time.monotonic() - start
    first = demo.deploy()
    second = demo.deploy()
    # the same no-op run without the final quick checks: what verify_after_deploy costs
    unchecked = demo.deploy(extra=("--data", "verify_after_deploy=false"))
    if not args.keep:
        demo.sandbox("down", check=False)
    if first.rc != 0 or second.rc != 0 or unchecked.rc != 0:
        print("a deploy failed:", first.output[-2000:], second.output[-2000:], file=sys.stderr)
        return 1
    ratio = second.seconds / first.seconds if first.seconds else float("nan")
    figures = {
        "boxes": args.boxes,
        "sandbox_up_s": round(boot, 1),
        "first_deploy_s": round(first.seconds, 1),
        "first_deploy_operations": first.operations,
        "first_deploy_changed": first.changed,
        "noop_deploy_s": round(second.seconds, 1),
        "noop_deploy_operations": second.operations,
        "noop_deploy_changed": second.changed,
        "noop_over_first": round(ratio, 3),
        "noop_deploy_without_checks_s": round(unchecked.seconds, 1),
    }
    print(f"boxes:                         {args.boxes:6d}")
    print(f"sandbox up (fresh copy, boot):  {boot:6.1f} s")
    print(
        f"first deploy/full.py:          {first.seconds:6.1f} s  "
        f"{first.operations} operations, {first.changed} changed"
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
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    name = "deploy_timing.json" if args.boxes == 1 else f"deploy_timing_{args.boxes}boxes.json"
    (out / name).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
