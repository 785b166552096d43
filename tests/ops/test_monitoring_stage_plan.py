"""The monitoring stage (gpubox.stages.monitoring, issue 31 A and C) against recorded facts: nothing
without a monitor; on the monitor the arguments and configuration written before the
distribution's packages (no recommends), the API key copied and alertmanager.yml rendered on
the box, each only when it would change; a converged box gets no change; the Ubuntu 24.04
Desktop plans the same; a run limited to one host (--limit) still lists every host; a box
whose monitor is another box gets the metrics relay; a secret's file missing on the monitor
stops the host, naming its key."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from conftest import REFERENCE, fake_host, fresh_box
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.connect import connect_all
from pyinfra.context import ctx_host, ctx_inventory, ctx_state
from test_model_download_plan import uploads
from test_reference_desktop_plan import reference_desktop

from gpubox.base import layout
from gpubox.config import load_host_config
from gpubox.knowledge import metrics_relay, render_secrets
from gpubox.ops import box_metrics
from gpubox.plans import monitoring as plan
from gpubox.stages import monitoring as stage

MONITOR = {**REFERENCE, "monitoring": "prometheus", "dcgm_exporter": True}
NAME = "@fake/box"  # the plan tests' one host, as pyinfra names it
UNITS = (layout.NODE_EXPORTER, layout.PROMETHEUS, layout.ALERTMANAGER)


def source(module) -> str:
    return Path(module.__file__).read_text(encoding="utf-8")


def short(names: list[str]) -> list[str]:
    return [n.rsplit(" | ", 1)[-1] for n in names]


def test_without_a_monitor_in_the_inventory_the_stage_does_nothing(plan_of):
    assert (
        plan_of(stage.monitoring, {**REFERENCE, "dcgm_exporter": True}, fresh_box("ubuntu2404")).ops
        == []
    )


def test_a_fresh_monitor_gets_its_files_before_the_distributions_packages(plan_of):
    plan = plan_of(stage.monitoring, MONITOR, fresh_box("ubuntu2404"))
    names = short(plan.names)
    assert names == [
        "python3 for gpubox's programs",
        "The node exporter's arguments",
        "Install the node exporter (the distribution's)",
        "gpubox-config.prom (the keys' values)",
        "the node exporter running and enabled",
        "Restart the node exporter with its new settings",
        "The box metrics' program",
        "The box metrics' settings",
        "The box metrics' service",
        "The box metrics' timer",
        "Reload systemd units (box metrics)",
        "the box metrics' timer running and enabled",
        "Restart the box metrics' timer with its new settings",
        "Prometheus's arguments",
        "Alertmanager's arguments",
        "prometheus.yml (every host of the inventory)",
        "The alert rules",
        "Install Prometheus and Alertmanager (the distribution's)",
        "The API key, readable by Prometheus (0640)",
        "The secrets' renderer",
        "alertmanager.yml's template (no secret)",
        "alertmanager.yml with the receivers' secrets (0640)",
        "promtool check config",
        "Prometheus running and enabled",
        "Restart Prometheus with its new settings",
        "Reload Prometheus's configuration and rules",
        "Alertmanager running and enabled",
        "Restart Alertmanager with its new settings",
        "Wait for Prometheus's first scrape of every target",
    ]
    node = " ".join(plan.op("Install the node exporter"))
    assert "install --no-install-recommends prometheus-node-exporter" in node
    monitor = " ".join(plan.op("Install Prometheus and Alertmanager"))
    assert "install --no-install-recommends prometheus prometheus-alertmanager" in monitor
    assert "--force-confold" in monitor  # dpkg keeps the configuration written before
    # the key copied by the box, never on a command line; Prometheus's group asked from systemd
    (copy,) = plan.op("The API key, readable by Prometheus")
    assert copy == (
        'g=$(id -gn "$(systemctl show -P User prometheus)") && install -m 0640 -o root -g "$g" '
        "/etc/gpubox/api-key /etc/prometheus/gpubox-api-key"
    )
    (render,) = plan.op("alertmanager.yml with the receivers' secrets")
    assert render == (
        "/usr/bin/python3 /usr/local/lib/gpubox/gpubox-render-secrets "
        "/etc/gpubox/alertmanager.yml.in /etc/prometheus/alertmanager.yml prometheus-alertmanager"
    )
    files = uploads(stage.monitoring, MONITOR, fresh_box("ubuntu2404"))
    # at the default interval the monitor's rules are the shipped file, byte for byte
    shipped = (Path(stage.FILES) / "monitoring" / "alerts.yml").read_text(encoding="utf-8")
    assert files[layout.PROMETHEUS_RULES] == shipped
    assert files[layout.ALERTMANAGER_RENDER] == source(render_secrets)
    scrape = yaml.safe_load(files[layout.PROMETHEUS_CONFIG])["scrape_configs"]
    assert [c["static_configs"][0]["labels"] for c in scrape] == [{"host": NAME}] * 3
    assert "gpubox_gpus_expected 2\n" in files[layout.TEXTFILE_CONFIG]
    assert layout.METRICS_RELAY_UNIT_FILE not in files  # its own monitor: no relay


def digests(texts: dict[str, str], mode: str = "644") -> list[str]:
    return [f"{p} {mode} {hashlib.sha256(t.encode()).hexdigest()}" for p, t in texts.items()]


def converged(data: dict, answers_for=None, **extra: object) -> dict[object, object]:
    """A monitor the stage converged (``answers_for``: the box's other facts, by default a
    fresh Ubuntu 24.04 server's): every file as planned, the packages installed, the units
    running and enabled, the key's copy and alertmanager.yml current."""
    config = load_host_config(NAME, data)
    texts = {
        **stage.node_files(config),
        **stage.monitor_files(config, NAME, {NAME: config}, {NAME: NAME}),
    }
    lines = (
        digests(texts)
        + digests({layout.ALERTMANAGER_TEMPLATE: plan.alertmanager_template(config)}, "600")
        + digests({layout.ALERTMANAGER_RENDER: source(render_secrets)}, "755")
        + digests(box_metrics.unit_files(config, "ubuntu"))
        + digests({box_metrics.SCRIPT: box_metrics.script_text()}, "755")
    )
    show = []
    for unit in UNITS:
        show += [f"Id={unit}.service", "SubState=running", "UnitFileState=enabled"]
    show += [f"Id={box_metrics.TIMER}", "SubState=waiting", "UnitFileState=enabled"]
    answers = {
        "test -x /usr/bin/python3": "yes",
        "sha256sum <": lines,
        "dpkg -l": [
            f"ii  {p}  1.0  amd64  x" for p in stage.NODE_PACKAGES + stage.MONITOR_PACKAGES
        ],
        f"cmp -s /etc/gpubox/api-key {layout.PROMETHEUS_API_KEY}": "same",
        f"{layout.ALERTMANAGER_RENDER} --check": "same",
        "systemctl show": show,
        **extra,
    }
    if answers_for is None:
        return fresh_box("ubuntu2404", **answers)
    return answers_for(**answers)


def changes(plan) -> list[tuple[str, list[str]]]:
    return [(n, c) for n, c in plan.ops if c and n not in plan.conditional]


def test_a_converged_monitor_gets_no_change(plan_of):
    plan = plan_of(stage.monitoring, MONITOR, converged(MONITOR))
    assert changes(plan) == [], changes(plan)
    assert not [n for n in plan.names if "Install" in n or "arguments" in n]


def conditions(data: dict, answers: dict[object, object]) -> dict[str, bool]:
    """Each conditional operation's condition, evaluated as pyinfra does before running it."""
    found = {}
    with fake_host(data, answers) as fake:
        stage.monitoring()
        for op_hash in fake.state.get_op_order():
            meta = fake.state.op_meta[op_hash]
            condition = fake.state.get_op_data_for_host(fake.host, op_hash).global_arguments.get(
                "_if"
            )
            name = short(sorted(meta.names))[0]
            if condition and name in (RENDER, KEY_COPY):  # the others wait on operations
                conds = condition if isinstance(condition, list) else [condition]
                found[name] = all(c() for c in conds)
    return found


RENDER = "alertmanager.yml with the receivers' secrets (0640)"
KEY_COPY = "The API key, readable by Prometheus (0640)"


def test_alertmanager_yml_and_the_key_copy_are_written_again_only_when_they_would_change():
    quiet = conditions(MONITOR, converged(MONITOR))
    assert quiet == {RENDER: False, KEY_COPY: False}
    # a secret's file edited on the box: the box's renderer says its result differs
    edited = conditions(
        MONITOR, converged(MONITOR, **{f"{layout.ALERTMANAGER_RENDER} --check": "differs"})
    )
    assert edited == {RENDER: True, KEY_COPY: False}
    rotated = conditions(
        MONITOR,
        converged(MONITOR, **{f"cmp -s /etc/gpubox/api-key {layout.PROMETHEUS_API_KEY}": ""}),
    )
    assert rotated == {RENDER: False, KEY_COPY: True}


def test_the_ubuntu_2404_desktop_plans_the_same_packages_and_files(plan_of):
    desktop = plan_of(stage.monitoring, MONITOR, reference_desktop())
    server = plan_of(stage.monitoring, MONITOR, fresh_box("ubuntu2404"))
    assert short(desktop.names) == short(server.names)
    assert desktop.installs() == server.installs()
    assert "prometheus-node-exporter" in desktop.installs()
    converged_desktop = plan_of(
        stage.monitoring, MONITOR, converged(MONITOR, answers_for=reference_desktop)
    )
    assert changes(converged_desktop) == []


def test_a_missing_secret_file_stops_the_host_naming_its_key(plan_of):
    data = {**MONITOR, "alert_webhook_url_file": "/etc/gpubox/alert-webhook-url"}
    plan = plan_of(stage.monitoring, data, fresh_box("ubuntu2404"))
    (stop,) = plan.op("alert_webhook_url_file: the secret's file")
    assert "alert_webhook_url_file: /etc/gpubox/alert-webhook-url is not on the monitor" in stop
    assert not [n for n in plan.names if "Prometheus running" in n]
    there = fresh_box("ubuntu2404", **{"test -f /etc/gpubox/alert-webhook-url": "yes"})
    assert "Prometheus running and enabled" in short(plan_of(stage.monitoring, data, there).names)


@contextmanager
def fleet_run(boxes: dict[str, dict], current: str, limit: list[str]) -> Iterator[State]:
    """pyinfra's state for @fake hosts ``boxes`` limited to ``limit`` (as --limit makes it),
    with ``current``'s context entered."""
    inventory = Inventory(
        (
            [
                (
                    name,
                    {
                        **data,
                        "fake_responses": fresh_box("ubuntu2404"),
                        "fake_delay": 0,
                        "fake_delay_jitter": 0,
                    },
                )
                for name, data in boxes.items()
            ],
            {},
        )
    )
    state = State()
    hosts = {h.name: h for h in inventory}
    state.init(inventory, Config(), initial_limit=[hosts[n] for n in limit])
    connect_all(state)
    with ctx_state.use(state), ctx_inventory.use(inventory), ctx_host.use(hosts[current]):
        yield state


def uploaded(state: State, host_name: str) -> dict[str, str]:
    host = next(h for h in state.inventory if h.name == host_name)
    out = {}
    for op_hash in state.get_op_order():
        for command in state.get_op_data_for_host(host, op_hash).command_generator():
            if isinstance(command, FileUploadCommand) and hasattr(command.src, "getvalue"):
                out[command.dest] = command.src.getvalue()
    return out


BOXES = {
    "@fake/m": MONITOR,
    "@fake/b": {
        **REFERENCE,
        "dcgm_exporter": True,
        "ssh_hostname": "gpu-b.lan",
        "node_exporter_address": "0.0.0.0",
        "dcgm_exporter_address": "0.0.0.0",
        "metrics_relay_address": "0.0.0.0",
    },
}


def test_a_run_limited_to_the_monitor_still_scrapes_every_host():
    with fleet_run(BOXES, "@fake/m", limit=["@fake/m"]) as state:
        stage.monitoring()
        files = uploaded(state, "@fake/m")
    scrape = yaml.safe_load(files[layout.PROMETHEUS_CONFIG])["scrape_configs"]
    hosts = {s["labels"]["host"]: s["targets"] for c in scrape for s in c["static_configs"]}
    assert set(hosts) == {"@fake/m", "@fake/b"}
    node = next(c for c in scrape if c["job_name"] == "node")["static_configs"]
    assert [s["targets"] for s in node] == [["127.0.0.1:9100"], ["gpu-b.lan:9100"]]
    relayed = next(c for c in scrape if c["job_name"] == "backend-relay")["static_configs"]
    assert relayed == [{"targets": ["gpu-b.lan:9401"], "labels": {"host": "@fake/b"}}]
    # the whole run writes the same file: a re-deploy, limited or not, changes nothing
    with fleet_run(BOXES, "@fake/m", limit=["@fake/m", "@fake/b"]) as state:
        stage.monitoring()
        assert (
            uploaded(state, "@fake/m")[layout.PROMETHEUS_CONFIG] == files[layout.PROMETHEUS_CONFIG]
        )


def test_a_box_monitored_by_another_gets_the_node_exporter_and_the_relay_not_prometheus():
    with fleet_run(BOXES, "@fake/b", limit=["@fake/b"]) as state:
        stage.monitoring()
        files = uploaded(state, "@fake/b")
    assert layout.PROMETHEUS_CONFIG not in files and layout.NODE_EXPORTER_DEFAULTS in files
    assert files[layout.METRICS_RELAY_SCRIPT] == source(metrics_relay)
    settings = yaml.safe_load(files[layout.METRICS_RELAY_CONFIG])
    assert settings == {
        "listen_address": "",
        "listen_port": 9401,
        "upstream": "http://127.0.0.1:8080/metrics",
        "key_file": "/etc/gpubox/api-key",
        "timeout_s": 10,
        "max_bytes": 33554432,
    }
    unit = files[layout.METRICS_RELAY_UNIT_FILE]
    assert "ExecStart=/usr/bin/python3 /usr/local/lib/gpubox/gpubox-metrics-relay " in unit
    assert "/etc/gpubox/metrics-relay.json" in unit and "api-key" not in unit


def test_the_stage_runs_after_the_watchdog_in_the_full_deploy():
    from gpubox.commands.deploying import FULL_STAGES

    assert FULL_STAGES.index("monitoring") == FULL_STAGES.index("watchdog") + 1
    full = (Path(stage.__file__).parents[1] / "deploy" / "full.py").read_text()
    assert "        watchdog,\n        monitoring,\n" in full


def test_the_dcgm_stage_ships_the_counters_file_and_restarts_the_exporter_when_it_changes(plan_of):
    from gpubox.base.rendering import FILES
    from gpubox.stages import dcgm as dcgm_stage

    data = {**REFERENCE, "dcgm_exporter": True}
    files = uploads(dcgm_stage.dcgm, data, fresh_box("ubuntu2404"))
    assert files[layout.DCGM_COUNTERS] == (FILES / "monitoring" / "dcgm-counters.csv").read_text()
    plan = plan_of(dcgm_stage.dcgm, data, fresh_box("ubuntu2404"))
    names = short(plan.names)
    assert names.index("dcgm-exporter's counters") < names.index("dcgm-exporter unit")
    assert "Restart dcgm-exporter with its new settings" in names
    # without the exporter, no counters file
    assert layout.DCGM_COUNTERS not in uploads(dcgm_stage.dcgm, REFERENCE, fresh_box("ubuntu2404"))


def test_a_deploy_is_refused_before_any_change_when_a_monitored_box_lacks_dcgm_exporter():
    import pytest

    from gpubox.base.errors import DeployRefused

    boxes = {**BOXES, "@fake/b": {**BOXES["@fake/b"], "dcgm_exporter": False}}
    with fleet_run(boxes, "@fake/m", limit=["@fake/m"]) as state:
        with pytest.raises(DeployRefused, match=r"@fake/b: dcgm_exporter: must be true"):
            stage.monitoring()
        assert state.get_op_order() == []
