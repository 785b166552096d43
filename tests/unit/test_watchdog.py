"""The watchdog's script (gpubox.knowledge.watchdog): its decision on recorded readings, run after
run (the warm-up bounded by the grace, issue 29 C7; a request running taken as progress until
the busy limit, issue 29 C6), its probes against real sockets (a server that answers, one that
never does: a frozen process, one slow to answer /health during a long prompt), and whole runs
with systemctl stood in."""

from __future__ import annotations

import json
import socket
import threading
import time
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
    "busy_limit_s": 300,
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


def test_after_its_restart_a_server_that_never_answers_is_restarted_again_after_the_grace():
    seen, state = run([HEALTHY, FROZEN, FROZEN, FROZEN])
    assert state["restarts"] == 1
    restarted = {**FROZEN, "start_us": START_US + 395_000_000}  # the new start, at 1395 s
    # ages 5, 35, 65, 95 s: within the 120 s grace; from 125 s its failures count
    later, state = run([restarted] * 7, start=1400.0, state=state)
    assert actions(later) == ["warmup"] * 4 + ["failure", "failure", "restart"]
    assert later[4][1] == (
        f"{UNIT}: failed probe 1 of 3: /health no answer within 15s (not healthy 125s after its "
        "start; grace 120s)"
    )
    assert state["restarts"] == 2
    back = {**HEALTHY, "start_us": START_US + 800_000_000}
    again, state = run([back, back, FROZEN | {"start_us": START_US + 800_000_000}], 1810.0)
    assert actions(again) == ["ok", "ok", "failure"]
    assert again[0][1] == f"{UNIT} answers healthy since its start"


# --- the warm-up is bounded (issue 29 C7): a start has grace_s to answer healthy


def test_a_server_frozen_right_after_the_deploy_is_restarted_after_the_grace():
    """The deploy saw it healthy (its own wait for /health); it froze before the watchdog's
    first probe of this start. Measured before the fix: never restarted within 600 s."""
    new_start = {**FROZEN, "start_us": 2_000_000_000}  # started at 2000 s
    seen_before = {"start_us": START_US, "healthy": True, "restarts": 0}  # the last start
    for state in ({}, seen_before):
        seen, after = run([new_start] * 7, start=2010.0, state=state)
        # ages 10, 40, 70, 100 s: the grace; 130 s on: counted
        assert actions(seen) == ["warmup"] * 4 + ["failure", "failure", "restart"]
        assert after["restarts"] == state.get("restarts", 0) + 1
        assert "(not healthy 130s after its start; grace 120s)" in seen[4][1]


def test_a_server_that_never_becomes_healthy_is_restarted_after_the_grace():
    """A load that hangs (vLLM's first user: the server "hangs steadily" while it loads)."""
    loading = {**FROZEN, "health": 503, "health_error": "answered 503"}
    seen, state = run([loading] * 8, start=1001.0, step=20.0)
    # ages 1 to 101 s: warm-up; 121 s: the grace has passed
    assert actions(seen) == ["warmup"] * 6 + ["failure", "failure"]
    assert seen[6][1] == (
        f"{UNIT}: failed probe 1 of 3: /health answered 503 (not healthy 121s after its start; "
        "grace 120s)"
    )
    more, state = run([loading], start=1161.0, state=state)
    assert actions(more) == ["restart"] and state["restarts"] == 1
    assert state["last_reason"].startswith("3 consecutive failed probes (/health answered 503")


def test_a_load_within_the_grace_is_left_alone_and_its_first_healthy_answer_ends_the_warm_up():
    loading = {**FROZEN, "health": 503, "health_error": "answered 503"}
    seen, state = run([loading, loading, loading, HEALTHY], start=1010.0, step=30.0)
    assert actions(seen) == ["warmup", "warmup", "warmup", "ok"]
    # healthy at 100 s: the warm-up is over, a failure at 110 s counts, grace or not
    seen, state = run([FROZEN, FROZEN, FROZEN], start=1110.0, step=5.0, state=state)
    assert actions(seen) == ["failure", "failure", "restart"]
    # a grace of 0: failures count from the start
    zero = {**SETTINGS, "grace_s": 0}
    state, action, _ = watchdog.decide({}, {**FROZEN, "start_us": 1_100_000_000}, zero, 1100.0)
    assert action == "failure"


def test_an_inactive_unit_is_left_to_systemd():
    stopped = {"active": False, "start_us": 0}
    seen, state = run([HEALTHY, FROZEN, FROZEN, stopped, FROZEN, FROZEN])
    assert actions(seen) == ["ok", "failure", "failure", "inactive", "failure", "failure"]
    assert state["restarts"] == 0


