"""Stage: monitoring (issue 31 A and C, docs/monitoring.md). Nothing at all unless a host of
the inventory has monitoring "prometheus" (the monitor). Then every host of the inventory is
monitored: the distribution's node exporter (no recommends: Debian's
prometheus-node-exporter-collectors would add timers of its own), its arguments, the textfile
directory and gpubox-config.prom (the keys' values: gpubox.plans.monitoring), gpubox's
box-metrics timer (gpubox.ops.box_metrics), and, on a box that serves and whose monitor is
another box, the metrics relay. The monitor also gets Prometheus and Alertmanager from the
distribution, their arguments, prometheus.yml (the whole inventory, even under --limit), the
alert rules, the API key's copy for its own backend, and alertmanager.yml rendered on the box
with the receivers' secrets.

The /etc/default files and configurations are written before the packages are installed, so
the daemons start on the addresses of the keys, never on every interface (dpkg keeps a
conffile that is already there: pyinfra's apt passes --force-confold). Every file changes
only when the keys do, so a re-deploy changes nothing."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, server

from gpubox.base import layout
from gpubox.base.rendering import FILES, render
from gpubox.config import HostConfig
from gpubox.infra.host_facts import CommandOutput
from gpubox.infra.operations import ManagedFiles, fail
from gpubox.knowledge import metrics_relay, render_secrets
from gpubox.ops import box_metrics, units
from gpubox.plans import monitoring as plan
from gpubox.stages import all_configs, current_config

PYTHON = "/usr/bin/python3"
NODE_PACKAGES = ["prometheus-node-exporter"]
MONITOR_PACKAGES = ["prometheus", "prometheus-alertmanager"]
PROMTOOL = "/usr/bin/promtool"


def ssh_hosts() -> dict[str, str]:
    """Each host's SSH address (pyinfra's ssh_hostname, else its name): where a monitor on
    another box reaches an exporter that listens on every interface."""
    return {h.name: str(h.data.get("ssh_hostname") or h.name) for h in inventory}


def rules_text(config: HostConfig) -> str:
    """The shipped rules, their ``for:`` counted at the monitor's interval (plans.rules_for)."""
    shipped = (FILES / "monitoring" / "alerts.yml").read_text(encoding="utf-8")
    return plan.rules_for(shipped, config.monitoring_interval)


def program(module: Any) -> str:
    return Path(module.__file__).read_text(encoding="utf-8")


def node_files(config: HostConfig) -> dict[str, str]:
    return {
        layout.NODE_EXPORTER_DEFAULTS: plan.node_exporter_defaults(config),
        layout.TEXTFILE_CONFIG: plan.config_textfile(config),
    }


def relay_files(config: HostConfig) -> dict[str, str]:
    return {
        layout.METRICS_RELAY_CONFIG: json.dumps(plan.relay_settings(config), indent=1) + "\n",
        layout.METRICS_RELAY_UNIT_FILE: render(
            "gpubox-metrics-relay.service.j2",
            listen=f"{config.metrics_relay_address}:{config.metrics_relay_port}",
            upstream=plan.relay_settings(config)["upstream"],
            python=PYTHON,
            script=layout.METRICS_RELAY_SCRIPT,
            config_file=layout.METRICS_RELAY_CONFIG,
            unit=layout.METRICS_RELAY,
        ),
    }


def monitor_files(
    config: HostConfig, name: str, configs: dict[str, HostConfig], ssh: dict[str, str]
) -> dict[str, str]:
    return {
        layout.PROMETHEUS_DEFAULTS: plan.prometheus_defaults(config),
        layout.ALERTMANAGER_DEFAULTS: plan.alertmanager_defaults(config),
        layout.PROMETHEUS_CONFIG: plan.prometheus_yml(name, configs, ssh),
        layout.PROMETHEUS_RULES: rules_text(config),
    }


def install(name: str, packages: list[str]) -> Any:
    """The distribution's packages, without their recommends; apt's lists refreshed and the
    packages installed only when one is missing (a converged box changes nothing)."""
    installed = host.get_fact(DebPackages)
    if all(p in installed for p in packages):
        return None
    return apt.packages(name=name, packages=packages, no_recommends=True, update=True)


def python3() -> None:
    if not host.get_fact(CommandOutput, command=f"test -x {PYTHON} && echo yes").strip():
        apt.packages(name="python3 for gpubox's programs", packages=["python3"], update=True)


def node(config: HostConfig, relay: bool) -> None:
    """The node exporter, gpubox's textfile and timer, and the relay where one is wanted."""
    managed = ManagedFiles(node_files(config))
    defaults = managed.put("The node exporter's arguments", layout.NODE_EXPORTER_DEFAULTS)
    installed = install("Install the node exporter (the distribution's)", NODE_PACKAGES)
    # the package makes the textfile directory; the upload makes it too where it is gone
    managed.put("gpubox-config.prom (the keys' values)", layout.TEXTFILE_CONFIG)
    units.keep_running(layout.NODE_EXPORTER, "the node exporter", defaults, installed)
    box_metrics.box_metrics(config)
    if relay:
        code = ManagedFiles({layout.METRICS_RELAY_SCRIPT: program(metrics_relay)}, mode="0755")
        script = code.put("The metrics relay's program", layout.METRICS_RELAY_SCRIPT)
        managed_relay = ManagedFiles(relay_files(config))
        settings = managed_relay.put("The metrics relay's settings", layout.METRICS_RELAY_CONFIG)
        unit = managed_relay.put("The metrics relay's unit", layout.METRICS_RELAY_UNIT_FILE)
        units.reload_units(unit, label="metrics relay")
        units.keep_running(layout.METRICS_RELAY, "the metrics relay", unit, settings, script)


