"""The sandbox's boxes watched as a fleet (issue 31 E): inventories/sandbox.py's hosts with the
monitoring keys set on top, as an inventory of one's own does it (docs/sandbox.md). Box 1 is
the monitor (Prometheus, Alertmanager, the rules); every box runs the node exporter and
dcgm-exporter; box 2 and up are reached through their bridges into box 1's network namespace
(gpubox.sandbox.fleet: each exporter's port plus ten per box). The intervals are shortened
through the keys, not code paths: Prometheus scrapes and evaluates every 3 s (the rules'
`for: 1m` becomes 6 s), and the watchdog probes every 2 s and restarts a server after two
failed probes, so a planted fault fires its alert within the rules' own `for:` plus a few
seconds."""

import runpy
from pathlib import Path

from gpubox.sandbox import monitoring_targets
from gpubox.sandbox.identity import MAX_BOXES, box_name

_sandbox = runpy.run_path(str(Path(__file__).with_name("sandbox.py")))  # "_": not a group

MONITORING = {
    "dcgm_exporter": True,
    "monitoring_interval": 3,
    # the watchdog, fast: a run 2 s after the last one ended, each probe waiting 1 s, a
    # restart after 2 failures, and a start's warm-up of 3 s (the tiny model loads in about
    # 0.03 s on the box's CPU; llama-server answers /health within a second of its start)
    "watchdog_interval_s": 2,
    "watchdog_timeout_s": 1,
    "watchdog_failures": 2,
    "watchdog_grace_s": 3,
    "watchdog_completion_every_s": 0,
}


_NUMBERS = {box_name(k): k for k in range(1, MAX_BOXES + 1)}


def _monitored(k, data):
    extra = {"monitoring": "prometheus"} if k == 1 else {}
    if k > 1:
        extra["monitoring_targets"] = monitoring_targets(k, backend=data["backend"] != "none")
    return {**data, **MONITORING, **extra}


hosts = [(name, _monitored(_NUMBERS[name], data)) for name, data in _sandbox["hosts"]]
