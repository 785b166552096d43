"""The short bench of `gpubox deploy --canary` (gpubox.commands.canary): one host's served API
measured as `gpubox bench --inventory` measures it (through the SSH tunnel when the API listens
on the box's loopback, the key read from the box unless $GPUBOX_API_KEY gives one), with the
settings gpubox.rules.canary.short_bench chose, at one concurrency level. Nothing is recorded:
the host's baseline stays its last `gpubox bench`.

It runs in a child Python process (``measure_in_child``): the deploy read the inventory with
pyinfra's CLI, which patches threads and sockets with gevent, and the bench's threads and
clocks must not run under it. The child reads {"host", "data", "settings"} as JSON on stdin
and prints {"output_throughput": tok/s} or {"error": why} as JSON on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from gpubox import config
from gpubox.bench.cli import INVENTORY_KEYS, Target, bench_target
from gpubox.bench.client import KEY_ENV
from gpubox.bench.records import host_url
from gpubox.bench.runner import Settings

# seconds without data before a request of the short bench fails
TIMEOUT_S = 300.0


def bench_data(data: dict[str, Any]) -> dict[str, Any]:
    """The host data the bench needs (its SSH connection and API), defaults filled in."""
    kept = {k: data[k] for k in INVENTORY_KEYS if k in data}
    for name in INVENTORY_KEYS[-4:]:  # api_host, api_port, api_key_file, model_alias
        kept.setdefault(name, config.KEYS_BY_NAME[name].default)
    return kept


def measure(host: str, data: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """{"output_throughput": tok/s} of one level, or {"error": why}."""
    data = bench_data(data)
    url = host_url(host, data.get("ssh_hostname"), int(data["api_port"]))
    target = Target(host, url, str(data["model_alias"]), data)
    run = Settings(**settings, timeout=TIMEOUT_S)
    _, report, problem, _ = bench_target(target, os.environ.get(KEY_ENV) or None, run)
    if report is None:
        return {"error": problem or "not measured"}
    level = report["levels"][0]
    if level["failed"]:
        total = level["failed"] + level["completed"]
        return {"error": f"{level['failed']} of {total} requests failed"}
    return {"output_throughput": float(level["output_throughput"])}


def measure_in_child(host: str, data: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``measure`` in a child Python process (see the module's docstring)."""
    document = {"host": host, "data": bench_data(data), "settings": settings}
    proc = subprocess.run(
        [sys.executable, "-m", "gpubox.bench.canary"],
        input=json.dumps(document),
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"the bench stopped (exit {proc.returncode}) without an answer"}
    return answer if isinstance(answer, dict) else {"error": "the bench answered no object"}


def main() -> int:
    document = json.load(sys.stdin)
    answer = measure(document["host"], document["data"], document["settings"])
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
