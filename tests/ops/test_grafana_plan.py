"""Grafana's stage (gpubox.stages.grafana) on the fleet's monitor: the image pulled once by its
digest, the admin password generated on the box once (root only, never on a command line), the
provisioning (the monitor's Prometheus under the dashboard's datasource uid, the dashboard's
folder) and the dashboard written, the unit running the container on grafana_address:port; a
converged box plans no change; grafana false stops a Grafana gpubox installed; grafana without
monitoring is refused naming the key."""

from __future__ import annotations

import hashlib
import json
import shlex

import pytest
import yaml
from conftest import REFERENCE, fresh_box
from test_model_download_plan import uploads

from gpubox import catalog
from gpubox.base import layout
from gpubox.config import load_host_config, validate
from gpubox.knowledge import dashboard
from gpubox.plans import grafana as grafana_plan
from gpubox.stages import grafana as grafana_stage

MONITOR = {**REFERENCE, "monitoring": "prometheus", "dcgm_exporter": True, "grafana": True}
IMAGE = catalog.load()["grafana"]["image"]
IMAGE_THERE = {"docker image inspect": "sha256:0123"}
RUNNING = ["Id=gpubox-grafana.service", "SubState=running", "UnitFileState=enabled"]
PASSWORD_THERE = {f"test -s {layout.GRAFANA_ADMIN_PASSWORD}": "yes"}


def short(names) -> list[str]:
    return [n.rsplit(" | ", 1)[-1] for n in names]


