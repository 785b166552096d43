"""doctor's alerts line (gpubox.doctor.alerts, issue 31 C6): the monitor's Alertmanager asked
once (curl on the monitor, through its SSH), its answer parsed (gpubox.parsers.alertmanager,
on Debian 12's Alertmanager 0.25's own recorded answers: tests/fixtures/SOURCES.md), each
box's firing alerts in its screen and its JSON; no monitor, no line; an Alertmanager that does
not answer, one line saying so."""

from __future__ import annotations

import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers import REFERENCE

from gpubox import parsers
from gpubox.checks import Output
from gpubox.config import load_host_config
from gpubox.doctor import alerts, cli, render

FIXTURES = Path(__file__).parents[1] / "fixtures" / "alertmanager"
ALL = (FIXTURES / "alerts_all_0.25.0_local.json").read_text(encoding="utf-8")
FIRING = (FIXTURES / "alerts_active-unsilenced_0.25.0_local.json").read_text(encoding="utf-8")
CONFIG = load_host_config("box1", REFERENCE)


def names(by_host: dict[str, list[parsers.Alert]]) -> dict[str, list[str]]:
    return {host: [a.name for a in found] for host, found in by_host.items()}


def test_the_recorded_answer_parses_with_its_states():
    found = parsers.parse_alerts(ALL)
    assert [(a.name, a.host, a.severity, a.state) for a in found] == [
        ("Watchdog", "", "none", "active"),
        ("BackendDown", "box3", "critical", "active"),
        ("GpuMissing", "box3", "critical", "active"),
        ("RebootPending", "box2", "warning", "active"),
        ("DeployFailed", "box1", "warning", "suppressed"),
    ]
    assert found[2].summary == "box3: 1 GPU(s) missing" and found[2].starts_at.startswith("2026-")


def test_only_active_alerts_with_a_host_are_grouped_by_it():
    expected = {"box3": ["BackendDown", "GpuMissing"], "box2": ["RebootPending"]}
    assert names(parsers.firing_by_host(parsers.parse_alerts(ALL))) == expected
    # doctor's query leaves the silenced one out already: the same grouping
    assert names(parsers.firing_by_host(parsers.parse_alerts(FIRING))) == expected
    assert parsers.firing_by_host(parsers.parse_alerts("[]")) == {}


@pytest.mark.parametrize("text", ["<html>404</html>", '{"alerts": []}', '[{"labels": {}}]'])
def test_something_else_is_a_parse_error(text):
    with pytest.raises(parsers.ParseError):
        parsers.parse_alerts(text)


def test_the_monitor_is_the_host_with_monitoring_prometheus():
    hosts = [("box1", {}), ("box2", {"monitoring": "prometheus"}), ("box3", {})]
    assert alerts.monitor_of(hosts) == "box2"
    assert alerts.monitor_of([("box1", {"monitoring": "none"}), ("box2", {})]) is None


def recorded(text: str, rc: int = 0, err: str = ""):
    seen: list[str] = []

    def run(command: str) -> Output:
        seen.append(command)
        return Output(rc, text, err, command)

    return run, seen


def test_each_box_gets_its_line_and_its_json_field():
    run, seen = recorded(FIRING)
    fleet = alerts.read(run, "box1", CONFIG)
    assert seen == [
        "curl -sS --fail --max-time 10 "
        "'http://127.0.0.1:9093/api/v2/alerts?active=true&silenced=false&inhibited=false"
        "&unprocessed=false'"
    ]
    box3 = alerts.view_for(fleet, "box3")
    assert render.format_alerts(box3) == "BackendDown (critical), GpuMissing (critical)"
    assert box3["firing"][1] == {
        "alert": "GpuMissing",
        "severity": "critical",
        "since": box3["firing"][1]["since"],
        "summary": "box3: 1 GPU(s) missing",
    }
    assert render.format_alerts(alerts.view_for(fleet, "box1")) == "none"  # silenced
    assert render.format_alerts(alerts.view_for(fleet, "box4")) == "none"


def test_an_alertmanager_that_does_not_answer_is_one_line_not_a_crash():
    run, _ = recorded("", 7, "curl: (7) Failed to connect to 127.0.0.1 port 9093 after 0 ms")
    line = render.format_alerts(alerts.view_for(alerts.read(run, "box1", CONFIG), "box3"))
    assert line == (
        "? Alertmanager on box1 (127.0.0.1:9093) does not answer: curl: (7) Failed to connect "
        "to 127.0.0.1 port 9093 after 0 ms"
    )

    def lost(command: str) -> Output:
        raise EOFError("connection lost")

    line = render.format_alerts(alerts.view_for(alerts.read(lost, "box1", CONFIG), "box3"))
    assert line == "? Alertmanager on box1 (127.0.0.1:9093) not asked: EOFError: connection lost"
    run, _ = recorded("<html>not found</html>")
    assert "answered something else" in alerts.read(run, "box1", CONFIG).error
    gone = alerts.view_for(alerts.unreachable("box1", "ssh: timed out"), "box3")
    assert render.format_alerts(gone) == "? the monitor box1 cannot be reached: ssh: timed out"