def secret_files_present(config: HostConfig) -> bool:
    """The receivers' secrets' files are on the monitor; else the host stops, naming the key."""
    for key in ("alert_webhook_url_file", "alert_smtp_password_file"):
        path = config.values[key]
        if path is None:
            continue
        there = host.get_fact(CommandOutput, command=f"test -f {shlex.quote(path)} && echo yes")
        if not there.strip():
            fail(
                name=f"{key}: the secret's file",
                message=f"{key}: {path} is not on the monitor; write it there (root-only, "
                "docs/monitoring.md#receivers) and deploy again",
            )
            return False
    return True


def copy_api_key(config: HostConfig) -> Any:
    """The monitor's own backend's API key, copied for Prometheus (0640, root and the group of
    the user Prometheus's unit runs as, asked from systemd), by a command that never shows it."""
    if config.backend == "none":
        return None
    q = shlex.quote
    group = f'g=$(id -gn "$(systemctl show -P User {layout.PROMETHEUS})")'
    current = host.get_fact(
        CommandOutput,
        command=f"{group} && cmp -s {q(config.api_key_file)} {layout.PROMETHEUS_API_KEY} && "
        f'[ "$(stat -c %a:%U:%G {layout.PROMETHEUS_API_KEY})" = "640:root:$g" ] && echo same',
    )
    return server.shell(
        name="The API key, readable by Prometheus (0640)",
        commands=[
            f'{group} && install -m 0640 -o root -g "$g" {q(config.api_key_file)} '
            f"{layout.PROMETHEUS_API_KEY}"
        ],
        _if=lambda: current.strip() != "same",
    )


def alertmanager_config(config: HostConfig) -> Any:
    """alertmanager.yml, rendered on the box from its template and the secrets' files
    (gpubox.knowledge.render_secrets): only when the result would differ."""
    code = ManagedFiles({layout.ALERTMANAGER_RENDER: program(render_secrets)}, mode="0755")
    script = code.put("The secrets' renderer", layout.ALERTMANAGER_RENDER)
    template = ManagedFiles(
        {layout.ALERTMANAGER_TEMPLATE: plan.alertmanager_template(config)}, mode="0600"
    )
    changed = template.put("alertmanager.yml's template (no secret)", layout.ALERTMANAGER_TEMPLATE)
    args = f"{layout.ALERTMANAGER_TEMPLATE} {layout.ALERTMANAGER_CONFIG} {layout.ALERTMANAGER}"
    state = host.get_fact(
        CommandOutput,
        command=f"test -x {layout.ALERTMANAGER_RENDER} && "
        f"{PYTHON} {layout.ALERTMANAGER_RENDER} --check {args}",
    )
    return server.shell(
        name="alertmanager.yml with the receivers' secrets (0640)",
        commands=[f"{PYTHON} {layout.ALERTMANAGER_RENDER} {args}"],
        _if=units.changed(changed, script, stopped=state.strip() != "same"),
    )


def monitor(config: HostConfig, configs: dict[str, HostConfig]) -> None:
    managed = ManagedFiles(monitor_files(config, host.name, configs, ssh_hosts()))
    prom_args = managed.put("Prometheus's arguments", layout.PROMETHEUS_DEFAULTS)
    am_args = managed.put("Alertmanager's arguments", layout.ALERTMANAGER_DEFAULTS)
    prom_config = managed.put(
        "prometheus.yml (every host of the inventory)", layout.PROMETHEUS_CONFIG
    )
    rules = managed.put("The alert rules", layout.PROMETHEUS_RULES)
    installed = install(
        "Install Prometheus and Alertmanager (the distribution's)", MONITOR_PACKAGES
    )
    if not secret_files_present(config):
        return
    key = copy_api_key(config)
    rendered = alertmanager_config(config)
    server.shell(
        name="promtool check config",
        commands=[f"{PROMTOOL} check config {layout.PROMETHEUS_CONFIG}"],
        _if=units.changed(prom_config, rules, key),
    )
    units.keep_running(layout.PROMETHEUS, "Prometheus", prom_args, installed)
    units.restart_on_change(
        layout.PROMETHEUS,
        "Reload Prometheus's configuration and rules",
        prom_config,
        rules,
        key,
        reload=True,
    )
    units.keep_running(layout.ALERTMANAGER, "Alertmanager", am_args, rendered, installed)
    server.shell(
        name="Wait for Prometheus's first scrape of every target",
        commands=[plan.wait_command(config)],
        _if=units.changed(prom_args, installed, prom_config, rules, key),
    )


@deploy("Monitoring")
def monitoring() -> None:
    config = current_config()
    configs = all_configs()
    if not plan.is_monitored(configs):
        box_metrics.stop()  # a fleet no longer monitored: its timer stopped (docs/monitoring.md)
        return  # no monitor in the inventory: nothing else (docs/monitoring.md)
    python3()
    node(config, plan.relay_wanted(host.name, config, configs))
    if config.monitoring == "prometheus":
        monitor(config, configs)
