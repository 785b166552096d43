"""Stage: NVIDIA DCGM 4 (host engine, dcgmi), with the proprietary profiling module the
NVLink fields 1011/1012 need on V100; the host engine bound to localhost; optionally
dcgm-exporter."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, server

from gpubox.base import layout
from gpubox.base.rendering import FILES, render
from gpubox.config import HostConfig
from gpubox.infra.host_facts import CommandOutput
from gpubox.infra.operations import ManagedFiles
from gpubox.ops import units
from gpubox.ops.apt_repo import nvidia_repo
from gpubox.ops.packages import install_pinned
from gpubox.preflight import answers
from gpubox.preflight import gate as preflight
from gpubox.stages import current_config

# Where nv-hostengine listens (gpubox.base.layout, where the checks read it too).
HOSTENGINE_ADDRESS = layout.HOSTENGINE_ADDRESS
HOSTENGINE_PORT = layout.HOSTENGINE_PORT


def listen_address(address: str, port: int) -> str:
    """ADDRESS:PORT as Go's listeners take it: an IPv6 address in brackets, "" for all."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def exporter_unit(config: HostConfig) -> str:
    """The dcgm-exporter unit: the host's network, the host's engine, named by the host's name
    (read at each start) so that the exporter's Hostname label is the box's
    (gpubox.knowledge.exporter_label), and that name mapped to the engine's address in the
    container."""
    return render(
        "dcgm-exporter.service.j2",
        image=config.catalog["dcgm"]["exporter_image"],
        listen=listen_address(config.dcgm_exporter_address, config.dcgm_exporter_port),
        hostengine=listen_address(HOSTENGINE_ADDRESS, HOSTENGINE_PORT),
        engine_address=HOSTENGINE_ADDRESS,
        engine_port=HOSTENGINE_PORT,
        counters=layout.DCGM_COUNTERS,
        counters_in=layout.DCGM_COUNTERS_IN_CONTAINER,
    )


def counters_text() -> str:
    """gpubox's counters file (files/monitoring/dcgm-counters.csv): the exporter's defaults
    and the counters the alert rules read."""
    return (FILES / "monitoring" / "dcgm-counters.csv").read_text(encoding="utf-8")


@deploy("DCGM")
def dcgm() -> None:
    config = current_config()
    target = preflight.run(config)
    catalog = config.catalog["dcgm"]
    packages, version = catalog["packages"], catalog["version"]

    files = {
        layout.DCGM_PIN: render(
            "apt-pin-exact.j2", what="DCGM", version=version, packages=packages
        ),
        layout.DCGM_DROPIN: render("nvidia-dcgm.conf.j2", address=HOSTENGINE_ADDRESS),
    }
    image = catalog["exporter_image"]
    if config.dcgm_exporter:
        files[layout.DCGM_EXPORTER_UNIT_FILE] = exporter_unit(config)
        files[layout.DCGM_COUNTERS] = counters_text()
    managed = ManagedFiles(files)
    pin = managed.put("Pin DCGM to one version", layout.DCGM_PIN)
    nvidia_repo(config, target, also_changed=[pin])
    apt.packages(
        name="Remove the legacy DCGM packages",
        packages=catalog["legacy_packages"],
        present=False,
    )
    install_pinned(
        f"Install DCGM {version} (with the profiling module)",
        packages,
        version,
        hold="Hold the DCGM packages",
    )

    dropin = managed.put("nvidia-dcgm: the host engine on localhost only", layout.DCGM_DROPIN)
    units.reload_units(dropin, label="nvidia-dcgm")
    units.keep_running(layout.DCGM, "nvidia-dcgm", dropin)

    if config.dcgm_exporter:
        present = host.get_fact(
            CommandOutput,
            command=f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}",
        ).strip()
        if not present:
            server.shell(
                name=f"Pull {image} (once)", commands=[f"docker pull {shlex.quote(image)}"]
            )
        counters = managed.put("dcgm-exporter's counters", layout.DCGM_COUNTERS)
        unit = managed.put("dcgm-exporter unit", layout.DCGM_EXPORTER_UNIT_FILE)
        units.reload_units(unit, label="dcgm-exporter")
        units.keep_running(layout.DCGM_EXPORTER, "dcgm-exporter", unit, counters)
    answers.keep_answers()  # this run's answers, kept (only if they changed)
