"""The watchdog's stage (gpubox.stages.watchdog): its script, settings, service and timer
written and the timer started and enabled, for the backend's unit; python3 installed only
where it is missing; the timer stopped where nothing is served or the watchdog is off; the
keys refused out of range with their names; the stage after the backend's."""

from __future__ import annotations

import json

import pytest
from conftest import REFERENCE, fresh_box
from test_model_download_plan import uploads

from gpubox.base import layout
from gpubox.commands import deploying
from gpubox.config import load_host_config, validate
from gpubox.knowledge import watchdog as script
from gpubox.stages import watchdog as watchdog_stage

PYTHON_THERE = {"test -x /usr/bin/python3": "yes"}
TIMER_THERE = {
    "list-unit-files gpubox-watchdog.timer": "gpubox-watchdog.timer enabled enabled",
    # pyinfra's SystemdStatus: a timer waiting for its next run is running
    "systemctl show": ["Id=gpubox-watchdog.timer", "SubState=waiting"],
}


def short(names) -> list[str]:
    return [n.rsplit(" | ", 1)[-1] for n in names]


def test_a_fresh_box_gets_the_script_its_settings_and_a_running_timer(plan_of):
    plan = plan_of(watchdog_stage.watchdog, REFERENCE, fresh_box("ubuntu2404", **PYTHON_THERE))
    assert short(plan.names) == [
        "The watchdog's script",
        "The watchdog's settings",
        "The watchdog's service",
        "The watchdog's timer",
        "Reload systemd units (watchdog)",
        "the watchdog's timer running and enabled",
        "Restart the watchdog's timer with its new settings",
    ]
    assert any("systemctl enable gpubox-watchdog.timer" in c for c in plan.commands)
    assert any("systemctl start gpubox-watchdog.timer" in c for c in plan.commands)
    files = uploads(watchdog_stage.watchdog, REFERENCE, fresh_box("ubuntu2404", **PYTHON_THERE))
    assert files[layout.WATCHDOG_SCRIPT] == script_source()
    settings = json.loads(files[layout.WATCHDOG_CONFIG])
    assert settings == {
        "backend": "llamacpp",
        "unit": layout.LLAMA_SERVER,
        "url": "http://127.0.0.1:8080",
        "model": "qwen3-next",
        "key_file": "/etc/gpubox/api-key",
        "state_file": "/var/lib/gpubox/watchdog.json",
        "interval_s": 30,
        "failures": 3,
        "grace_s": 900,
        "busy_limit_s": 600,
        "timeout_s": 15,
        "completion_every_s": 120,
        "textfile": None,
    }
    service = files[layout.WATCHDOG_UNIT_FILE]
    assert "Type=oneshot\n" in service
    assert (
        "ExecStart=/usr/bin/python3 /usr/local/lib/gpubox/gpubox-watchdog "
        "/etc/gpubox/watchdog.json\n"
    ) in service
    assert "SyslogIdentifier=gpubox-watchdog\n" in service and "TimeoutStartSec=75\n" in service
    timer = files[layout.WATCHDOG_TIMER_FILE]
    assert "OnActiveSec=30\nOnUnitInactiveSec=30\n" in timer
    assert "WantedBy=timers.target" in timer


def test_a_monitored_fleets_watchdog_writes_its_textfile(monkeypatch):
    """With a monitor in the inventory (issue 31), each run writes gpubox-watchdog.prom."""
    from gpubox.ops import box_metrics

    monkeypatch.setattr(box_metrics, "monitored", lambda hosts=None: True)
    files = uploads(watchdog_stage.watchdog, REFERENCE, fresh_box("ubuntu2404", **PYTHON_THERE))
    settings = json.loads(files[layout.WATCHDOG_CONFIG])
    assert settings["textfile"] == "/var/lib/prometheus/node-exporter/gpubox-watchdog.prom"


def script_source() -> str:
    with open(script.__file__, encoding="utf-8") as f:
        return f.read()


def test_the_script_is_executable_and_the_unit_files_are_not(plan_of):
    plan = plan_of(watchdog_stage.watchdog, REFERENCE, fresh_box("ubuntu2404", **PYTHON_THERE))
    script_op = " ".join(plan.op("The watchdog's script"))
    timer_op = " ".join(plan.op("The watchdog's timer"))
    assert "chmod 755 /usr/local/lib/gpubox/gpubox-watchdog" in script_op
    assert "chmod 644 /etc/systemd/system/gpubox-watchdog.timer" in timer_op


def test_vllm_is_watched_through_its_own_unit_and_short_times_reach_the_files():
    data = {
        **REFERENCE,
        "backend": "vllm",
        "watchdog_interval_s": 5,
        "watchdog_failures": 2,
        "watchdog_timeout_s": 2,
        "watchdog_completion_every_s": 0,
    }
    files = uploads(watchdog_stage.watchdog, data, fresh_box("ubuntu2404", **PYTHON_THERE))
    settings = json.loads(files[layout.WATCHDOG_CONFIG])
    assert settings["unit"] == layout.VLLM == "gpubox-vllm" and settings["backend"] == "vllm"
    assert (settings["interval_s"], settings["failures"], settings["completion_every_s"]) == (
        5,
        2,
        0,
    )
    assert "OnUnitInactiveSec=5\n" in files[layout.WATCHDOG_TIMER_FILE]
    assert "TimeoutStartSec=36\n" in files[layout.WATCHDOG_UNIT_FILE]