def docker_run(unit: str) -> list[str]:
    """The unit's ExecStart, its continuation lines joined as systemd joins them."""
    text = unit.replace("\\\n", " ")
    (line,) = [x for x in text.splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


@pytest.mark.parametrize("os_name", ["ubuntu2404", "debian12"])
def test_a_fresh_monitor_gets_the_image_its_password_provisioning_and_unit(plan_of, os_name):
    plan = plan_of(grafana_stage.grafana, MONITOR, fresh_box(os_name))
    names = short(plan.names)
    assert names[-9:] == [
        f"Pull {IMAGE} (once)",
        f"Generate Grafana's admin password ({layout.GRAFANA_ADMIN_PASSWORD}, root only)",
        "Grafana's datasource (the monitor's Prometheus)",
        "Grafana's dashboard provider",
        "gpubox's dashboard",
        "Grafana's unit",
        "Reload systemd units (grafana)",
        "Grafana running and enabled",
        "Restart Grafana with its new settings",
    ], names
    assert plan.op("Pull grafana/grafana") == [f"docker pull {IMAGE}"]
    assert "@sha256:" in IMAGE
    (generate,) = plan.op("Generate Grafana's admin password")
    assert "umask 077" in generate and "chmod 640" in generate and "chown root:root" in generate
    assert "echo" not in generate.split("> ")[0] and "cat " not in generate
    assert any("systemctl enable gpubox-grafana" in c for c in plan.commands)


def test_the_files_say_where_prometheus_and_the_dashboard_are(plan_of):
    files = uploads(grafana_stage.grafana, MONITOR, fresh_box("ubuntu2404"))
    files = {p: t for p, t in files.items() if "grafana" in p}
    assert set(files) == {
        layout.GRAFANA_DATASOURCE,
        layout.GRAFANA_DASHBOARD_PROVIDER,
        layout.GRAFANA_DASHBOARD,
        layout.GRAFANA_UNIT_FILE,
    }
    (source,) = yaml.safe_load(files[layout.GRAFANA_DATASOURCE])["datasources"]
    assert source["uid"] == dashboard.DATASOURCE_UID
    assert source["type"] == "prometheus" and source["url"] == "http://127.0.0.1:9090"
    assert source["jsonData"] == {"timeInterval": "30s"}
    # every panel of the dashboard names that datasource
    board = json.loads(files[layout.GRAFANA_DASHBOARD])
    assert board == dashboard.load()
    assert {p["datasource"]["uid"] for _, p in dashboard.panels(board)} == {source["uid"]}
    (provider,) = yaml.safe_load(files[layout.GRAFANA_DASHBOARD_PROVIDER])["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == layout.GRAFANA_DASHBOARDS
    assert layout.GRAFANA_DASHBOARD.startswith(layout.GRAFANA_DASHBOARDS + "/")


def test_the_unit_runs_the_pinned_image_on_its_address_with_the_password_file():
    config = load_host_config(
        "box", {**MONITOR, "grafana_address": "10.0.0.5", "grafana_port": 3300}
    )
    argv = docker_run(grafana_plan.unit(config))
    assert argv[:8] == [
        "/usr/bin/docker",
        "run",
        "--rm",
        "--name",
        "gpubox-grafana",
        "--pull",
        "never",
        "--network",
    ]
    assert argv[-1] == IMAGE
    env = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-e")
    assert env["GF_SERVER_HTTP_ADDR"] == "10.0.0.5" and env["GF_SERVER_HTTP_PORT"] == "3300"
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == grafana_plan.PASSWORD_IN_CONTAINER
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    assert f"{layout.GRAFANA_ADMIN_PASSWORD}:{grafana_plan.PASSWORD_IN_CONTAINER}:ro" in volumes
    assert f"{layout.GRAFANA_PROVISIONING}:/etc/grafana/provisioning:ro" in volumes
    assert f"{layout.GRAFANA_DASHBOARDS}:{layout.GRAFANA_DASHBOARDS}:ro" in volumes
    assert f"{layout.GRAFANA_VOLUME}:/var/lib/grafana" in volumes


def test_a_wildcard_prometheus_address_is_reached_on_loopback():
    config = load_host_config("box", {**MONITOR, "prometheus_address": "0.0.0.0"})
    assert grafana_plan.prometheus_url(config) == "http://127.0.0.1:9090"
    config = load_host_config("box", {**MONITOR, "prometheus_address": "fd00::5"})
    assert grafana_plan.prometheus_url(config) == "http://[fd00::5]:9090"


def digests(files: dict[str, str]) -> list[str]:
    return [f"{p} 644 {hashlib.sha256(t.encode()).hexdigest()}" for p, t in sorted(files.items())]


def test_a_converged_monitor_plans_no_change(plan_of):
    files = grafana_plan.files(load_host_config("box", MONITOR))
    answers = {
        **IMAGE_THERE,
        **PASSWORD_THERE,
        f"for p in {sorted(files)[0]}": digests(files),
        "systemctl show": [
            "Id=gpubox-grafana.service",
            "SubState=running",
            "UnitFileState=enabled",
        ],
    }
    plan = plan_of(grafana_stage.grafana, MONITOR, fresh_box("ubuntu2404", **answers))
    mine = [(n, c) for n, c in plan.ops if "rafana" in short([n])[0] or "dashboard" in n]
    assert mine, plan.names
    assert [(n, c) for n, c in mine if c and n not in plan.conditional] == [], plan.ops
    assert not [n for n in plan.names if "Pull" in n or "Generate" in n]
    assert {short([n])[0] for n in plan.conditional} >= {
        "Reload systemd units (grafana)",
        "Restart Grafana with its new settings",
    }


def test_a_new_dashboard_alone_does_not_restart_grafana(plan_of):
    """The provider reads the folder again by itself; a datasource change needs a restart."""
    config = load_host_config("box", MONITOR)
    files = grafana_plan.files(config)
    stale = {**files, layout.GRAFANA_DASHBOARD: "{}\n"}
    answers = {
        **IMAGE_THERE,
        **PASSWORD_THERE,
        f"for p in {sorted(files)[0]}": digests(stale),
        "systemctl show": [
            "Id=gpubox-grafana.service",
            "SubState=running",
            "UnitFileState=enabled",
        ],
    }
    plan = plan_of(grafana_stage.grafana, MONITOR, fresh_box("ubuntu2404", **answers))
    assert "gpubox's dashboard" in short(plan.names)
    assert "Restart Grafana with its new settings" in short(plan.conditional)


def test_grafana_false_stops_an_installed_grafana_and_plans_nothing_else(plan_of):
    there = {"list-unit-files gpubox-grafana.service": "gpubox-grafana.service enabled enabled"}
    plan = plan_of(grafana_stage.grafana, REFERENCE, fresh_box("ubuntu2404", **there))
    assert "Stop and disable Grafana (grafana false)" in short(plan.names)
    assert not [n for n in plan.names if "Pull" in n or "Grafana's" in n]
    none = plan_of(grafana_stage.grafana, REFERENCE, fresh_box("ubuntu2404"))
    assert not [n for n in short(none.names) if "rafana" in n]


def test_grafana_without_monitoring_is_refused_naming_the_key():
    _, problems = validate("box", {**REFERENCE, "grafana": True})
    errors = [p for p in problems if p.severity == "error"]
    assert [p.key for p in errors] == ["grafana"]
    assert "monitoring 'prometheus'" in errors[0].message


def test_grafanas_port_may_not_be_prometheus_or_the_apis():
    for other, port in (("prometheus_port", 9090), ("api_port", 8080)):
        _, problems = validate("box", {**MONITOR, "grafana_port": port})
        errors = [p for p in problems if p.severity == "error"]
        assert [p.key for p in errors] == ["grafana_port"], other
        assert other in errors[0].message


def test_the_catalog_pins_a_grafana_11_image_by_digest():
    entry = catalog.load()["grafana"]
    assert entry["version"].startswith("11.")
    name, digest = entry["image"].split("@")
    assert name == "grafana/grafana"
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 64
