"""The monitoring stage's plan (gpubox.plans.monitoring, issue 31 A and C): prometheus.yml's exact
structure for one box and for a fleet (every target labeled host, the jobs the rules select, the
monitor's own backend read with the API key, another box's through its relay), promtool's check
of the generated file, alertmanager.yml's receivers from the keys with the secrets as
placeholders the box fills in, the /etc/default files' arguments, gpubox-config.prom, and the
dcgm-exporter counters file (upstream's defaults plus what the rules read)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from helpers import REFERENCE
from test_alert_rules import promtool

from gpubox.base import layout
from gpubox.base.rendering import FILES
from gpubox.config import load_host_config
from gpubox.knowledge import render_secrets
from gpubox.plans import monitoring as plan

MONITOR = {**REFERENCE, "monitoring": "prometheus", "dcgm_exporter": True}


def fleet() -> dict:
    """box1 the monitor (llama.cpp); box2 serves nothing, reached through the sandbox's bridges
    (monitoring_targets); box3 serves, its exporters on every interface (reached at its SSH
    address), its relay on a LAN address."""
    return {
        "box1": load_host_config("box1", MONITOR),
        "box2": load_host_config(
            "box2",
            {
                **REFERENCE,
                "dcgm_exporter": True,
                "backend": "none",
                "monitoring_targets": {"node": "127.0.0.1:9110", "dcgm": "127.0.0.1:9410"},
            },
        ),
        "box3": load_host_config(
            "box3",
            {
                **REFERENCE,
                "dcgm_exporter": True,
                "node_exporter_address": "0.0.0.0",
                "dcgm_exporter_address": "0.0.0.0",
                "metrics_relay_address": "10.0.0.3",
            },
        ),
    }


SSH = {"box1": "127.0.0.1", "box2": "127.0.0.1", "box3": "gpu3.lan"}


def test_one_box_is_its_own_monitor_on_loopback():
    config = load_host_config("box", MONITOR)
    data = yaml.safe_load(plan.prometheus_yml("box", {"box": config}, {"box": "10.1.1.1"}))
    assert data == {
        "global": {"scrape_interval": "30s", "evaluation_interval": "30s", "scrape_timeout": "10s"},
        "rule_files": ["/etc/prometheus/gpubox-alerts.yml"],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]},
        "scrape_configs": [
            {
                "job_name": "node",
                "static_configs": [{"targets": ["127.0.0.1:9100"], "labels": {"host": "box"}}],
            },
            {
                "job_name": "dcgm",
                "static_configs": [{"targets": ["127.0.0.1:9400"], "labels": {"host": "box"}}],
            },
            {
                "job_name": "backend",
                "static_configs": [{"targets": ["127.0.0.1:8080"], "labels": {"host": "box"}}],
                "metrics_path": "/metrics",
                "authorization": {"credentials_file": "/etc/prometheus/gpubox-api-key"},
            },
        ],
    }


def test_a_fleet_lists_every_box_each_target_labeled_with_its_name():
    data = yaml.safe_load(plan.prometheus_yml("box1", fleet(), SSH))
    jobs = {c["job_name"]: c for c in data["scrape_configs"]}
    assert list(jobs) == ["node", "dcgm", "backend", "backend-relay"]

    def targets(job: str) -> list[tuple[str, str]]:
        return [(s["labels"]["host"], s["targets"][0]) for s in jobs[job]["static_configs"]]

    assert targets("node") == [
        ("box1", "127.0.0.1:9100"),
        ("box2", "127.0.0.1:9110"),  # monitoring_targets
        ("box3", "gpu3.lan:9100"),  # every interface: its SSH address
    ]
    assert targets("dcgm") == [
        ("box1", "127.0.0.1:9400"),
        ("box2", "127.0.0.1:9410"),
        ("box3", "gpu3.lan:9400"),
    ]
    # the monitor's own backend directly, with the key; box2 serves nothing: no target
    assert targets("backend") == [("box1", "127.0.0.1:8080")]
    # box3's backend through its relay, on the backend job the rules select
    assert targets("backend-relay") == [("box3", "10.0.0.3:9401")]
    relay = jobs["backend-relay"]
    assert relay["relabel_configs"] == [{"target_label": "job", "replacement": "backend"}]
    assert "authorization" not in relay  # the key stays on box3
    assert plan.relay_wanted("box3", fleet()["box3"], fleet())
    assert not plan.relay_wanted("box2", fleet()["box2"], fleet())  # nothing served
    assert not plan.relay_wanted("box1", fleet()["box1"], fleet())  # its own monitor


def test_a_short_interval_shortens_the_scrape_timeout_and_retention_reaches_prometheus():
    config = load_host_config(
        "box", {**MONITOR, "monitoring_interval": 5, "monitoring_retention": "30d"}
    )
    data = yaml.safe_load(plan.prometheus_yml("box", {"box": config}, {}))
    assert data["global"] == {
        "scrape_interval": "5s",
        "evaluation_interval": "5s",
        "scrape_timeout": "5s",
    }
    assert plan.prometheus_defaults(config).splitlines()[1] == (
        'ARGS="--web.listen-address=127.0.0.1:9090 --storage.tsdb.retention.time=30d"'
    )


def test_promtool_accepts_the_generated_configuration(tmp_path: Path):
    """promtool check config, on the fleet's file with its paths moved under tmp_path (promtool
    reads the rules file and checks that the credentials file exists)."""
    text = plan.prometheus_yml("box1", fleet(), SSH)
    rules = tmp_path / "gpubox-alerts.yml"
    rules.write_text((FILES / "monitoring" / "alerts.yml").read_text())
    key = tmp_path / "gpubox-api-key"
    key.write_text("k\n")
    text = text.replace(layout.PROMETHEUS_RULES, str(rules)).replace(
        layout.PROMETHEUS_API_KEY, str(key)
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(text)
    ran = subprocess.run(
        [promtool(), "check", "config", str(config)], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "SUCCESS: 1 rule files found" in ran.stdout  # the rules file read, and checked
    # and a broken one fails it: the check has teeth
    config.write_text(text.replace("scrape_timeout: 10s", "scrape_timeout: 60s"))
    ran = subprocess.run(
        [promtool(), "check", "config", str(config)], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode != 0


def test_without_a_receiver_alerts_go_to_the_null_receiver_and_stay_on_alertmanagers_page():
    config = load_host_config("box", MONITOR)
    data = yaml.safe_load(plan.alertmanager_template(config))
    assert data["receivers"] == [{"name": "null"}]
    route = data["route"]
    assert route["receiver"] == "null" and route["group_by"] == ["alertname", "host"]
    assert [(r["matchers"], r["repeat_interval"]) for r in route["routes"]] == [
        (['severity="critical"'], "1h"),
        (['severity="warning"'], "4h"),
        (['severity="info"'], "24h"),
    ]
    assert plan.secret_files(plan.alertmanager_template(config)) == []


def test_the_receivers_secrets_are_placeholders_the_box_fills_from_their_files():
    config = load_host_config(
        "box",
        {
            **MONITOR,
            "alert_webhook_url_file": "/etc/gpubox/alert-webhook-url",
            "alert_email_to": "ops@example.org",
            "alert_email_from": "gpubox@example.org",
            "alert_smtp_smarthost": "smtp.example.org:587",
            "alert_smtp_username": "gpubox",
            "alert_smtp_password_file": "/etc/gpubox/smtp-password",
        },
    )
    template = plan.alertmanager_template(config)
    assert plan.secret_files(template) == [
        "/etc/gpubox/alert-webhook-url",
        "/etc/gpubox/smtp-password",
    ]
    secrets = {
        "/etc/gpubox/alert-webhook-url": "https://hooks.example.org/T0/x?token=a:b#c\n",
        "/etc/gpubox/smtp-password": 'pa"ss word\\\n',
    }
    rendered = render_secrets.render(template, secrets.__getitem__)
    data = yaml.safe_load(rendered)
    (receiver,) = data["receivers"]
    assert receiver["name"] == "gpubox" and data["route"]["receiver"] == "gpubox"
    assert receiver["webhook_configs"] == [
        {"url": "https://hooks.example.org/T0/x?token=a:b#c", "send_resolved": True}
    ]
    assert receiver["email_configs"] == [
        {
            "to": "ops@example.org",
            "from": "gpubox@example.org",
            "smarthost": "smtp.example.org:587",
            "send_resolved": True,
            "auth_username": "gpubox",
            "auth_password": 'pa"ss word\\',
        }
    ]
    assert "token" not in template and "pa" not in template.split("auth_password")[1][:30]


def test_the_defaults_files_bind_the_keys_addresses_and_no_cluster_port():
    config = load_host_config(
        "box", {**MONITOR, "node_exporter_address": "10.0.0.1", "alertmanager_port": 9193}
    )
    args = plan.node_exporter_defaults(config).splitlines()[1]
    assert args == (
        'ARGS="--web.listen-address=10.0.0.1:9100 '
        "--collector.textfile.directory=/var/lib/prometheus/node-exporter "
        "--collector.filesystem.mount-points-exclude="
        '^/(dev|proc|run|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)"'
    )
    exclude = re.compile(plan.MOUNT_POINTS_EXCLUDE)
    assert not exclude.match("/mnt/models") and not exclude.match("/media/disk")
    assert exclude.match("/run/user/1000") and exclude.match("/proc")
    assert plan.alertmanager_defaults(config).splitlines()[1] == (
        'ARGS="--web.listen-address=127.0.0.1:9193 --cluster.listen-address="'
    )


def test_the_config_textfile_holds_the_keys_values(tmp_path: Path):
    config = load_host_config(
        "box", {**MONITOR, "gpu_count": 4, "output_tokens_per_second_floor": 12.5}
    )
    text = plan.config_textfile(config)
    values = {
        line.split(" ")[0]: line.split(" ")[1]
        for line in text.splitlines()
        if not line.startswith("#")
    }
    assert values["gpubox_gpus_expected"] == "4"
    assert values["gpubox_output_tokens_per_second_floor"] == "12.5"
    assert any(k.startswith("gpubox_driver_branch_end_of_life") for k in values)
    ran = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr


def counter_lines(text: str) -> list[str]:
    return [
        line.split(",")[0].strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    ]


# etc/default-counters.csv at NVIDIA/dcgm-exporter tag 4.4.1-4.6.0 (commit 13ad457b), its
# uncommented counters: the exporter's defaults, which gpubox's file keeps.
UPSTREAM_DEFAULTS = [
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
]


def test_the_counters_file_is_the_exporters_defaults_plus_every_counter_the_rules_read():
    shipped = counter_lines((FILES / "monitoring" / "dcgm-counters.csv").read_text())
    assert len(shipped) == len(set(shipped))
    assert [c for c in shipped if c in UPSTREAM_DEFAULTS] == UPSTREAM_DEFAULTS
    rules = (FILES / "monitoring" / "alerts.yml").read_text()
    read = set(re.findall(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]+", rules))
    assert read and read <= set(shipped), sorted(read - set(shipped))
    assert "DCGM_EXP_GPU_HEALTH_STATUS" in shipped  # its collector runs only when listed


RULES = FILES / "monitoring" / "alerts.yml"


def test_the_rules_for_count_evaluations_at_the_monitors_interval(tmp_path: Path):
    """monitoring_interval 5: each alert's for: keeps its count of evaluations (1m at 30 s is
    10s), every other line is the shipped file's, and promtool accepts the result."""
    shipped = RULES.read_text(encoding="utf-8")
    assert plan.rules_for(shipped, 30) == shipped
    fast = plan.rules_for(shipped, 5)
    old, new = shipped.splitlines(), fast.splitlines()
    assert len(old) == len(new)
    changed = {(a.strip(), b.strip()) for a, b in zip(old, new, strict=True) if a != b}
    scaled = {
        ("for: 1m", "for: 10s"),
        ("for: 2m", "for: 20s"),
        ("for: 5m", "for: 50s"),
        ("for: 10m", "for: 100s"),
        ("for: 15m", "for: 150s"),
    }
    assert changed <= scaled and ("for: 1m", "for: 10s") in changed, changed
    assert "for: 0m" in fast  # no wait stays no wait
    slow = plan.rules_for(shipped, 60)
    assert "for: 120s" in slow and "for: 1m" not in slow
    rules = tmp_path / "alerts.yml"
    rules.write_text(fast, encoding="utf-8")
    proc = subprocess.run(
        [promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