def test_the_grace_is_the_backends_load_unless_the_inventory_sets_it():
    """A start has watchdog_grace_s to answer healthy: llama.cpp's load of its GGUF, vLLM's
    load and compile (docs/watchdog.md), or what the inventory says."""
    grace = lambda **data: load_host_config("b", {**REFERENCE, **data}).watchdog_grace_s  # noqa: E731
    assert grace() == grace(backend="llamacpp") == 900
    assert grace(backend="vllm") == 1800
    assert grace(backend="vllm", watchdog_grace_s=60) == 60
    files = uploads(
        watchdog_stage.watchdog, {**REFERENCE, "backend": "vllm"}, fresh_box("ubuntu2404")
    )
    assert json.loads(files[layout.WATCHDOG_CONFIG])["grace_s"] == 1800


def test_the_api_is_reached_on_its_listening_address():
    url = lambda **data: watchdog_stage.api_url(load_host_config("b", {**REFERENCE, **data}))  # noqa: E731
    assert url() == "http://127.0.0.1:8080"
    assert url(api_host="0.0.0.0", api_port=9000) == "http://127.0.0.1:9000"
    assert url(api_host="::") == "http://127.0.0.1:8080"
    assert url(api_host="::1") == "http://[::1]:8080"
    assert url(api_host="10.0.0.5") == "http://10.0.0.5:8080"


def test_no_secret_in_what_the_stage_writes():
    files = uploads(watchdog_stage.watchdog, REFERENCE, fresh_box("ubuntu2404", **PYTHON_THERE))
    settings = files[layout.WATCHDOG_CONFIG] + files[layout.WATCHDOG_UNIT_FILE]
    assert "Bearer" not in settings and "/etc/gpubox/api-key" in settings  # the path only


def test_python3_is_installed_only_where_it_is_missing(plan_of):
    plan = plan_of(watchdog_stage.watchdog, REFERENCE, fresh_box("ubuntu2404"))
    assert short(plan.names)[0] == "python3 for the watchdog" and "python3" in plan.installs()
    there = plan_of(watchdog_stage.watchdog, REFERENCE, fresh_box("ubuntu2404", **PYTHON_THERE))
    assert "python3 for the watchdog" not in short(there.names)


@pytest.mark.parametrize("data", [{"backend": "none"}, {"watchdog": False}])
def test_no_backend_or_watchdog_false_stops_the_timer_where_it_is_installed(plan_of, data):
    plan = plan_of(
        watchdog_stage.watchdog, {**REFERENCE, **data}, fresh_box("ubuntu2404", **TIMER_THERE)
    )
    assert short(plan.names) == ["Stop and disable the watchdog (no backend, or watchdog false)"]
    assert any("systemctl stop gpubox-watchdog.timer" in c for c in plan.commands)
    nothing = plan_of(watchdog_stage.watchdog, {**REFERENCE, **data}, fresh_box("ubuntu2404"))
    assert nothing.names == []


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("watchdog_interval_s", 0, "must be 1 to 3600, got 0"),
        ("watchdog_failures", 0, "must be 1 to 100, got 0"),
        ("watchdog_grace_s", -1, "must be 0 to 86400, got -1"),
        ("watchdog_busy_limit_s", 86401, "must be 0 to 86400, got 86401"),
        ("watchdog_timeout_s", 0, "must be 1 to 600, got 0"),
        ("watchdog_completion_every_s", -5, "must be 0 to 86400, got -5"),
        ("watchdog_interval_s", "30s", "must be int"),
    ],
)
def test_bad_watchdog_values_are_refused_naming_the_key(key, value, message):
    _, problems = validate("box", {**REFERENCE, key: value})
    errors = [p for p in problems if p.severity == "error"]
    assert [p.key for p in errors] == [key]
    assert message in errors[0].message


def test_full_runs_it_after_the_backend_and_before_verify():
    stages = deploying.FULL_STAGES
    assert stages.index("backend") < stages.index("watchdog") < stages.index("verify")


def test_a_converged_box_plans_no_change(plan_of):
    import hashlib

    from gpubox.config import load_host_config as load

    def line(path: str, text: str, mode: str) -> str:
        return f"{path} {mode} {hashlib.sha256(text.encode()).hexdigest()}"

    files = watchdog_stage.unit_files(load("box", REFERENCE))
    answers = {
        **PYTHON_THERE,
        "for p in /usr/local/lib/gpubox/gpubox-watchdog": [
            line(layout.WATCHDOG_SCRIPT, script_source(), "755")
        ],
        "for p in /etc/gpubox/watchdog.json": [line(p, t, "644") for p, t in files.items()],
        "systemctl show": [
            "Id=gpubox-watchdog.timer",
            "SubState=waiting",
            "UnitFileState=enabled",
        ],
    }
    plan = plan_of(watchdog_stage.watchdog, REFERENCE, fresh_box("ubuntu2404", **answers))
    # nothing uploaded; the timer running and enabled already: no command; what remains is
    # conditional on a change that did not happen
    assert not [n for n in plan.names if "The watchdog's" in n], plan.names
    assert [(n, c) for n, c in plan.ops if c and n not in plan.conditional] == [], plan.ops
    assert {short([n])[0] for n in plan.conditional} == {
        "Reload systemd units (watchdog)",
        "Restart the watchdog's timer with its new settings",
    }
