"""The monitoring stage's plan (issue 31 A and C, docs/monitoring.md): who monitors whom, where
the monitor reaches each box's exporters, and the text of every file the stage writes:
prometheus.yml, alertmanager.yml (without its secrets: the box puts them in), the
distribution's /etc/default files, the metrics relay's settings and gpubox-config.prom. Pure:
the inventory's hosts come in as their configs and SSH addresses.

Every host of the inventory is listed, not only those a run acts on (pyinfra's --limit), so
a run limited to some hosts writes the same scrape configuration as a whole run."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from gpubox.base import layout
from gpubox.config import HostConfig
from gpubox.config.monitoring_rules import (
    JOB_ADDRESS_KEYS,
    host_port,
    is_loopback,
    is_wildcard,
    jobs,
    monitors,
)
from gpubox.knowledge import driver_lifecycle, metrics, render_secrets

# The backend job's targets through a box's metrics relay: a scrape configuration of its own
# (the monitor's own backend is read directly, with the API key), relabeled to the one job the
# rules select.
RELAYED_JOB = f"{metrics.JOB_BACKEND}-relay"
METRICS_PATH = "/metrics"  # llama-server's (--metrics) and vLLM's
# Debian 12's prometheus-node-exporter 1.5 leaves out mount points under /mnt and /media (its
# default --collector.filesystem.mount-points-exclude); gpubox's keeps the pseudo filesystems
# and container layers out, and lets a model_dir under /mnt or /media be seen (ModelVolumeFull).
MOUNT_POINTS_EXCLUDE = "^/(dev|proc|run|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)"
# The placeholder for a secret in alertmanager.yml's template: the box replaces it with the
# named file's content, quoted (gpubox.knowledge.render_secrets), so the secret never leaves
# its file on the monitor.
SECRET = render_secrets.PLACEHOLDER
# Repeat intervals by severity: a critical alert is sent again every hour while it fires.
REPEAT = {"critical": "1h", "warning": "4h", "info": "24h"}
# The interval the shipped rules' `for:` durations are written for (monitoring_interval's
# default): a rule's `for:` counts evaluations, so another interval scales it (rules_for).
RULES_INTERVAL_S = 30
FOR_LINE = re.compile(r"^(\s+for: )(\d+)([smh])$", re.M)
UNIT_S = {"s": 1, "m": 60, "h": 3600}


def rules_for(text: str, interval_s: int) -> str:
    """The shipped rules file as the monitor runs it: each alert's ``for:`` is written for an
    evaluation every RULES_INTERVAL_S seconds (``for: 1m``: two more evaluations that still
    see the fault) and keeps that count of evaluations at ``interval_s`` (1m at 30 s is 10s at
    5 s, 2m at 60 s). Nothing else changes: the range windows (``[5m]``, ``[1h]``) and the
    thresholds stay what promtool's tests test. At the default interval the text is the
    shipped file, byte for byte."""
    if interval_s == RULES_INTERVAL_S:
        return text

    def scaled(match: re.Match[str]) -> str:
        seconds = int(match[2]) * UNIT_S[match[3]]
        if seconds == 0:
            return match[0]
        return f"{match[1]}{math.ceil(seconds * interval_s / RULES_INTERVAL_S)}s"

    return FOR_LINE.sub(scaled, text)


def bracket(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def local(address: str) -> str:
    """Where the box itself reaches a service listening on ``address``."""
    return "127.0.0.1" if is_wildcard(address) else address


def is_monitored(configs: Mapping[str, HostConfig]) -> bool:
    return bool(monitors(configs))


@dataclass(frozen=True)
class Target:
    job: str  # metrics.JOBS' name; the backend's through a relay too
    host: str  # the inventory's name for the box
    address: str  # HOST:PORT the monitor scrapes
    direct: bool = True  # False: the backend's /metrics through the box's relay


def listen(config: HostConfig, job: str) -> tuple[str, int]:
    """The address and port the job's exporter listens on, on the box."""
    if job == metrics.JOB_BACKEND:
        return str(config.api_host), int(config.api_port)
    address_key, port_key = JOB_ADDRESS_KEYS[job]
    return str(config.values[address_key]), int(config.values[port_key])


def target(name: str, config: HostConfig, job: str, monitor: str, ssh_host: str) -> Target:
    """Where ``monitor`` scrapes box ``name``'s ``job``: monitoring_targets' entry; the box's
    own exporters on its loopback for the monitor itself (the backend's API directly);
    another box's at its listen address, or its SSH address where that is a wildcard (the
    backend's through the relay)."""
    direct = job != metrics.JOB_BACKEND or name == monitor
    explicit = host_port(config.monitoring_targets.get(job))
    if explicit is not None:
        return Target(job, name, f"{bracket(explicit[0])}:{explicit[1]}", direct)
    if name == monitor:
        address, port = listen(config, job)
        return Target(job, name, f"{bracket(local(address))}:{port}")
    address_key, port_key = JOB_ADDRESS_KEYS[job]
    address, port = str(config.values[address_key]), int(config.values[port_key])
    if is_wildcard(address) or is_loopback(address):  # loopback: refused by validation
        address = ssh_host
    return Target(job, name, f"{bracket(address)}:{port}", direct)