def test_the_doctor_run_reads_the_monitor_once_and_shows_an_unreachable_boxs_alerts():
    """cli's helpers: the monitor asked through its own connection, once; an unreachable box's
    screen keeps its one line and adds its alerts."""
    connected: list[str] = []
    commands: list[str] = []

    class Host:
        def run(self, command: str) -> Any:
            commands.append(command)
            return type("R", (), {"rc": 0, "stdout": ALL, "stderr": ""})()

    def connect(name: str, data: dict[str, Any]) -> Host:
        connected.append(name)
        return Host()

    hosts = [("box1", {"monitoring": "prometheus"}), ("box3", {})]
    configs = {"box1": CONFIG, "box3": load_host_config("box3", REFERENCE)}
    fleet = cli._fleet_alerts(hosts, configs, {}, connect)
    assert connected == ["box1"] and len(commands) == 1 and fleet is not None
    reports: list[dict[str, Any]] = []
    screens: list[str] = []
    rows: list[dict[str, Any]] = []
    cli._unreachable("box3", configs["box3"], "no route to host", reports, screens, rows, fleet)
    assert screens[0].splitlines()[1] == "Alerts    BackendDown (critical), GpuMissing (critical)"
    assert [a["alert"] for a in reports[0]["alerts"]["firing"]] == ["BackendDown", "GpuMissing"]
    assert cli._fleet_alerts([("box1", {})], configs, {}, connect) is None  # no monitor
    assert connected == ["box1"]
    down = cli._fleet_alerts(hosts, configs, {"box1": "timed out"}, connect)
    assert down is not None and down.error == "the monitor box1 cannot be reached: timed out"


def test_the_screen_has_the_line_and_the_json_the_field(tmp_path):
    """A whole doctor screen and report of a box (test_doctor.py's stand-in host)."""
    import json

    from test_doctor import NOW, StandinHost

    from gpubox import doctor

    config = load_host_config("box", REFERENCE)
    facts = doctor.gather(StandinHost(tmp_path), config)
    view = doctor.describe(config, facts, NOW)
    verdicts = doctor.evaluate("box", config, facts, "inv.py")
    assert "Alerts" not in doctor.render_text("box", view, verdicts)  # no monitor: no line
    run, _ = recorded(FIRING.replace('"box3"', '"box"'))
    view["alerts"] = alerts.view_for(alerts.read(run, "box1", CONFIG), "box")
    lines = doctor.render_text("box", view, verdicts).splitlines()
    assert "Alerts    BackendDown (critical), GpuMissing (critical)" in lines
    report = json.loads(doctor.render_json([doctor.host_report("box", view, verdicts)]))
    assert [a["alert"] for a in report["hosts"][0]["alerts"]["firing"]] == [
        "BackendDown",
        "GpuMissing",
    ]


# --- the command itself, against a stand-in Alertmanager on 127.0.0.1


class Recorded(BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_GET(self) -> None:
        Recorded.paths.append(self.path)
        body = FIRING.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def shell(command: str) -> Output:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    return Output(done.returncode, done.stdout, done.stderr, command)


def test_curl_asks_alertmanagers_api_and_a_closed_port_is_its_error_line():
    """The stand-in answers Alertmanager's recorded answer to one request, then stops."""
    httpd = HTTPServer(("127.0.0.1", 0), Recorded)
    httpd.timeout = 10
    port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.handle_request, daemon=True)
    thread.start()
    Recorded.paths = []
    config = type("C", (), {"alertmanager_address": "0.0.0.0", "alertmanager_port": port})()
    fleet = alerts.read(shell, "box1", config)  # type: ignore[arg-type]
    thread.join(10)
    httpd.server_close()
    assert Recorded.paths == [alerts.QUERY]
    assert names(fleet.by_host) == {
        "box3": ["BackendDown", "GpuMissing"],
        "box2": ["RebootPending"],
    }
    closed = alerts.read(shell, "box1", config)  # type: ignore[arg-type]
    assert closed.error is not None
    assert closed.error.startswith(
        f"Alertmanager on box1 (127.0.0.1:{port}) does not answer: curl: (7)"
    )
