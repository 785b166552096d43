"""gpubox's box metrics on a monitored box (docs/monitoring.md, "gpubox's own metrics"): the
program gpubox.knowledge.box_metrics (uploaded whole), its settings, and a systemd timer that
runs it every monitoring_interval seconds as a oneshot service, writing the node exporter's
textfile ``gpubox-box.prom``. ``box_metrics(config)``, called by the monitoring stage for every
monitored host, changes nothing on a re-run that changes no key.

Also the one question the writers of gpubox's textfiles share: is the fleet monitored
(``monitored``), and where is a writer's file (``textfile``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pyinfra import host, inventory
from pyinfra.operations import systemd

from gpubox.base import layout
from gpubox.base.errors import DeployRefused
from gpubox.base.rendering import render
from gpubox.config import HostConfig, target_for
from gpubox.infra.host_facts import CommandOutput, OsRelease, read_once
from gpubox.infra.operations import ManagedFiles
from gpubox.knowledge import box_metrics as program
from gpubox.knowledge import metrics
from gpubox.ops import units
from gpubox.plans import checkpoint
from gpubox.plans import model as model_plan

PYTHON = "/usr/bin/python3"
TEXTFILE_DIR = layout.TEXTFILE_DIR
CONFIG_FILE = layout.BOX_METRICS_CONFIG
UNIT = "gpubox-box-metrics"  # the service and its timer
TIMER = f"{UNIT}.timer"
UNIT_FILE = layout.unit_file(UNIT)
TIMER_FILE = f"{layout.SYSTEMD_DIR}/{TIMER}"
SCRIPT = "/usr/local/lib/gpubox/gpubox-box-metrics"
STATE_FILE = f"{layout.STATE_DIR}/box-metrics.json"


def textfile(writer: str) -> str:
    """Where ``writer`` (gpubox.knowledge.metrics' writers) writes its file on the box."""
    return f"{TEXTFILE_DIR}/{metrics.TEXTFILE_NAME[writer]}"


def monitored(hosts: Iterable[Any] | None = None) -> bool:
    """Whether the inventory has a monitor (a host with monitoring "prometheus"): then every
    host of it is monitored. Every host counts, under --limit too (pyinfra's inventory holds
    them all)."""
    # each host's data ("none", the key's default, when unset): the other hosts' configs are
    # not built here
    return any(
        str(each.data.get("monitoring") or "none") == "prometheus"
        for each in (inventory if hosts is None else hosts)
    )


def driver_package(config: HostConfig, family: str) -> str | None:
    """The driver's kernel module package the deploy installs (its DKMS package): the
    installed driver's version is its version."""
    return next((n for n in config.driver_packages(family).installed if "dkms" in n), None)


def model_settings(config: HostConfig) -> dict[str, Any] | None:
    """What the program reads of the model download: the GGUF file (llama.cpp), the
    checkpoint's directory (vLLM), nothing without a backend."""
    if config.backend == "llamacpp":
        p = model_plan.plan(config)
        return {"kind": "file", "name": p.file, "path": p.path, "marker": p.marker, "size": p.size}
    if config.backend == "vllm":
        c = checkpoint.plan(config)
        return {"kind": "directory", "name": c.repo, "path": c.directory, "marker": c.marker}
    return None


def settings(config: HostConfig, family: str) -> dict[str, Any]:
    """What the program reads from CONFIG_FILE (no secret)."""
    return {
        "textfile": textfile(metrics.BOX),
        "state_file": STATE_FILE,
        "driver_package": driver_package(config, family),
        "model_dir": config.model_dir,
        "model": model_settings(config),
    }


def unit_files(config: HostConfig, family: str) -> dict[str, str]:
    """The settings, the service and the timer (mode 0644)."""
    return {
        CONFIG_FILE: json.dumps(settings(config, family), indent=1, sort_keys=True) + "\n",
        UNIT_FILE: render(
            "gpubox-box-metrics.service.j2",
            timer=TIMER,
            textfile=textfile(metrics.BOX),
            python=PYTHON,
            script=SCRIPT,
            config_file=CONFIG_FILE,
            identifier=UNIT,
        ),
        TIMER_FILE: render(
            "gpubox-box-metrics.timer.j2",
            service=f"{UNIT}.service",
            interval=config.monitoring_interval,
        ),
    }


def script_text() -> str:
    return Path(program.__file__).read_text(encoding="utf-8")


def box_metrics(config: HostConfig) -> None:
    """The program, its settings, service and timer on the box; the timer running and
    enabled, restarted only when its interval changed."""
    # the OS family names the driver's packages (the stages' preflight read it already)
    target = target_for(read_once(OsRelease), config.catalog)
    if target is None:
        raise DeployRefused(f"{host.name}: box metrics: the OS is not one gpubox supports")
    # python3: the monitoring stage, which calls this, installs it first
    code = ManagedFiles({SCRIPT: script_text()}, mode="0755")
    code.put("The box metrics' program", SCRIPT)
    files = ManagedFiles(unit_files(config, target.family))
    files.put("The box metrics' settings", CONFIG_FILE)
    service = files.put("The box metrics' service", UNIT_FILE)
    timer = files.put("The box metrics' timer", TIMER_FILE)
    units.reload_units(service, timer, label="box metrics")
    # the program and its settings are read at each run: only the timer's interval needs a
    # restart of the timer
    units.keep_running(TIMER, "the box metrics' timer", timer)


def stop() -> None:
    """The timer stopped and disabled where it is installed: for a host of a fleet that is no
    longer monitored (the monitoring stage calls it for every host that is not)."""
    present = host.get_fact(
        CommandOutput, command=f"systemctl list-unit-files {TIMER} --no-legend"
    ).strip()
    if present:
        systemd.service(
            name="Stop and disable the box metrics (no monitor in the inventory)",
            service=TIMER,
            running=False,
            enabled=False,
        )