def targets(
    monitor: str, configs: Mapping[str, HostConfig], ssh_hosts: Mapping[str, str]
) -> list[Target]:
    """Every target of the fleet, box by box in inventory order."""
    return [
        target(name, config, job, monitor, ssh_hosts.get(name, name))
        for name, config in configs.items()
        for job in jobs(config)
    ]


def _static(found: list[Target]) -> list[dict[str, Any]]:
    return [{"targets": [t.address], "labels": {metrics.HOST_LABEL: t.host}} for t in found]


def prometheus_config(
    monitor: str, configs: Mapping[str, HostConfig], ssh_hosts: Mapping[str, str]
) -> dict[str, Any]:
    """prometheus.yml as data: the rules, the local Alertmanager, one scrape configuration per
    job (the relayed backends in one more, relabeled to the backend job), ``host`` on every
    target."""
    own = configs[monitor]
    interval = f"{own.monitoring_interval}s"
    found = targets(monitor, configs, ssh_hosts)
    scrape: list[dict[str, Any]] = []
    for job in metrics.JOBS:
        mine = [t for t in found if t.job == job and t.direct]
        if not mine:
            continue
        entry: dict[str, Any] = {"job_name": job, "static_configs": _static(mine)}
        if job == metrics.JOB_BACKEND:
            entry["metrics_path"] = METRICS_PATH
            entry["authorization"] = {"credentials_file": layout.PROMETHEUS_API_KEY}
        scrape.append(entry)
    relayed = [t for t in found if not t.direct]
    if relayed:
        scrape.append(
            {
                "job_name": RELAYED_JOB,
                "metrics_path": METRICS_PATH,
                "static_configs": _static(relayed),
                "relabel_configs": [{"target_label": "job", "replacement": metrics.JOB_BACKEND}],
            }
        )
    alertmanager = f"{bracket(local(own.alertmanager_address))}:{own.alertmanager_port}"
    return {
        "global": {
            "scrape_interval": interval,
            "evaluation_interval": interval,
            # Prometheus refuses a timeout longer than the interval; its default is 10s
            "scrape_timeout": f"{min(10, own.monitoring_interval)}s",
        },
        "rule_files": [layout.PROMETHEUS_RULES],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": scrape,
    }


def _dump(data: dict[str, Any], what: str) -> str:
    return f"# Managed by gpubox ({what}; docs/monitoring.md): edits are replaced.\n" + (
        yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    )


def prometheus_yml(
    monitor: str, configs: Mapping[str, HostConfig], ssh_hosts: Mapping[str, str]
) -> str:
    return _dump(prometheus_config(monitor, configs, ssh_hosts), "the monitoring stage")


def receivers(config: HostConfig) -> dict[str, Any]:
    """The one receiver the alerts go to: a webhook and/or e-mail from the keys, their
    secrets as placeholders the box fills in; "null" (no notification: the alerts stay on
    Alertmanager's page and API, and in gpubox doctor) when no key names one."""
    receiver: dict[str, Any] = {"name": "gpubox"}
    if config.alert_webhook_url_file:
        receiver["webhook_configs"] = [
            {"url": SECRET.format(path=config.alert_webhook_url_file), "send_resolved": True}
        ]
    if config.alert_email_to:
        email: dict[str, Any] = {
            "to": config.alert_email_to,
            "from": config.alert_email_from,
            "smarthost": config.alert_smtp_smarthost,
            "send_resolved": True,
        }
        if config.alert_smtp_username:
            email["auth_username"] = config.alert_smtp_username
            email["auth_password"] = SECRET.format(path=config.alert_smtp_password_file)
        receiver["email_configs"] = [email]
    return receiver if len(receiver) > 1 else {"name": "null"}


def alertmanager_config(config: HostConfig) -> dict[str, Any]:
    """alertmanager.yml as data: every alert grouped by box and name, routed by severity (how
    often a firing alert is sent again) to the receiver."""
    receiver = receivers(config)
    name = receiver["name"]
    return {
        "route": {
            "receiver": name,
            "group_by": ["alertname", metrics.HOST_LABEL],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": REPEAT["warning"],
            "routes": [
                {"matchers": [f'severity="{severity}"'], "receiver": name, "repeat_interval": r}
                for severity, r in REPEAT.items()
            ],
        },
        "receivers": [receiver],
    }


