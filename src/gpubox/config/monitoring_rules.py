"""The monitoring keys' rules (issue 31 A and C, docs/monitoring.md): each host's own
(retention, targets, the receivers' keys set together) and the fleet's, which need every host
of the inventory (``fleet_problems``: a monitored box runs dcgm-exporter, and its exporters
listen where a monitor on another box can reach them). Pure."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

from gpubox.config.host import HostConfig, Problem
from gpubox.knowledge import metrics

RETENTION = re.compile(r"[1-9][0-9]*(s|m|h|d|w|y)")
HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")

# Each job's exporter, by the key of the address it listens on (the backend's: the metrics
# relay, through which a monitor on another box reads the backend's /metrics).
JOB_ADDRESS_KEYS = {
    metrics.JOB_NODE: ("node_exporter_address", "node_exporter_port"),
    metrics.JOB_DCGM: ("dcgm_exporter_address", "dcgm_exporter_port"),
    metrics.JOB_BACKEND: ("metrics_relay_address", "metrics_relay_port"),
}


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 and localhost: only the box itself reaches it."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(address: str) -> bool:
    return address in ("", "0.0.0.0", "::", "[::]")


def host_port(value: object) -> tuple[str, int] | None:
    """ "HOST:PORT" split, or None when it is not one."""
    if not isinstance(value, str):
        return None
    match = HOST_PORT.fullmatch(value)
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        return None
    return match.group(1), int(match.group(2))


def monitoring_problems(
    host: str, values: dict[str, Any], valid: Callable[..., bool]
) -> list[Problem]:
    """One host's own monitoring keys."""
    found: list[Problem] = []
    retention = values["monitoring_retention"]
    if valid("monitoring_retention") and not RETENTION.fullmatch(retention):
        found.append(
            Problem(
                host,
                "monitoring_retention",
                f"must be a number and one of s m h d w y (like '15d'), got {retention!r}",
            )
        )
    targets = values["monitoring_targets"]
    if valid("monitoring_targets"):
        for job, target in targets.items():
            if job not in metrics.JOBS:
                found.append(
                    Problem(
                        host,
                        "monitoring_targets",
                        f"{job!r} is not a job; the jobs are {', '.join(metrics.JOBS)}",
                    )
                )
            elif host_port(target) is None:
                found.append(
                    Problem(
                        host,
                        "monitoring_targets",
                        f"{job}: must be 'HOST:PORT' (like '10.0.0.5:9100'), got {target!r}",
                    )
                )
    found += _receiver_problems(host, values, valid)
    if (
        values["monitoring"] == "prometheus"
        and valid("dcgm_exporter")
        and not values["dcgm_exporter"]
    ):
        found.append(_dcgm_problem(host, host))
    return found


def _receiver_problems(
    host: str, values: dict[str, Any], valid: Callable[..., bool]
) -> list[Problem]:
    """The e-mail receiver's keys go together: to, from and the smarthost; a login is a user
    name and a password file. The secrets' files are absolute paths on the monitor."""
    found: list[Problem] = []
    email = ("alert_email_to", "alert_email_from", "alert_smtp_smarthost")
    given = [k for k in email if values[k] is not None]
    if given and len(given) < len(email):
        missing = [k for k in email if values[k] is None]
        found.append(
            Problem(
                host,
                missing[0],
                f"must be set with {', '.join(given)} (e-mail needs "
                f"{', '.join(email)}); missing: {', '.join(missing)}",
            )
        )
    login = ("alert_smtp_username", "alert_smtp_password_file")
    set_login = [k for k in login if values[k] is not None]
    if len(set_login) == 1:
        other = next(k for k in login if k not in set_login)
        found.append(
            Problem(host, other, f"must be set with {set_login[0]} (the SMTP login needs both)")
        )
    if set_login and values["alert_email_to"] is None:
        found.append(
            Problem(
                host,
                set_login[0],
                "is set but alert_email_to is not: the SMTP login is for the e-mail receiver",
            )
        )
    smarthost = values["alert_smtp_smarthost"]
    if smarthost is not None and valid("alert_smtp_smarthost") and host_port(smarthost) is None:
        found.append(
            Problem(
                host,
                "alert_smtp_smarthost",
                f"must be 'HOST:PORT' (like 'smtp.example.org:587'), got {smarthost!r}",
            )
        )
    for name in ("alert_webhook_url_file", "alert_smtp_password_file"):
        path = values[name]
        if path is not None and valid(name) and not path.startswith("/"):
            found.append(
                Problem(host, name, f"must be an absolute path on the monitor, got {path!r}")
            )
    return found


def _dcgm_problem(host: str, monitor: str) -> Problem:
    by = "this host is the monitor" if host == monitor else f"{monitor} has monitoring 'prometheus'"
    return Problem(
        host,
        "dcgm_exporter",
        f"must be true: the box is monitored ({by}) and the GPU rules read dcgm-exporter",
    )


def monitors(configs: Mapping[str, HostConfig]) -> list[str]:
    """The hosts with monitoring "prometheus", in inventory order."""
    return [name for name, c in configs.items() if c.monitoring == "prometheus"]


def jobs(config: HostConfig) -> tuple[str, ...]:
    """The jobs a monitored box has targets in: no backend target when it serves nothing."""
    return tuple(j for j in metrics.JOBS if j != metrics.JOB_BACKEND or config.backend != "none")


def fleet_problems(configs: Mapping[str, HostConfig]) -> list[Problem]:
    """The rules that need the whole inventory: with a monitor, every host is monitored, so it
    runs dcgm-exporter, and each exporter a monitor on another box scrapes listens beyond
    loopback or has a monitoring_targets entry saying where that monitor reaches it."""
    found: list[Problem] = []
    watchers = monitors(configs)
    if not watchers:
        return found
    for name, config in configs.items():
        if not config.dcgm_exporter and name not in watchers:
            found.append(_dcgm_problem(name, watchers[0]))
        remote = [m for m in watchers if m != name]
        if not remote:
            continue
        for job in jobs(config):
            address_key, _ = JOB_ADDRESS_KEYS[job]
            address = str(config.values[address_key])
            if job in config.monitoring_targets or not is_loopback(address):
                continue
            found.append(
                Problem(
                    name,
                    address_key,
                    f"{address} is loopback but the monitor {remote[0]} is another "
                    f"box: set {address_key} to an address {remote[0]} reaches, or "
                    f"monitoring_targets {{'{job}': 'HOST:PORT'}} to where it reaches it",
                )
            )
    return found
