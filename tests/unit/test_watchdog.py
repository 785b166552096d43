"""The watchdog's script (gpubox.knowledge.watchdog): its decision on recorded readings, run after
run,
its probes against real sockets (a server that answers, one that never does: a frozen
process), and one whole run with systemctl stood in."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers import REFERENCE

from gpubox.checks import Output
from gpubox.checks.core import Reading, Recorded
from gpubox.config import HostConfig, load_host_config
from gpubox.doctor.render import format_watchdog
from gpubox.doctor.view import _describe_watchdog
from gpubox.knowledge import watchdog

FIXTURES = Path(__file__).parents[1] / "fixtures" / "watchdog"
UNIT = "gpubox-llama-server"
SETTINGS = {
    "unit": UNIT,
    "backend": "llamacpp",
    "failures": 3,
    "interval_s": 30,
    "grace_s": 120,
    "timeout_s": 15,
    "completion_every_s": 120,
}
START_US = 1_000_000_000  # the unit became active at 1000 s (CLOCK_MONOTONIC)
HEALTHY = {"active": True, "start_us": START_US, "health": 200, "completion": None}
FROZEN = {
    "active": True,
    "start_us": START_US,
    "health": 0,
    "health_error": "no answer within 15s",
    "completion": None,
    "progress": None,
    "busy": False,
}


def run(readings: list[dict[str, Any]], start: float = 1200.0, step: float = 30.0, state=None):
    """The watchdog's runs over ``readings``, ``step`` s apart: [(action, line)], last state."""
    state = dict(state or {})
    seen = []
    for i, reading in enumerate(readings):
        state, action, line = watchdog.decide(state, reading, SETTINGS, start + i * step, f"t{i}")
        seen.append((action, line))
    return seen, state


def actions(seen) -> list[str]:
    return [a for a, _ in seen]


def test_three_failures_in_a_row_restart_the_unit_once_and_name_why():
    seen, state = run([HEALTHY, FROZEN, FROZEN, FROZEN])
    assert actions(seen) == ["ok", "failure", "failure", "restart"]
    assert seen[1][1] == f"{UNIT}: failed probe 1 of 3: /health no answer within 15s"
    assert seen[3][1] == (
        f"restarting {UNIT} (watchdog restart 1): 3 consecutive failed probes every 30s: "
        "/health no answer within 15s | /health no answer within 15s | /health no answer "
        "within 15s"
    )
    assert state["restarts"] == 1 and state["failures"] == 0 and state["last_restart"] == "t3"
    assert state["last_reason"] == "3 consecutive failed probes (/health no answer within 15s)"


def test_a_success_resets_the_count():
    seen, state = run([HEALTHY, FROZEN, FROZEN, HEALTHY, FROZEN, FROZEN])
    assert actions(seen) == ["ok", "failure", "failure", "ok", "failure", "failure"]
    assert seen[3][1] == f"{UNIT} answers again after 2 failed probe(s)"
    assert state["restarts"] == 0 and state["failures"] == 2


def test_after_its_restart_the_unit_is_not_restarted_again_until_it_answered_healthy():
    seen, state = run([HEALTHY, FROZEN, FROZEN, FROZEN])
    restarted = {**FROZEN, "start_us": START_US + 95_000_000}  # the new start
    later, state = run([restarted] * 10, start=1400.0, state=state)
    assert set(actions(later)) == {"warmup"} and state["restarts"] == 1
    back = {**HEALTHY, "start_us": START_US + 95_000_000}
    again, state = run([back, restarted, restarted, restarted], start=1800.0, state=state)
    assert actions(again) == ["ok", "failure", "failure", "restart"]
    assert again[0][1] == f"{UNIT} answers healthy since its start"
    assert state["restarts"] == 2


