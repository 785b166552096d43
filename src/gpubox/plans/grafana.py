"""What the Grafana stage (gpubox.stages.grafana) writes on the fleet's monitor: the unit that
runs the catalog's image, the provisioning of the Prometheus datasource (the uid the dashboard
names, knowledge/dashboard.py) and of gpubox's dashboard, and the dashboard itself. Pure: the
host's configuration in, file contents out.

Grafana listens on grafana_address:grafana_port (loopback by default: reach it through an SSH
tunnel, docs/monitoring.md#the-dashboard). Its admin password is generated on the box, root
only, and handed to Grafana as a file (GF_SECURITY_ADMIN_PASSWORD__FILE, Grafana's Docker
image reads a variable's value from the file named by VARIABLE__FILE): the container's user,
grafana (uid 472), is in group 0 (GF_GID 0 in Grafana's Dockerfile), so the file is 0640
root:root on the box and readable by no other user there."""

from __future__ import annotations

import yaml

from gpubox.base import layout
from gpubox.base.rendering import render
from gpubox.config import HostConfig
from gpubox.knowledge import dashboard

# Where the files appear inside the container.
PROVISIONING_IN_CONTAINER = "/etc/grafana/provisioning"
PASSWORD_IN_CONTAINER = "/run/secrets/gpubox-grafana-admin-password"
DATA_IN_CONTAINER = "/var/lib/grafana"
DATASOURCE_NAME = "Prometheus (gpubox)"
FOLDER = "gpubox"


def _host(address: str) -> str:
    """An address to connect to: loopback for one that means every interface, IPv6 bracketed."""
    if address in ("", "0.0.0.0", "::"):
        address = "127.0.0.1"
    return f"[{address}]" if ":" in address else address


def prometheus_url(config: HostConfig) -> str:
    """Where Grafana (on the monitor's own network) reaches the monitor's Prometheus."""
    return f"http://{_host(config.prometheus_address)}:{config.prometheus_port}"


def datasource(config: HostConfig) -> str:
    """Grafana's datasource provisioning file: the monitor's Prometheus, under the uid every
    panel of the dashboard names; its scrape interval, so that $__rate_interval spans enough
    samples."""
    data = {
        "apiVersion": 1,
        "datasources": [
            {
                "name": DATASOURCE_NAME,
                "type": "prometheus",
                "uid": dashboard.DATASOURCE_UID,
                "access": "proxy",
                "url": prometheus_url(config),
                "isDefault": True,
                "editable": False,
                "jsonData": {"timeInterval": f"{config.monitoring_interval}s"},
            }
        ],
    }
    return "# Managed by gpubox (gpubox.plans.grafana)\n" + yaml.safe_dump(data, sort_keys=False)


def dashboard_provider() -> str:
    """Grafana's dashboard provisioning file: the dashboards of layout.GRAFANA_DASHBOARDS, in
    the folder gpubox, not to be deleted or saved over from the UI (a deploy rewrites them)."""
    data = {
        "apiVersion": 1,
        "providers": [
            {
                "name": "gpubox",
                "orgId": 1,
                "folder": FOLDER,
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 60,
                "options": {"path": layout.GRAFANA_DASHBOARDS},
            }
        ],
    }
    return "# Managed by gpubox (gpubox.plans.grafana)\n" + yaml.safe_dump(data, sort_keys=False)


def dashboard_text() -> str:
    """The packaged dashboard, uploaded as it is."""
    return dashboard.DASHBOARD_FILE.read_text(encoding="utf-8")


def environment(config: HostConfig) -> list[tuple[str, str]]:
    return [
        ("GF_SERVER_HTTP_ADDR", config.grafana_address),
        ("GF_SERVER_HTTP_PORT", str(config.grafana_port)),
        ("GF_SECURITY_ADMIN_USER", "admin"),
        ("GF_SECURITY_ADMIN_PASSWORD__FILE", PASSWORD_IN_CONTAINER),
        ("GF_AUTH_ANONYMOUS_ENABLED", "false"),
        ("GF_USERS_ALLOW_SIGN_UP", "false"),
        # a monitor may have no way out: no phoning home
        ("GF_ANALYTICS_REPORTING_ENABLED", "false"),
        ("GF_ANALYTICS_CHECK_FOR_UPDATES", "false"),
        ("GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES", "false"),
        ("GF_NEWS_NEWS_FEED_ENABLED", "false"),
    ]


def mounts() -> list[tuple[str, str]]:
    return [
        (layout.GRAFANA_ADMIN_PASSWORD, f"{PASSWORD_IN_CONTAINER}:ro"),
        (layout.GRAFANA_PROVISIONING, f"{PROVISIONING_IN_CONTAINER}:ro"),
        (layout.GRAFANA_DASHBOARDS, f"{layout.GRAFANA_DASHBOARDS}:ro"),
        (layout.GRAFANA_VOLUME, DATA_IN_CONTAINER),
    ]


def unit(config: HostConfig) -> str:
    return render(
        "gpubox-grafana.service.j2",
        name=layout.GRAFANA,
        image=image(config),
        version=config.catalog["grafana"]["version"],
        listen=f"{config.grafana_address}:{config.grafana_port}",
        prometheus=prometheus_url(config),
        password_in_container=PASSWORD_IN_CONTAINER,
        volume=layout.GRAFANA_VOLUME,
        environment=environment(config),
        mounts=mounts(),
    )


def image(config: HostConfig) -> str:
    return str(config.catalog["grafana"]["image"])


def files(config: HostConfig) -> dict[str, str]:
    """Every file the stage manages (mode 0644; the password file is the stage's own)."""
    return {
        layout.GRAFANA_UNIT_FILE: unit(config),
        layout.GRAFANA_DATASOURCE: datasource(config),
        layout.GRAFANA_DASHBOARD_PROVIDER: dashboard_provider(),
        layout.GRAFANA_DASHBOARD: dashboard_text(),
    }