def test_a_new_start_by_someone_else_begins_a_new_warm_up():
    restarted = {**FROZEN, "start_us": START_US + 280_000_000}  # at 1280 s
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
    assert actions(seen) == ["ok", "busy", "busy", "busy", "busy", "busy"]
    assert seen[2][1] == (
        f"{UNIT} is busy and its token counters advance; not counted: a one-token completion "
        "no answer within 15s"
    )
    assert state["failures"] == 0
    # the counters stop: a request running is progress for busy_limit_s (300 s), no longer
    stuck, state = run([second] * 14, start=1500.0, state=state)
    assert actions(stuck) == ["busy"] * 11 + ["failure", "failure", "restart"]
    assert stuck[1][1] == (
        f"{UNIT} has a request running and nothing moved for 0s (the limit is 300s); not "
        "counted: a one-token completion no answer within 15s"
    )
    assert "(a request running, nothing moved for 300s or more)" in stuck[11][1]
    assert state["restarts"] == 1


# vLLM is not run here: its samples as its /metrics prints them (names and labels from vLLM's
# metrics documentation and vllm/v1/metrics/loggers.py, PrometheusStatLogger; the counters'
# _created companions; a sample with a timestamp), with values of our own: not a recording.
VLLM_RUNNING = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3-next"} 2.0
vllm:num_requests_waiting{engine="0",model_name="qwen3-next"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen3-next"} 0.25
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="qwen3-next"} 412.0 1764838800000
vllm:prompt_tokens_created{engine="0",model_name="qwen3-next"} 1.7648388e+09
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="qwen3-next"} 1536.0
vllm:generation_tokens_created{engine="0",model_name="qwen3-next"} 1.7648388e+09
"""


def test_vllm_counters_and_its_running_requests():
    running = watchdog.parse_metrics(VLLM_RUNNING)
    assert watchdog.progress_of("vllm", running) == ([1536.0, 412.0, 0.25], True)
    later = watchdog.parse_metrics(VLLM_RUNNING.replace("} 1536.0", "} 1590.0"))
    assert watchdog.progress_of("vllm", later) == ([1590.0, 412.0, 0.25], True)
    idle = watchdog.parse_metrics(VLLM_RUNNING.replace("} 2.0", "} 0.0"))
    assert watchdog.progress_of("vllm", idle)[1] is False
    # busy_limit_s 0: a request running whose counters stand still proves nothing
    vllm = {**SETTINGS, "backend": "vllm", "busy_limit_s": 0}
    stuck = {**HEALTHY, **TIMED_OUT, "progress": [1536.0, 412.0, 0.25], "busy": True}
    going = {**stuck, "progress": [1590.0, 412.0, 0.25]}
    state: dict[str, Any] = {}
    seen = []
    for i, reading in enumerate([HEALTHY, stuck, going, going, going]):
        state, action, _ = watchdog.decide(state, reading, vllm, 1200.0 + 30 * i)
        seen.append(action)
    assert seen == ["ok", "failure", "busy", "failure", "restart"]


def test_a_chunked_prefill_moves_vllms_kv_cache_gauge_and_that_is_progress():
    """vLLM counts a prompt's tokens when its prefill ends; each chunk of a long prompt takes KV
    blocks, and kv_cache_usage_perc is set at every engine step."""
    chunk = {**HEALTHY, **TIMED_OUT, "busy": True}
    usage = [0.25, 0.31, 0.37, 0.43, 0.49, 0.55, 0.61, 0.67, 0.73, 0.79, 0.85, 0.91, 0.97]
    readings = [{**chunk, "progress": [1536.0, 412.0, u]} for u in usage]
    seen, state = run([HEALTHY, *readings], start=1200.0)
    assert actions(seen) == ["ok"] + ["busy"] * len(usage)
    assert all("token counters advance" in line for _, line in seen[2:])
    assert state["failures"] == 0 and state["still_since"] is None


def test_a_running_request_without_counters_is_progress_until_the_busy_limit():
    assert watchdog.progress_of("llamacpp", {"process_cpu_seconds_total": 3.0}) == (None, False)
    reading = {**HEALTHY, **TIMED_OUT, "progress": None, "busy": True}
    seen, _ = run([HEALTHY, *[reading] * 13])
    assert actions(seen) == ["ok"] + ["busy"] * 10 + ["failure", "failure", "restart"]
    idle = {**reading, "busy": False}
    seen, _ = run([HEALTHY, idle, idle, idle])
    assert actions(seen) == ["ok", "failure", "failure", "restart"]


# --- a probe slow to answer during a long prompt (issue 29 C6)

# /health gives no answer in time; /metrics says a request runs and nothing moved (a prefill
# that has not ended, a Triton compile)
SLOW = {
    **FROZEN,
    "health_error": "no answer within 15s",
    "progress": [1536.0, 412.0, 0.25],
    "busy": True,
}
# the same run where /metrics gave no answer either
SILENT = {**FROZEN, "busy": None}


def test_a_probe_with_no_answer_while_a_request_runs_is_not_counted_until_the_busy_limit():
    idle = {**HEALTHY, "progress": [1536.0, 412.0, 0.0], "busy": False}
    seen, state = run([idle, *[SLOW] * 14])
    # the first reading of the request: the KV cache gauge moved since the idle one
    assert actions(seen) == ["ok"] + ["busy"] * 11 + ["failure", "failure", "restart"]
    assert seen[3][1] == (
        f"{UNIT} has a request running and nothing moved for 30s (the limit is 300s); not "
        "counted: /health no answer within 15s"
    )
    # nothing answers at all, /metrics included, after a request was seen running: judged
    # by what /metrics said last (a frozen server with a request in flight waits the limit)
    seen, state = run([idle, SLOW, SILENT, SILENT, *[SILENT] * 11], start=2000.0)
    assert actions(seen) == ["ok"] + ["busy"] * 11 + ["failure", "failure", "restart"]
    # and one idle when it froze is counted at once
    seen, _ = run([idle, SILENT, SILENT, SILENT], start=3000.0)
    assert actions(seen) == ["ok", "failure", "failure", "restart"]


def test_the_busy_limit_counts_from_the_first_still_reading_and_restarts_when_anything_moves():
    moving = {**SLOW, "progress": [1536.0, 412.0, 0.5]}
    seen, state = run([HEALTHY, *[SLOW] * 9, moving, *[moving] * 9])
    # 270 s still, then the gauge moved: the stillness starts again from that reading
    assert actions(seen) == ["ok"] + ["busy"] * 19
    assert state["failures"] == 0


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
    assert reading["busy"] is None  # /metrics gave no answer either


class Systemctl:
    """systemctl stood in: ``show`` answers the unit active since each of ``starts`` (µs of
    CLOCK_MONOTONIC) in turn, the last one from then on; every call is kept."""

    def __init__(self, *starts: int) -> None:
        self.starts, self.calls = list(starts), []

    def __call__(self, argv: list[str], **kwargs: Any) -> Any:
        self.calls.append(argv)
        out = ""
        if argv[1] == "show":
            start = self.starts.pop(0) if len(self.starts) > 1 else self.starts[0]
            out = f"ActiveState=active\nActiveEnterTimestampMonotonic={start}\nMainPID=42\n"
        return type("Done", (), {"returncode": 0, "stdout": out, "stderr": ""})()

    def restarts(self) -> list[list[str]]:
        return [c for c in self.calls if c[1] == "restart"]


def one_run(settings: dict[str, Any], tmp_path: Path, state: dict[str, Any]) -> Path:
    """The settings' file, and the state file holding ``state``, for ``main``."""
    config = tmp_path / "watchdog.json"
    config.write_text(json.dumps(settings))
    state_file = Path(settings["state_file"])
    state_file.parent.mkdir(exist_ok=True)
    state_file.write_text(json.dumps(state))
    return config


