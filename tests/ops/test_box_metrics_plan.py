"""The box metrics on a monitored box (gpubox.ops.box_metrics, issue 31 C4): the program
uploaded whole, its settings (the driver's kernel module package for the box's OS, the model
download's paths, model_dir), its service and a timer at monitoring_interval, started and
enabled; nothing planned on a converged box; whether the inventory has a monitor."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

from conftest import REFERENCE, fake_host, fresh_box
from test_model_download_plan import uploads

from gpubox.config import load_host_config
from gpubox.knowledge import box_metrics as program
from gpubox.ops import box_metrics
from gpubox.stages import current_config

PYTHON_THERE = {"test -x /usr/bin/python3": "yes"}


def stage() -> None:
    """What the monitoring stage does for a monitored host."""
    box_metrics.box_metrics(current_config())


def short(names) -> list[str]:
    return [n.rsplit(" | ", 1)[-1] for n in names]


def source() -> str:
    with open(program.__file__, encoding="utf-8") as f:
        return f.read()


def test_a_fresh_box_gets_the_program_its_settings_and_a_running_timer(plan_of):
    plan = plan_of(stage, REFERENCE, fresh_box("ubuntu2404", **PYTHON_THERE))
    assert short(plan.names) == [
        "The box metrics' program",
        "The box metrics' settings",
        "The box metrics' service",
        "The box metrics' timer",
        "Reload systemd units (box metrics)",
        "the box metrics' timer running and enabled",
        "Restart the box metrics' timer with its new settings",
    ]
    assert any("systemctl enable gpubox-box-metrics.timer" in c for c in plan.commands)
    assert any("systemctl start gpubox-box-metrics.timer" in c for c in plan.commands)
    assert "chmod 755 /usr/local/lib/gpubox/gpubox-box-metrics" in " ".join(
        plan.op("The box metrics' program")
    )
    files = uploads(stage, REFERENCE, fresh_box("ubuntu2404", **PYTHON_THERE))
    assert files[box_metrics.SCRIPT] == source()
    settings = json.loads(files["/etc/gpubox/box-metrics.json"])
    config = load_host_config("box", REFERENCE)
    model_dir, model = config.model_dir, config.catalog["models"][config.model]
    assert settings == {
        "textfile": "/var/lib/prometheus/node-exporter/gpubox-box.prom",
        "state_file": "/var/lib/gpubox/box-metrics.json",
        "driver_package": "nvidia-dkms-570",
        "model_dir": model_dir,
        "model": {
            "kind": "file",
            "name": model["file"],
            "path": f"{model_dir}/{model['file']}",
            "marker": f"{model_dir}/{model['file']}.gpubox-verified",
            "size": model.get("size") or None,
        },
    }
    service = files[box_metrics.UNIT_FILE]
    assert "Type=oneshot\n" in service
    assert (
        "ExecStart=/usr/bin/python3 /usr/local/lib/gpubox/gpubox-box-metrics "
        "/etc/gpubox/box-metrics.json\n"
    ) in service
    timer = files[box_metrics.TIMER_FILE]
    assert "OnUnitInactiveSec=30\n" in timer and "WantedBy=timers.target" in timer


def test_debian_names_its_own_kernel_module_package_and_vllm_its_checkpoint():
    data = {**REFERENCE, "backend": "vllm"}
    files = uploads(stage, data, fresh_box("debian12", **PYTHON_THERE))
    settings = json.loads(files["/etc/gpubox/box-metrics.json"])
    assert settings["driver_package"] == "nvidia-kernel-dkms"
    assert settings["model"]["kind"] == "directory"
    assert settings["model"]["path"].endswith(settings["model"]["name"].replace("/", "--"))
    none = json.loads(
        uploads(stage, {**REFERENCE, "backend": "none"}, fresh_box("debian12", **PYTHON_THERE))[
            "/etc/gpubox/box-metrics.json"
        ]
    )
    assert none["model"] is None and none["driver_package"] == "nvidia-kernel-dkms"


def test_a_converged_box_plans_no_change(plan_of):
    def line(path: str, text: str, mode: str) -> str:
        return f"{path} {mode} {hashlib.sha256(text.encode()).hexdigest()}"

    files = box_metrics.unit_files(load_host_config("box", REFERENCE), "ubuntu")
    answers = {
        **PYTHON_THERE,
        f"for p in {box_metrics.SCRIPT}": [line(box_metrics.SCRIPT, source(), "755")],
        "for p in /etc/gpubox/box-metrics.json": [line(p, t, "644") for p, t in files.items()],
        "systemctl show": [
            "Id=gpubox-box-metrics.timer",
            "SubState=waiting",
            "UnitFileState=enabled",
        ],
    }
    plan = plan_of(stage, REFERENCE, fresh_box("ubuntu2404", **answers))
    assert not [n for n in plan.names if "The box metrics'" in n], plan.names
    assert [(n, c) for n, c in plan.ops if c and n not in plan.conditional] == [], plan.ops


def test_the_fleet_is_monitored_when_any_host_is_the_monitor():
    host = lambda **data: SimpleNamespace(data=data)  # noqa: E731
    assert box_metrics.monitored([host(), host(monitoring="prometheus")])
    assert not box_metrics.monitored([host(), host(monitoring="none"), host(monitoring=None)])
    with fake_host({**REFERENCE, "monitoring": "prometheus"}, fresh_box("ubuntu2404")):
        assert box_metrics.monitored()  # pyinfra's inventory
    with fake_host(REFERENCE, fresh_box("ubuntu2404")):
        assert not box_metrics.monitored()


def test_a_fleet_no_longer_monitored_stops_the_timer_where_it_is_installed(plan_of):
    there = {
        "list-unit-files gpubox-box-metrics.timer": "gpubox-box-metrics.timer enabled enabled",
        "systemctl show": [
            "Id=gpubox-box-metrics.timer",
            "SubState=waiting",
            "UnitFileState=enabled",
        ],
    }
    plan = plan_of(box_metrics.stop, REFERENCE, fresh_box("ubuntu2404", **there))
    assert short(plan.names) == ["Stop and disable the box metrics (no monitor in the inventory)"]
    assert any("systemctl stop gpubox-box-metrics.timer" in c for c in plan.commands)
    assert any("systemctl disable gpubox-box-metrics.timer" in c for c in plan.commands)
    assert plan_of(box_metrics.stop, REFERENCE, fresh_box("ubuntu2404")).names == []
