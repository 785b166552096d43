"""Stage: Grafana on the fleet's monitor (key grafana; docs/monitoring.md#the-dashboard), a
container of the catalog's image pinned by digest, pulled once, provisioned with the monitor's
Prometheus and gpubox's dashboard (gpubox.plans.grafana). Only on the host with monitoring
"prometheus" (validation refuses grafana without it); with grafana false, a Grafana gpubox
installed is stopped and disabled (its volume, its files and the image are left)."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server, systemd

from gpubox.base import layout
from gpubox.config import HostConfig
from gpubox.infra.host_facts import CommandOutput
from gpubox.infra.operations import ManagedFiles
from gpubox.ops import units
from gpubox.plans import grafana as plan
from gpubox.preflight import gate as preflight
from gpubox.stages import current_config


def admin_password() -> object:
    """The admin password, generated on the box at the first deploy (0640 root:root: the
    container's grafana user is in group 0); never printed, never on a command line."""
    q = shlex.quote(layout.GRAFANA_ADMIN_PASSWORD)
    present = host.get_fact(CommandOutput, command=f"test -s {q} && echo yes").strip()
    if present == "yes":
        return None
    return server.shell(
        name=f"Generate Grafana's admin password ({layout.GRAFANA_ADMIN_PASSWORD}, root only)",
        commands=[
            f"mkdir -p $(dirname {q}) && umask 077 && "
            f"head -c 24 /dev/urandom | base64 | tr -d '/+=\\n' > {q} && "
            f"chown root:root {q} && chmod 640 {q}"
        ],
    )


def pull(config: HostConfig) -> None:
    """The image, pulled once by its digest (the unit never pulls)."""
    image = plan.image(config)
    present = host.get_fact(
        CommandOutput,
        command=f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}",
    ).strip()
    if not present:
        server.shell(name=f"Pull {image} (once)", commands=[f"docker pull {shlex.quote(image)}"])


def stop() -> None:
    """A Grafana gpubox installed, stopped and disabled (grafana false)."""
    present = host.get_fact(
        CommandOutput, command=f"systemctl list-unit-files {layout.GRAFANA}.service --no-legend"
    ).strip()
    if present:
        systemd.service(
            name="Stop and disable Grafana (grafana false)",
            service=layout.GRAFANA,
            running=False,
            enabled=False,
        )


@deploy("Grafana")
def grafana() -> None:
    config = current_config()
    preflight.run(config)
    if not config.grafana:
        stop()
        return
    pull(config)
    admin_password()
    managed = ManagedFiles(plan.files(config))
    datasource = managed.put(
        "Grafana's datasource (the monitor's Prometheus)", layout.GRAFANA_DATASOURCE
    )
    provider = managed.put("Grafana's dashboard provider", layout.GRAFANA_DASHBOARD_PROVIDER)
    # the provider reads the dashboards' folder again every minute: a new dashboard needs no
    # restart
    managed.put("gpubox's dashboard", layout.GRAFANA_DASHBOARD)
    unit = managed.put("Grafana's unit", layout.GRAFANA_UNIT_FILE)
    units.reload_units(unit, label="grafana")
    # Grafana reads its provisioning at start only
    units.keep_running(layout.GRAFANA, "Grafana", unit, datasource, provider)