def test_a_whole_run_restarts_through_systemctl_and_keeps_the_count(
    frozen, tmp_path, monkeypatch, capsys
):
    settings = settings_for(frozen, tmp_path)
    systemctl = Systemctl(5_000_000)
    monkeypatch.setattr(watchdog.subprocess, "run", systemctl)
    config = one_run(settings, tmp_path, {"start_us": 5_000_000, "healthy": True, "failures": 2})
    assert watchdog.main(["watchdog", str(config)]) == 0
    assert systemctl.calls[-1] == ["systemctl", "restart", "--no-block", UNIT]
    state = json.loads(Path(settings["state_file"]).read_text())
    assert state["restarts"] == 1 and state["failures"] == 0 and state["last_action"] == "restart"
    out = capsys.readouterr().out
    assert out.startswith(f"<3>restarting {UNIT} (watchdog restart 1): 3 consecutive failed")
    assert "s3cret" not in out and all("s3cret" not in " ".join(c) for c in systemctl.calls)


def test_a_unit_started_again_during_the_run_is_not_restarted(
    frozen, tmp_path, monkeypatch, capsys
):
    """A deploy restarts the server while a run probes it: the run's failure is the old
    start's, and the new start has its own warm-up (no stop of the watchdog needed)."""
    settings = settings_for(frozen, tmp_path)
    systemctl = Systemctl(5_000_000, 9_000_000)
    monkeypatch.setattr(watchdog.subprocess, "run", systemctl)
    config = one_run(settings, tmp_path, {"start_us": 5_000_000, "healthy": True, "failures": 2})
    assert watchdog.main(["watchdog", str(config)]) == 0
    assert systemctl.restarts() == []
    state = json.loads(Path(settings["state_file"]).read_text())
    assert state["last_action"] == "warmup" and state["failures"] == 0
    assert state.get("restarts", 0) == 0 and state["start_us"] is None
    assert capsys.readouterr().out == f"<5>{UNIT} started again during this run; not restarted\n"