def alertmanager_template(config: HostConfig) -> str:
    """alertmanager.yml with its secrets as placeholders (the box renders the real file)."""
    return _dump(alertmanager_config(config), "rendered on the box with its secrets' files")


def secret_files(text: str) -> list[str]:
    """The files a template's placeholders name."""
    return render_secrets.PATTERN.findall(text)


def _defaults(unit: str, args: list[str]) -> str:
    return (
        f"# Managed by gpubox (docs/monitoring.md): {unit}'s arguments; edits are replaced.\n"
        f'ARGS="{" ".join(args)}"\n'
    )


def node_exporter_defaults(config: HostConfig) -> str:
    address = f"{bracket(config.node_exporter_address)}:{config.node_exporter_port}"
    if is_wildcard(config.node_exporter_address):
        address = f":{config.node_exporter_port}"
    return _defaults(
        layout.NODE_EXPORTER,
        [
            f"--web.listen-address={address}",
            f"--collector.textfile.directory={layout.TEXTFILE_DIR}",
            f"--collector.filesystem.mount-points-exclude={MOUNT_POINTS_EXCLUDE}",
        ],
    )


def prometheus_defaults(config: HostConfig) -> str:
    return _defaults(
        layout.PROMETHEUS,
        [
            f"--web.listen-address={bracket(config.prometheus_address)}:{config.prometheus_port}",
            f"--storage.tsdb.retention.time={config.monitoring_retention}",
        ],
    )


def alertmanager_defaults(config: HostConfig) -> str:
    address = f"{bracket(config.alertmanager_address)}:{config.alertmanager_port}"
    # an empty cluster address: no gossip listener (it would bind 9094 on every interface)
    return _defaults(
        layout.ALERTMANAGER, [f"--web.listen-address={address}", "--cluster.listen-address="]
    )


def relay_settings(config: HostConfig) -> dict[str, Any]:
    """What the metrics relay reads (no secret: it reads the key from its file each time)."""
    api = f"http://{bracket(local(str(config.api_host)))}:{config.api_port}{METRICS_PATH}"
    return {
        "listen_address": ""
        if is_wildcard(config.metrics_relay_address)
        else (config.metrics_relay_address.strip("[]")),
        "listen_port": config.metrics_relay_port,
        "upstream": api,
        "key_file": config.api_key_file,
        "timeout_s": 10,
        "max_bytes": 32 * 1024 * 1024,
    }


def relay_wanted(name: str, config: HostConfig, configs: Mapping[str, HostConfig]) -> bool:
    """A relay on a box that serves and that a monitor on another box scrapes."""
    return config.backend != "none" and any(m != name for m in monitors(configs))


def config_samples(config: HostConfig) -> list[metrics.Sample]:
    """gpubox-config.prom's samples: what the keys and the catalog say, nothing measured, so
    the file changes only when they do."""
    samples: list[metrics.Sample] = [
        ("gpubox_gpus_expected", {}, config.gpu_count),
        ("gpubox_output_tokens_per_second_floor", {}, config.output_tokens_per_second_floor),
    ]
    branch = str(config.driver_branch)
    try:
        life = driver_lifecycle.lifecycle(branch, config.catalog["driver"]["branches"])
    except ValueError:
        return samples
    if life.eol is not None or life.status is not None:
        samples.append(
            (
                "gpubox_driver_branch_end_of_life_timestamp_seconds",
                {"branch": branch},
                metrics.end_of_life_timestamp(life.eol),
            )
        )
    return samples


def config_textfile(config: HostConfig) -> str:
    return metrics.exposition(config_samples(config))


def wait_command(config: HostConfig) -> str:
    """After Prometheus (re)starts or reloads: wait until it is ready and has scraped every
    target once (none "unknown"), so that the deploy's final checks judge the targets' real
    health. Bounded: two scrape intervals and a minute; a timeout says what it waited for."""
    base = f"http://{bracket(local(config.prometheus_address))}:{config.prometheus_port}"
    limit = 2 * config.monitoring_interval + 60
    return (
        f"for i in $(seq {limit}); do "
        f"if curl -fsS --max-time 5 {base}/-/ready >/dev/null 2>&1 && "
        f"curl -fsS --max-time 5 '{base}/api/v1/targets?state=active' 2>/dev/null "
        "| grep -q '\"activeTargets\":\\[{' && "
        f"! curl -fsS --max-time 5 '{base}/api/v1/targets?state=active' 2>/dev/null "
        '| grep -q \'"health":"unknown"\'; then exit 0; fi; sleep 1; done; '
        f"echo 'Prometheus on {base} did not scrape every target within {limit} s' >&2; exit 1"
    )
