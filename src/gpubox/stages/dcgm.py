"""Stage: NVIDIA DCGM 4 (host engine, dcgmi), with the proprietary profiling module the
NVLink fields 1011/1012 need on V100; the host engine bound to localhost; optionally
dcgm-exporter."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from gpubox import operations, preflight
from gpubox.config import HostConfig
from gpubox.facts import CommandOutput
from gpubox.stages import ManagedFiles, current_config, render
from gpubox.stages.nvidia_repo import nvidia_repo

PIN_FILE = "/etc/apt/preferences.d/90-gpubox-dcgm"
DCGM_DROPIN = "/etc/systemd/system/nvidia-dcgm.service.d/gpubox.conf"
EXPORTER_UNIT = "/etc/systemd/system/gpubox-dcgm-exporter.service"
# Where nv-hostengine listens: the drop-in binds it to this address; the port is its default
# (the drop-in sets no --port). dcgm-exporter connects here instead of embedding a second engine.
HOSTENGINE_ADDRESS = "127.0.0.1"
HOSTENGINE_PORT = 5555


def listen_address(address: str, port: int) -> str:
    """ADDRESS:PORT as Go's listeners take it: an IPv6 address in brackets, "" for all."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def exporter_unit(config: HostConfig) -> str:
    """The dcgm-exporter unit: the host's network, the host's engine."""
    return render(
        "dcgm-exporter.service.j2",
        image=config.catalog["dcgm"]["exporter_image"],
        listen=listen_address(config.dcgm_exporter_address, config.dcgm_exporter_port),
        hostengine=listen_address(HOSTENGINE_ADDRESS, HOSTENGINE_PORT),
    )


@deploy("DCGM")
def dcgm() -> None:
    config = current_config()
    target = preflight.run(config)
    catalog = config.catalog["dcgm"]
    packages, version = catalog["packages"], catalog["version"]

    files = {
        PIN_FILE: render("apt-pin-exact.j2", what="DCGM", version=version, packages=packages),
        DCGM_DROPIN: render("nvidia-dcgm.conf.j2", address=HOSTENGINE_ADDRESS),
    }
    image = catalog["exporter_image"]
    if config.dcgm_exporter:
        files[EXPORTER_UNIT] = exporter_unit(config)
    managed = ManagedFiles(files)
    pin = managed.put("Pin DCGM to one version", PIN_FILE)
    nvidia_repo(config, target, also_changed=[pin])
    apt.packages(
        name="Remove the legacy DCGM packages",
        packages=catalog["legacy_packages"],
        present=False,
    )
    apt.packages(
        name=f"Install DCGM {version} (with the profiling module)",
        packages=[f"{name}={version}" for name in packages],
        allow_downgrades=True,
        extra_install_args="--allow-change-held-packages",
    )
    operations.apt_hold(name="Hold the DCGM packages", packages=packages)

    dropin = managed.put("nvidia-dcgm: the host engine on localhost only", DCGM_DROPIN)
    systemd.daemon_reload(name="Reload systemd units (nvidia-dcgm)", _if=dropin.did_change)
    systemd.service(
        name="nvidia-dcgm running and enabled", service="nvidia-dcgm", running=True, enabled=True
    )
    systemd.service(
        name="Restart nvidia-dcgm with its new settings",
        service="nvidia-dcgm",
        restarted=True,
        _if=dropin.did_change,
    )

    if config.dcgm_exporter:
        present = host.get_fact(
            CommandOutput,
            command=f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}",
        ).strip()
        if not present:
            server.shell(
                name=f"Pull {image} (once)", commands=[f"docker pull {shlex.quote(image)}"]
            )
        unit = managed.put("dcgm-exporter unit", EXPORTER_UNIT)
        systemd.daemon_reload(name="Reload systemd units (dcgm-exporter)", _if=unit.did_change)
        systemd.service(
            name="dcgm-exporter running and enabled",
            service="gpubox-dcgm-exporter",
            running=True,
            enabled=True,
        )
        systemd.service(
            name="Restart dcgm-exporter with its new settings",
            service="gpubox-dcgm-exporter",
            restarted=True,
            _if=unit.did_change,
        )