# vLLM in a long prompt (a prefill of many chunks not yet ended, or an engine step held by a
# Triton compile): a request runs and nothing moves. The names: vllm/v1/metrics/loggers.py
# (PrometheusStatLogger); the token counters stand still because vLLM counts a prompt's
# tokens when its prefill ends (vllm/v1/metrics/stats.py, IterationStats.update_from_output).
# Values of our own, not a recording.
VLLM_PREFILL = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3-next"} 1.0
vllm:num_requests_waiting{engine="0",model_name="qwen3-next"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen3-next"} 0.42
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="qwen3-next"} 412.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="qwen3-next"} 1536.0
"""
# How long the stand-in takes to answer /health: past the probe's timeout (LONG_PROMPT_PROBE_S).
# A guess, no record: a server whose HTTP side waits on its busy engine (llama.cpp's /metrics
# goes through its task queue; vLLM's API process can be held by a huge prompt's tokenizing).
HEALTH_DELAY_S = 1.0
LONG_PROMPT_PROBE_S = 0.3


class LongPrompt(BaseHTTPRequestHandler):
    """The stand-in of a server in a long prompt: /metrics at once, /health too late."""

    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        LongPrompt.seen.append((self.path, self.headers.get("Authorization", "")))
        if self.path == "/health":
            time.sleep(HEALTH_DELAY_S)
        body = VLLM_PREFILL if self.path == "/metrics" else ""
        try:
            self.send_response(200 if self.path in ("/health", "/metrics") else 404)
            self.end_headers()
            self.wfile.write(body.encode())
        except OSError:
            pass  # the probe stopped waiting

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def long_prompt():
    """The stand-in on 127.0.0.1: a bounded loop (at most 150 waits of 0.2 s: 30 s), which
    also stops when the test ends."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), LongPrompt)
    httpd.daemon_threads, httpd.timeout = True, 0.2
    done = threading.Event()

    def serve() -> None:
        for _ in range(150):
            if done.is_set():
                break
            httpd.handle_request()
        httpd.server_close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    LongPrompt.seen = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    done.set()
    thread.join(5)


def test_a_server_slow_to_answer_during_a_long_prompt_is_restarted_only_after_the_busy_limit(
    long_prompt, tmp_path, monkeypatch, capsys
):
    """The timer's runs (``main``, the script the box runs) against the stand-in, 30 s apart
    on the watchdog's clock: /health never answers in time, /metrics shows a request running
    with nothing moving. Not counted for busy_limit_s (90 s here), then counted and restarted."""
    settings = {
        **settings_for(long_prompt, tmp_path),
        "backend": "vllm",
        "unit": "gpubox-vllm",
        "failures": 2,
        "busy_limit_s": 90,
        "timeout_s": LONG_PROMPT_PROBE_S,
    }
    systemctl = Systemctl(5_000_000)
    monkeypatch.setattr(watchdog.subprocess, "run", systemctl)
    # served and seen healthy since its start at 5 s (past its grace); the long prompt came
    config = one_run(settings, tmp_path, {"start_us": 5_000_000, "healthy": True})
    clock = iter([1000.0, 1030.0, 1060.0, 1090.0, 1120.0])
    monkeypatch.setattr(watchdog, "time", type("Clock", (), {"monotonic": lambda: next(clock)}))
    seen = []
    for _ in range(5):
        assert watchdog.main(["watchdog", str(config)]) == 0
        state = json.loads(Path(settings["state_file"]).read_text())
        seen.append((state["last_action"], len(systemctl.restarts())))
    assert seen == [("busy", 0), ("busy", 0), ("busy", 0), ("failure", 0), ("restart", 1)]
    assert systemctl.restarts() == [["systemctl", "restart", "--no-block", "gpubox-vllm"]]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "<4>gpubox-vllm has a request running and nothing moved for 0s (the limit is 90s); "
        "not counted: /health no answer within 0.3s"
    )
    assert lines[3] == (
        "<4>gpubox-vllm: failed probe 1 of 2: /health no answer within 0.3s (a request "
        "running, nothing moved for 90s or more)"
    )
    assert lines[4].startswith("<3>restarting gpubox-vllm (watchdog restart 1): 2 consecutive")
    # every run asked /health, then /metrics (no completion: /health never said 200)
    assert [p for p, _ in LongPrompt.seen] == ["/health", "/metrics"] * 5
    assert {a for _, a in LongPrompt.seen} == {"Bearer s3cret"}


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
