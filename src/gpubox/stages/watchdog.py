"""Stage: the watchdog of the API server (docs/watchdog.md). A systemd timer runs a oneshot
service every watchdog_interval_s that probes the backend's API and restarts its unit once
after watchdog_failures consecutive failures (gpubox.knowledge.watchdog, the script, uploaded
whole).
Its settings are a JSON file beside the API key (no secret in it: the script reads the key
from the key file). With no backend, or watchdog false, the timer is stopped and disabled."""

from __future__ import annotations

import json
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, systemd

from gpubox.base import layout
from gpubox.base.rendering import render
from gpubox.config import HostConfig
from gpubox.infra.host_facts import CommandOutput
from gpubox.infra.operations import ManagedFiles
from gpubox.knowledge import metrics
from gpubox.knowledge import watchdog as script
from gpubox.ops import box_metrics, units
from gpubox.stages import current_config

PYTHON = "/usr/bin/python3"


def api_url(config: HostConfig) -> str:
    """Where the script reaches the API on the box: the listening address, loopback for an
    address that means every interface."""
    address = str(config.api_host)
    if address in ("", "0.0.0.0", "::"):
        address = "127.0.0.1"
    return f"http://{f'[{address}]' if ':' in address else address}:{config.api_port}"


def settings(config: HostConfig, monitored: bool = False) -> dict[str, object]:
    """What the script reads from layout.WATCHDOG_CONFIG; ``monitored``: the fleet has a
    monitor, and each run writes its counters to the node exporter's textfile."""
    return {
        "backend": config.backend,
        "unit": layout.BACKEND_UNITS[config.backend],
        "url": api_url(config),
        "model": config.model_alias,
        "key_file": config.api_key_file,
        "state_file": layout.WATCHDOG_STATE,
        "interval_s": config.watchdog_interval_s,
        "failures": config.watchdog_failures,
        "grace_s": config.watchdog_grace_s,
        "busy_limit_s": config.watchdog_busy_limit_s,
        "timeout_s": config.watchdog_timeout_s,
        "completion_every_s": config.watchdog_completion_every_s,
        "textfile": box_metrics.textfile(metrics.WATCHDOG) if monitored else None,
    }


def unit_files(config: HostConfig, monitored: bool = False) -> dict[str, str]:
    """The settings, the service and the timer (mode 0644)."""
    server = layout.BACKEND_UNITS[config.backend]
    text = json.dumps(settings(config, monitored), indent=1, sort_keys=True) + "\n"
    return {
        layout.WATCHDOG_CONFIG: text,
        layout.WATCHDOG_UNIT_FILE: render(
            "gpubox-watchdog.service.j2",
            server=server,
            timer=layout.WATCHDOG_TIMER,
            failures=config.watchdog_failures,
            identifier=layout.WATCHDOG,
            state_file=layout.WATCHDOG_STATE,
            python=PYTHON,
            script=layout.WATCHDOG_SCRIPT,
            config_file=layout.WATCHDOG_CONFIG,
            # three answers (/health, a completion, /metrics) and the rest of the run
            run_timeout=3 * config.watchdog_timeout_s + 30,
        ),
        layout.WATCHDOG_TIMER_FILE: render(
            "gpubox-watchdog.timer.j2",
            service=f"{layout.WATCHDOG}.service",
            server=server,
            interval=config.watchdog_interval_s,
        ),
    }


def script_text() -> str:
    return Path(script.__file__).read_text(encoding="utf-8")


def stop() -> None:
    """The timer stopped and disabled, where it is installed."""
    present = host.get_fact(
        CommandOutput, command=f"systemctl list-unit-files {layout.WATCHDOG_TIMER} --no-legend"
    ).strip()
    if present:
        systemd.service(
            name="Stop and disable the watchdog (no backend, or watchdog false)",
            service=layout.WATCHDOG_TIMER,
            running=False,
            enabled=False,
        )


@deploy("Watchdog")
def watchdog() -> None:
    config = current_config()
    if config.backend == "none" or not config.watchdog:
        stop()
        return
    if not host.get_fact(CommandOutput, command=f"test -x {PYTHON} && echo yes").strip():
        apt.packages(name="python3 for the watchdog", packages=["python3"], update=True)
    code = ManagedFiles({layout.WATCHDOG_SCRIPT: script_text()}, mode="0755")
    code.put("The watchdog's script", layout.WATCHDOG_SCRIPT)
    files = ManagedFiles(unit_files(config, box_metrics.monitored()))
    files.put("The watchdog's settings", layout.WATCHDOG_CONFIG)
    service = files.put("The watchdog's service", layout.WATCHDOG_UNIT_FILE)
    timer = files.put("The watchdog's timer", layout.WATCHDOG_TIMER_FILE)
    units.reload_units(service, timer, label="watchdog")
    # the script and its settings are read at each run: only the timer's interval needs a
    # restart of the timer
    units.keep_running(layout.WATCHDOG_TIMER, "the watchdog's timer", timer)
