"""Checks of DCGM (deploy/dcgm.py fixes them)."""

from __future__ import annotations

import re

from gpubox.base import layout
from gpubox.checks.core import Check, Reading
from gpubox.checks.docker import pinned_and_held
from gpubox.checks.driver import service_up
from gpubox.checks.facts import NVLINK_FIELDS
from gpubox.config import HostConfig
from gpubox.knowledge.exporter_label import hostname_labels

_LOCAL = re.compile(r"^(127\.\d+\.\d+\.\d+|\[::1\]):\d+$")


def localhost_only(c: HostConfig, r: Reading) -> str | None:
    addresses = [
        line.split()[3] for line in r.get("listening").splitlines() if "nv-hostengine" in line
    ]
    if not addresses:
        return "nv-hostengine listens on no TCP port"
    exposed = [a for a in addresses if not _LOCAL.match(a)]
    return f"nv-hostengine listens beyond localhost: {exposed}" if exposed else None


def discovery(c: HostConfig, r: Reading) -> str | None:
    gpus = r.get("dcgm_discovery")
    if len(gpus) != c.gpu_count:
        return f"dcgmi discovery lists {len(gpus)} GPU(s), expected {c.gpu_count}"
    return None


def dmon_nvlink(c: HostConfig, r: Reading) -> str | None:
    # The profiling fields (1011/1012) read N/A in the first samples after a start: take three.
    latest = r.get("dcgm_dmon").latest
    missing = [
        f"{entity} {column}"
        for entity, values in latest.items()
        for column, value in values.items()
        if value is None
    ]
    if len(latest) == c.gpu_count and not missing:
        return None
    return (
        f"dcgmi dmon -e {NVLINK_FIELDS}: {len(latest)} GPU(s); no value for {missing} "
        "(1011/1012 need datacenter-gpu-manager-4-proprietary)"
    )


def exporter(c: HostConfig, r: Reading) -> list[str]:
    metrics = r.get("exporter_metrics")
    return [
        f"dcgm-exporter's /metrics has no {name}"
        for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")
        if name not in metrics
    ]


def exporter_hostname(c: HostConfig, r: Reading) -> str | None:
    """Every Hostname label on /metrics is the box's own name (the exporter takes it from
    --remote-hostengine-info: gpubox.knowledge.exporter_label)."""
    name = r.get("hostname")
    labels = hostname_labels(r.get("exporter_metrics"))
    if not labels:
        return f'dcgm-exporter\'s /metrics has no Hostname label (expected Hostname="{name}")'
    wrong = sorted({label for label in labels if label != name})
    if not wrong:
        return None
    seen = ", ".join(f'Hostname="{label}"' for label in wrong)
    return (
        f'dcgm-exporter labels its metrics {seen}, not this box\'s name "{name}": its unit must '
        f"name the host engine --remote-hostengine-info {name}:{layout.HOSTENGINE_PORT} (with "
        f"--add-host {name}:{layout.HOSTENGINE_ADDRESS}), as gpubox's unit does"
    )


def _exporter_on(c: HostConfig) -> str | None:
    return None if c.dcgm_exporter else "dcgm_exporter is off in the inventory"


CHECKS = [
    Check(
        "dcgm.packages",
        "the DCGM packages are pinned and held",
        "quick",
        ("dpkg", "holds"),
        pinned_and_held("DCGM packages", "dcgm"),
    ),
    Check(
        "dcgm.service",
        "nvidia-dcgm is active and enabled",
        "quick",
        ("services",),
        service_up(layout.DCGM),
        fix="sudo systemctl start nvidia-dcgm; {deploy}",
    ),
    Check(
        "dcgm.localhost",
        "the host engine listens on localhost only",
        "quick",
        ("listening",),
        localhost_only,
    ),
    Check(
        "dcgm.discovery",
        "dcgmi discovers every GPU",
        "gpu",
        ("dcgm_discovery",),
        discovery,
        fix="sudo systemctl restart nvidia-dcgm; {deploy}",
    ),
    Check(
        "dcgm.nvlink-fields",
        "dcgmi dmon reports the NVLink fields for every GPU",
        "gpu",
        ("dcgm_dmon",),
        dmon_nvlink,
    ),
    Check(
        "dcgm.exporter",
        "dcgm-exporter serves GPU and NVLink metrics",
        "gpu",
        ("exporter_metrics",),
        exporter,
        applies=_exporter_on,
    ),
    Check(
        "dcgm.exporter-hostname",
        "dcgm-exporter's metrics carry the box's hostname",
        "gpu",
        ("exporter_metrics", "hostname"),
        exporter_hostname,
        fix=f"systemctl cat {layout.DCGM_EXPORTER} (a drop-in's ExecStart overrides gpubox's); "
        "{deploy}",
        applies=_exporter_on,
    ),
]