def test_nothing_counts_while_the_model_loads_or_within_the_grace():
    loading = {**FROZEN, "health": 503, "health_error": "answered 503"}
    # a server that never answered healthy since its start: however long it takes
    seen, _ = run([loading] * 20, start=1001.0, step=600.0)
    assert set(actions(seen)) == {"warmup"}
    # healthy at once, then failing within the 120 s grace after its start
    seen, state = run([HEALTHY, FROZEN, FROZEN, FROZEN, FROZEN], start=1010.0, step=20.0)
    assert actions(seen) == ["ok", "warmup", "warmup", "warmup", "warmup"]
    assert state["failures"] == 0
    seen, _ = run([FROZEN, FROZEN, FROZEN], start=1130.0, step=20.0, state=state)
    assert actions(seen) == ["failure", "failure", "restart"]


def test_an_inactive_unit_is_left_to_systemd():
    stopped = {"active": False, "start_us": 0}
    seen, state = run([HEALTHY, FROZEN, FROZEN, stopped, FROZEN, FROZEN])
    assert actions(seen) == ["ok", "failure", "failure", "inactive", "failure", "failure"]
    assert state["restarts"] == 0


def test_a_new_start_by_someone_else_begins_a_new_warm_up():
    restarted = {**FROZEN, "start_us": START_US + 40_000_000}
    seen, state = run([HEALTHY, FROZEN, FROZEN, restarted, restarted])
    assert actions(seen) == ["ok", "failure", "failure", "warmup", "warmup"]
    assert state["failures"] == 0 and state["restarts"] == 0


# --- a long answer still streaming: llama.cpp's /metrics recorded in the sandbox (tiny model)


