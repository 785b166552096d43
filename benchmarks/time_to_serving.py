"""Benchmark: time to serving with the model's download in the background (figures, not
assertions).

Two fresh sandbox boxes, one after the other:

1. unthrottled: the first deploy/full.py. Its wall time is "the rest" R: everything but the
   model's download (the sandbox's model is under 1 MB: its download takes well under a
   second unthrottled).
2. the model's download slowed down so that it takes a known time T (by default T = R, so
   that a sequential deploy and an overlapped one differ most): the Hub mirror's rate control
   (gpubox.sandbox.hub) is set to size / T for the model file alone, so the rest of the
   deploy (the llama.cpp source, the packages) runs at the speed of run 1. The first deploy's
   wall time W is compared with the sum R + T (what a deploy that downloads in sequence
   takes) and the maximum max(R, T) (the best an overlapped deploy can do).

`gpubox sandbox up --download-rate` throttles every server the sandbox runs itself; it is the
knob for slowing the whole box down, not for choosing T: the llama.cpp source (about 76 MB)
would then dominate the rest.

Usage, as root: .venv/bin/python benchmarks/time_to_serving.py [--download-s T]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gpubox import sandbox
from gpubox.commands import demo
from gpubox.sandbox import hub

# The download is slowed on purpose to a few kB/s: the stall watchdog (which counts bytes on
# disk) is set out of the way, so that the bench measures the overlap and nothing else.
STALL_S = 3600


def first_deploy(*extra: str) -> demo.DeployRun:
    run = demo.deploy(extra=("--data", f"download_stall_s={STALL_S}", *extra))
    if run.rc != 0 or run.failed_hosts:
        raise SystemExit(f"the first deploy failed:\n{run.output[-3000:]}")
    return run


def fresh_box() -> dict:
    demo.sandbox("down", check=False)
    demo.sandbox("up")
    return dict(sandbox.box_info())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--download-s", type=float, default=0.0, help="T, the download's time (default: R)"
    )
    args = parser.parse_args()

    fresh_box()
    rest = first_deploy().seconds

    info = fresh_box()
    size = int(info["model_size"])
    t = args.download_s or rest
    rate = max(hub.MIN_RATE, int(size / t))
    t = size / rate
    Path(info["hub_control"]).write_text(json.dumps({"rate": rate}))
    started = time.monotonic()
    try:
        run = first_deploy()
    finally:
        Path(info["hub_control"]).write_text("{}")
    wall = time.monotonic() - started
    gets = [
        e
        for e in hub.read_log(Path(info["hub_request_log"]))
        if e["method"] == "GET" and e["path"].endswith("/" + info["model_file"])
    ]
    served = sum(int(e.get("bytes") or 0) for e in gets)
    demo.sandbox("down", check=False)

    longest, total = max(rest, t), rest + t
    figures = {
        "rest_s": round(rest, 1),
        "download_s": round(t, 1),
        "download_rate_bytes_per_s": rate,
        "model_bytes": size,
        "model_bytes_served": served,
        "download_over_rest": round(t / rest, 2),
        "sequential_s": round(total, 1),
        "overlapped_max_s": round(longest, 1),
        "first_deploy_s": round(run.seconds, 1),
        "first_deploy_over_max": round(wall / longest, 3),
        "first_deploy_over_sum": round(wall / total, 3),
    }
    print(f"the rest of the deploy (R, unthrottled first deploy): {rest:7.1f} s")
    print(f"the model's download alone (T, {size} B at {rate} B/s): {t:6.1f} s  T/R {t / rest:.2f}")
    print(f"sequential (R + T):                                {total:7.1f} s")
    print(f"overlapped at best (max(R, T)):                    {longest:7.1f} s")
    print(
        f"first deploy, download in the background:          {wall:7.1f} s  "
        f"({wall / longest:.1%} of max, {wall / total:.1%} of the sum)"
    )
    print(f"model bytes served by the mirror: {served} of {size} ({served / size:.2f}x)")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "time_to_serving.json").write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
