"""The monitoring keys' rules (gpubox.config.monitoring_rules, issue 31 A and C): each error names
the key(s) to change; the fleet's rules (a monitored box runs dcgm-exporter; an exporter on
loopback cannot be reached by a monitor on another box) come with every host of the inventory,
in `gpubox check` and before a deploy changes anything."""

from __future__ import annotations

import pytest
from helpers import REFERENCE

from gpubox import cli
from gpubox.config import fleet_problems, load_host_config, validate

MONITOR = {**REFERENCE, "monitoring": "prometheus", "dcgm_exporter": True}
BOX = {**REFERENCE, "dcgm_exporter": True}


def errors(data: dict) -> list[tuple[str, str]]:
    _, problems = validate("b", data)
    return [(p.key, p.message) for p in problems if p.severity == "error"]


def keys(data: dict) -> list[str]:
    return [key for key, _ in errors(data)]


def test_the_defaults_are_valid_and_monitor_nothing():
    config = load_host_config("b", REFERENCE)
    assert config.monitoring == "none" and config.monitoring_interval == 30
    assert config.monitoring_retention == "15d" and config.output_tokens_per_second_floor == 5.0
    assert fleet_problems({"b": config}) == []


@pytest.mark.parametrize("retention", ["15", "15days", "0d", "1.5d", "-1d", ""])
def test_a_bad_retention_is_refused_by_name(retention):
    assert keys({**MONITOR, "monitoring_retention": retention}) == ["monitoring_retention"]


@pytest.mark.parametrize("retention", ["15d", "90d", "12h", "2w", "1y"])
def test_a_retention_prometheus_takes_is_accepted(retention):
    assert errors({**MONITOR, "monitoring_retention": retention}) == []


def test_the_monitor_itself_needs_dcgm_exporter():
    found = errors({**REFERENCE, "monitoring": "prometheus"})
    assert [k for k, _ in found] == ["dcgm_exporter"]
    assert "this host is the monitor" in found[0][1]


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"alert_email_to": "ops@example.org"}, "alert_email_from"),
        (
            {"alert_email_to": "ops@example.org", "alert_email_from": "g@example.org"},
            "alert_smtp_smarthost",
        ),
        ({"alert_smtp_smarthost": "smtp.example.org:587"}, "alert_email_to"),
    ],
)
def test_an_email_receiver_half_set_names_the_missing_key(given, named):
    found = errors({**MONITOR, **given})
    assert [k for k, _ in found] == [named]
    assert "missing" in found[0][1]


EMAIL = {
    "alert_email_to": "ops@example.org",
    "alert_email_from": "gpubox@example.org",
    "alert_smtp_smarthost": "smtp.example.org:587",
}


def test_the_smtp_login_needs_both_its_keys_and_the_email_receiver():
    assert keys({**MONITOR, **EMAIL, "alert_smtp_username": "g"}) == ["alert_smtp_password_file"]
    assert keys({**MONITOR, **EMAIL, "alert_smtp_password_file": "/etc/gpubox/smtp"}) == [
        "alert_smtp_username"
    ]
    both = {"alert_smtp_username": "g", "alert_smtp_password_file": "/etc/gpubox/smtp"}
    assert keys({**MONITOR, **EMAIL, **both}) == []
    assert keys({**MONITOR, **both}) == ["alert_smtp_username"]


def test_a_smarthost_without_a_port_and_a_relative_secret_file_are_refused():
    assert keys({**MONITOR, **EMAIL, "alert_smtp_smarthost": "smtp.example.org"}) == [
        "alert_smtp_smarthost"
    ]
    assert keys({**MONITOR, "alert_webhook_url_file": "webhook-url"}) == ["alert_webhook_url_file"]
    assert keys({**MONITOR, "alert_webhook_url_file": "/etc/gpubox/webhook-url"}) == []


def test_monitoring_targets_take_the_jobs_as_host_port():
    assert keys({**BOX, "monitoring_targets": {"node": "10.0.0.5:9100"}}) == []
    found = errors({**BOX, "monitoring_targets": {"nodes": "10.0.0.5:9100"}})
    assert found[0][0] == "monitoring_targets" and "'nodes' is not a job" in found[0][1]
    assert keys({**BOX, "monitoring_targets": {"dcgm": "10.0.0.5"}}) == ["monitoring_targets"]


def fleet(**boxes: dict) -> list[tuple[str, str, str]]:
    configs = {name: load_host_config(name, data) for name, data in boxes.items()}
    return [(p.host, p.key, p.message) for p in fleet_problems(configs)]


def test_a_monitored_box_without_dcgm_exporter_is_refused_naming_the_key_and_the_monitor():
    found = fleet(m=MONITOR, b={**REFERENCE, "monitoring_targets": TARGETS})
    assert [(h, k) for h, k, _ in found] == [("b", "dcgm_exporter")]
    assert "m has monitoring 'prometheus'" in found[0][2]


TARGETS = {"node": "10.0.0.2:9100", "dcgm": "10.0.0.2:9400", "backend": "10.0.0.2:9401"}


def test_a_loopback_exporter_with_a_monitor_on_another_box_names_both_keys():
    found = fleet(m=MONITOR, b=BOX)
    assert [(h, k) for h, k, _ in found] == [
        ("b", "node_exporter_address"),
        ("b", "dcgm_exporter_address"),
        ("b", "metrics_relay_address"),
    ]
    assert all("monitoring_targets" in message and "m" in message for _, _, message in found)
    # each fixed either way: an address the monitor reaches, or a monitoring_targets entry
    fixed = {
        **BOX,
        "node_exporter_address": "10.0.0.2",
        "dcgm_exporter_address": "0.0.0.0",
        "monitoring_targets": {"backend": "10.0.0.2:9401"},
    }
    assert fleet(m=MONITOR, b=fixed) == []
    # a box that serves nothing has no backend target, so no relay to reach
    served_nothing = {**BOX, "backend": "none", "monitoring_targets": TARGETS}
    assert fleet(m=MONITOR, b=served_nothing) == []
    # the monitor's own exporters stay on its loopback
    assert fleet(m=MONITOR) == []


def test_gpubox_check_reports_the_fleets_problems(tmp_path, capsys):
    inventory = tmp_path / "fleet.py"
    inventory.write_text(
        f"hosts = [('m', {MONITOR!r}), ('b', {{**{MONITOR!r}, 'monitoring': 'none'}})]\n"
    )
    assert cli.main(["check", str(inventory)]) == 2
    out = capsys.readouterr().out
    assert "error: b: node_exporter_address: 127.0.0.1 is loopback but the monitor m" in out
    assert "error: b: metrics_relay_address:" in out
    fixed = tmp_path / "fixed.py"
    fixed.write_text(
        f"hosts = [('m', {MONITOR!r}), ('b', {{**{BOX!r}, 'monitoring_targets': {TARGETS!r}}})]\n"
    )
    assert cli.main(["check", str(fixed)]) == 0