def metrics(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def llamacpp_reading(name: str, **fields: Any) -> dict[str, Any]:
    progress, busy = watchdog.progress_of("llamacpp", watchdog.parse_metrics(metrics(name)))
    return {**HEALTHY, "progress": progress, "busy": busy, **fields}


TIMED_OUT = {"completion": 0, "completion_error": "no answer within 15s"}


def test_llamacpp_metrics_show_work_and_a_busy_slot():
    idle = watchdog.parse_metrics(metrics("llamacpp-metrics-idle.txt"))
    busy = watchdog.parse_metrics(metrics("llamacpp-metrics-busy-1.txt"))
    assert watchdog.progress_of("llamacpp", idle)[1] is False
    progress, is_busy = watchdog.progress_of("llamacpp", busy)
    assert is_busy is True and progress is not None
    assert progress != watchdog.progress_of("llamacpp", idle)[0]


def test_a_long_answer_streaming_is_not_a_failure():
    """Every slot busy: the one-token completion waits past its timeout, but the token counters
    advance between probes; a busy server whose counters stand still is hung."""
    first = llamacpp_reading("llamacpp-metrics-busy-1.txt", **TIMED_OUT)
    second = llamacpp_reading("llamacpp-metrics-busy-2.txt", **TIMED_OUT)
    assert first["progress"] != second["progress"]
    seen, state = run([HEALTHY, first, second, first, second, first])
    assert actions(seen) == ["ok", "failure", "busy", "busy", "busy", "busy"]
    assert seen[2][1] == (
        f"{UNIT} is busy and its token counters advance; not counted: a one-token completion "
        "no answer within 15s"
    )
    assert state["failures"] == 1
    # the counters stop: the count goes on from 1
    stuck, state = run([second, second, second], start=1500.0, state=state)
    assert actions(stuck) == ["busy", "failure", "restart"] and state["restarts"] == 1


# vLLM is not run here: its samples as its /metrics prints them (names and labels from vLLM's
# metrics documentation; the counters' _created companions; a sample with a timestamp), with
# values of our own: not a recording.
VLLM_RUNNING = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3-next"} 2.0
vllm:num_requests_waiting{engine="0",model_name="qwen3-next"} 1.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="qwen3-next"} 412.0 1764838800000
vllm:prompt_tokens_created{engine="0",model_name="qwen3-next"} 1.7648388e+09
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="qwen3-next"} 1536.0
vllm:generation_tokens_created{engine="0",model_name="qwen3-next"} 1.7648388e+09
"""


def test_vllm_counters_and_its_running_requests():
    running = watchdog.parse_metrics(VLLM_RUNNING)
    assert watchdog.progress_of("vllm", running) == ([1536.0, 412.0], True)
    later = watchdog.parse_metrics(VLLM_RUNNING.replace("} 1536.0", "} 1590.0"))
    assert watchdog.progress_of("vllm", later) == ([1590.0, 412.0], True)
    idle = watchdog.parse_metrics(VLLM_RUNNING.replace("} 2.0", "} 0.0"))
    assert watchdog.progress_of("vllm", idle)[1] is False
    vllm = {**SETTINGS, "backend": "vllm"}
    stuck = {**HEALTHY, **TIMED_OUT, "progress": [1536.0, 412.0], "busy": True}
    going = {**stuck, "progress": [1590.0, 412.0]}
    state: dict[str, Any] = {}
    seen = []
    for i, reading in enumerate([HEALTHY, stuck, going, going, going]):
        state, action, _ = watchdog.decide(state, reading, vllm, 1200.0 + 30 * i)
        seen.append(action)
    assert seen == ["ok", "failure", "busy", "failure", "restart"]


def test_metrics_without_the_counters_prove_nothing():
    assert watchdog.progress_of("llamacpp", {"process_cpu_seconds_total": 3.0}) == (None, False)
    reading = {**HEALTHY, **TIMED_OUT, "progress": None, "busy": True}
    seen, _ = run([HEALTHY, reading, reading, reading])
    assert actions(seen) == ["ok", "failure", "failure", "restart"]


def test_the_completion_is_sent_every_few_minutes_and_at_every_run_while_counting():
    settings = SETTINGS
    assert watchdog.completion_due({}, settings, 50.0)
    assert not watchdog.completion_due({"last_completion": 1000.0}, settings, 1100.0)
    assert watchdog.completion_due({"last_completion": 1000.0}, settings, 1120.0)
    assert watchdog.completion_due({"last_completion": 1000.0, "failures": 1}, settings, 1001.0)
    # after a reboot CLOCK_MONOTONIC starts again, below the last completion
    assert watchdog.completion_due({"last_completion": 9000.0}, settings, 30.0)
    state, _, _ = watchdog.decide({}, {**HEALTHY, "completion": 200}, settings, 1300.0)
    assert state["last_completion"] == 1300.0


# --- the probes, against real sockets


class Answers(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        Answers.seen.append((self.path, self.headers.get("Authorization", ""), body))
        text = {
            "/health": '{"status":"ok"}',
            "/metrics": metrics("llamacpp-metrics-busy-1.txt"),
            "/v1/completions": '{"choices":[{"text":"x"}]}',
        }.get(self.path)
        self.send_response(200 if text else 404)
        self.end_headers()
        self.wfile.write((text or "").encode())

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Answers.seen = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def frozen():
    """A listening socket nobody accepts from: what a SIGSTOPped server's port does."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def settings_for(url: str, tmp_path: Path) -> dict[str, Any]:
    key = tmp_path / "api-key"
    key.write_text("s3cret\n")
    return {
        **SETTINGS,
        "url": url,
        "model": "qwen3-next",
        "key_file": str(key),
        "timeout_s": 1,
        "state_file": str(tmp_path / "state" / "watchdog.json"),
    }


def test_a_reading_of_a_working_server_with_the_key_in_a_header(server, tmp_path, monkeypatch):
    monkeypatch.setattr(watchdog, "unit_state", lambda unit: {"active": True, "start_us": 5})
    reading = watchdog.read(settings_for(server, tmp_path), {}, 100.0)
    assert reading["health"] == 200 and reading["completion"] == 200
    assert reading["busy"] is True and reading["progress"]
    assert [p for p, _, _ in Answers.seen] == ["/health", "/v1/completions", "/metrics"]
    assert {a for _, a, _ in Answers.seen} == {"Bearer s3cret"}
    body = json.loads(Answers.seen[1][2])
    assert body == {"model": "qwen3-next", "prompt": "1", "max_tokens": 1, "temperature": 0}


def test_a_frozen_server_is_no_answer_in_time(frozen, tmp_path, monkeypatch):
    monkeypatch.setattr(watchdog, "unit_state", lambda unit: {"active": True, "start_us": 5})
    reading = watchdog.read(settings_for(frozen, tmp_path), {}, 100.0)
    assert reading["health"] == 0 and reading["health_error"] == "no answer within 1s"
    assert reading["completion"] is None and reading["progress"] is None


def test_a_whole_run_restarts_through_systemctl_and_keeps_the_count(
    frozen, tmp_path, monkeypatch, capsys
):
    settings = settings_for(frozen, tmp_path)
    config = tmp_path / "watchdog.json"
    config.write_text(json.dumps(settings))
    calls: list[list[str]] = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    def systemctl(argv: list[str], **kwargs: Any) -> Done:
        calls.append(argv)
        done = Done()
        if argv[1] == "show":
            done.stdout = "ActiveState=active\nActiveEnterTimestampMonotonic=5000000\nMainPID=42\n"
        return done

    monkeypatch.setattr(watchdog.subprocess, "run", systemctl)
    state_file = Path(settings["state_file"])
    state_file.parent.mkdir()
    state_file.write_text(json.dumps({"start_us": 5_000_000, "healthy": True, "failures": 2}))
    assert watchdog.main(["watchdog", str(config)]) == 0
    assert calls[-1] == ["systemctl", "restart", "--no-block", UNIT]
    state = json.loads(state_file.read_text())
    assert state["restarts"] == 1 and state["failures"] == 0 and state["last_action"] == "restart"
    out = capsys.readouterr().out
    assert out.startswith(f"<3>restarting {UNIT} (watchdog restart 1): 3 consecutive failed")
    assert "s3cret" not in out and all("s3cret" not in " ".join(c) for c in calls)


# --- what doctor shows


def describe_watchdog(outputs: dict[str, Output], config: HostConfig) -> dict[str, Any]:
    """doctor's watchdog view of these outputs, read as the checks read them."""
    return _describe_watchdog(Reading(config, Recorded(outputs)), config)


def watchdog_output(timer: str, state: str) -> dict[str, Output]:
    text = f"@@gpubox timer\nId=gpubox-watchdog.timer\n{timer}@@gpubox state\n{state}"
    return {"watchdog": Output(0, text, "", "")}


ACTIVE = "LoadState=loaded\nActiveState=active\nUnitFileState=enabled\n"


def test_doctor_shows_the_restart_count_the_last_restart_and_why():
    config = load_host_config("box", REFERENCE)
    record = {
        "restarts": 2,
        "failures": 1,
        "last_restart": "2026-12-02T08:20:11+00:00",
        "last_reason": "3 consecutive failed probes (/health no answer within 15s)",
    }
    view = describe_watchdog(watchdog_output(ACTIVE, json.dumps(record)), config)
    assert (view["active"], view["enabled"], view["restarts"]) == ("active", "enabled", 2)
    assert format_watchdog(view) == (
        "timer active/enabled, 2 restart(s), last 2026-12-02T08:20:11+00:00: 3 consecutive "
        "failed probes (/health no answer within 15s); 1 failed probe(s) now"
    )


def test_doctor_before_the_first_run_and_without_the_timer():
    config = load_host_config("box", REFERENCE)
    fresh = describe_watchdog(watchdog_output(ACTIVE, ""), config)
    assert format_watchdog(fresh) == "timer active/enabled, no run recorded yet"
    gone = "LoadState=not-found\nActiveState=inactive\nUnitFileState=\n"
    view = describe_watchdog(watchdog_output(gone, ""), config)
    assert format_watchdog(view) == "timer inactive/not installed, no run recorded yet"
    broken = describe_watchdog(watchdog_output(ACTIVE, "{not json"), config)
    assert format_watchdog(broken) == (
        "timer active/enabled, /var/lib/gpubox/watchdog.json is not JSON"
    )
