"""The watchdog of the API server, as it runs on the box: gpubox.stages.watchdog uploads this
file whole (to layout.WATCHDOG_SCRIPT) and a systemd timer runs it every watchdog_interval_s as
a oneshot service, as root. It imports nothing but Python's standard library.

One run: read the server unit's state (``systemctl show``), probe the API (/health every run; a
one-token completion every watchdog_completion_every_s, and at every run while failures are
counted), read /metrics, then ``decide`` (pure, unit-tested on recorded readings) what the run
means, keep the state file and act:

- a run whose probes pass resets the count of consecutive failures;
- no failure counts while the unit is inactive (systemd's own Restart= is in charge);
- warm-up: a start of the unit (its ActiveEnterTimestampMonotonic, read from systemd, so a
  start the watchdog never saw counts from the start itself) has grace_s to answer healthy;
  the warm-up ends at its first healthy answer or when grace_s has passed, and after that
  every failure counts, whether or not the server was ever seen healthy (a load that hangs, a
  server frozen right after the deploy saw it healthy);
- a request running is progress: a failed run while /metrics shows a request running is not
  counted while the work counters advance, nor, when nothing moves (a long prefill, a kernel
  compile: vLLM counts prompt tokens only when a prefill ends), for busy_limit_s since the
  server was first seen running a request with nothing moving. A probe with no answer while
  the last /metrics read showed a request running is judged the same way;
- after watchdog_failures consecutive failures, the unit is restarted once (unless it started
  again since the run read its state: that start has its own warm-up), the journal gets one
  line naming the failures, and the state file's restart count goes up.

A frozen process (SIGSTOP) answers nothing: every probe times out, and a timeout is a failure.
The API key is read from its file here and sent in a header, never on a command line.

When the fleet is monitored (issue 31), the settings name a ``textfile``: each run writes
there, for the node exporter's textfile collector, the restarts and the counted failed probes
of the unit as two counters (``textfile_text``: gpubox_watchdog_restarts_total and
gpubox_watchdog_probe_failures_total, as gpubox.knowledge.metrics defines them), from 0 and
only growing (kept in the state file), and the runs in a row whose probes passed as a gauge
(gpubox_watchdog_probes_passing: 0 after any run that was not a pass, a warm-up included, so
that the alert BackendHung holds through a restarted server's load and clears after a few
passing probes), written whole to a temporary name and renamed."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

# What moves while a backend works, and the gauge that says a request is running.
# llama.cpp (tools/server: server_metrics::on_decoded): n_decode_total counts every
# llama_decode, one per batch of a prompt being processed as well as per generated token.
# vLLM (vllm/v1/metrics/loggers.py, PrometheusStatLogger.record): the token counters move only
# when a prefill ends and per generated token (vllm/v1/metrics/stats.py,
# IterationStats.update_from_output); kv_cache_usage_perc is set from the scheduler's stats,
# which it returns at every engine step, request output or not (vllm/v1/core/sched/
# scheduler.py, Scheduler.update_from_output), and a chunked prefill takes KV blocks per chunk.
PROGRESS = {
    "llamacpp": (
        "llamacpp:n_decode_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:prompt_tokens_total",
    ),
    "vllm": (
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:kv_cache_usage_perc",
    ),
}
BUSY = {"llamacpp": "llamacpp:requests_processing", "vllm": "vllm:num_requests_running"}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: each sample's value, summed over its labels, by metric name."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if not match or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        found[match.group(1)] = found.get(match.group(1), 0.0) + value
    return found


def progress_of(backend: str, metrics: dict[str, float]) -> tuple[list[float] | None, bool]:
    """The backend's work counters (None when /metrics carries none of them) and whether a
    request is being processed now."""
    counters = [metrics[name] for name in PROGRESS.get(backend, ()) if name in metrics]
    busy = metrics.get(BUSY.get(backend, ""), 0.0) > 0
    return (counters or None), busy


def completion_due(state: dict[str, Any], settings: dict[str, Any], now: float) -> bool:
    """A one-token completion at this run: every completion_every_s, and at every run while
    failures are counted (so a hang that only completions show is confirmed quickly)."""
    if state.get("failures", 0) > 0:
        return True
    last = state.get("last_completion")
    # a clock behind the last completion: the box rebooted (CLOCK_MONOTONIC starts again)
    return last is None or now < last or now - last >= settings["completion_every_s"]


def failure_text(reading: dict[str, Any]) -> str:
    """What failed in a reading, in words."""
    parts = []
    if reading.get("health") != 200:
        parts.append(f"/health {reading.get('health_error') or reading.get('health')}")
    if reading.get("completion") not in (None, 200):
        parts.append(
            "a one-token completion "
            + str(reading.get("completion_error") or reading.get("completion"))
        )
    return "; ".join(parts)


def track(new: dict[str, Any], reading: dict[str, Any], now: float) -> bool:
    """Keep what /metrics said in the state: the work counters, whether a request runs, and
    since when a running request has moved nothing (``still_since``). True when the counters
    moved since the last reading of them. A run without a reading of /metrics (no answer)
    keeps what was last seen; while that was a request running, its stillness starts now."""
    busy = reading.get("busy")
    if busy is None:
        if new.get("busy") and new.get("still_since") is None:
            new["still_since"] = now
        return False
    previous, progress = new.get("progress"), reading.get("progress")
    moved = progress is not None and previous is not None and progress != previous
    if progress is not None:
        new["progress"] = progress
    new["busy"] = bool(busy)
    if busy and not moved and reading.get("completion") != 200:
        new["still_since"] = now if new.get("still_since") is None else new["still_since"]
    else:
        new["still_since"] = None
    return moved


def busy_text(
    new: dict[str, Any], moved: bool, settings: dict[str, Any], now: float
) -> tuple[str, bool]:
    """Why a failed run is not counted because a request is running ("" when it counts), and
    whether the busy limit has passed."""
    unit = settings["unit"]
    if not new.get("busy"):
        return "", False
    if moved:
        return f"{unit} is busy and its token counters advance; not counted: ", False
    still = now - (new.get("still_since") or now)
    if still < settings.get("busy_limit_s", 0):
        return (
            f"{unit} has a request running and nothing moved for {still:.0f}s (the limit is "
            f"{settings['busy_limit_s']}s); not counted: "
        ), False
    return "", True


def decide(
    state: dict[str, Any],
    reading: dict[str, Any],
    settings: dict[str, Any],
    now: float,
    wall: str = "",
) -> tuple[dict[str, Any], str, str]:
    """The run's verdict: (the new state, the action, the journal's line or "").

    ``reading``: active (the unit is active), start_us (its ActiveEnterTimestampMonotonic),
    health (/health's status, 0 for no answer) and health_error, completion (None when not
    sent, 0 for no answer) and completion_error, progress (the work counters or None), busy
    (a request running; None when /metrics gave no answer). ``now``: CLOCK_MONOTONIC seconds
    (the clock of start_us); ``wall``: the time, for the record. The action is one of
    inactive, ok, warmup, busy, failure, restart."""
    unit, limit = settings["unit"], settings["failures"]
    new = dict(state)
    new.setdefault("restarts", 0)
    new.setdefault("failures", 0)
    if reading.get("completion") is not None:
        new["last_completion"] = now
    if not reading.get("active"):
        new.update(failures=0, reasons=[], progress=None, busy=False, still_since=None)
        return new, "inactive", ""
    if new.get("start_us") != reading.get("start_us"):
        # a new start of the unit (by anyone): its warm-up begins, nothing is counted yet
        new.update(start_us=reading.get("start_us"), healthy=False, failures=0, reasons=[])
        new.update(progress=None, busy=False, still_since=None)
    moved = track(new, reading, now)
    if reading.get("health") == 200 and reading.get("completion") in (None, 200):
        first = not new.get("healthy")
        counted = new["failures"]
        new.update(healthy=True, failures=0, reasons=[])
        if first:
            return new, "ok", f"{unit} answers healthy since its start"
        if counted:
            return new, "ok", f"{unit} answers again after {counted} failed probe(s)"
        return new, "ok", ""
    why = failure_text(reading)
    age = now - (reading.get("start_us") or 0) / 1e6
    if not new.get("healthy"):
        if age < settings["grace_s"]:
            return new, "warmup", ""
        why += f" (not healthy {age:.0f}s after its start; grace {settings['grace_s']}s)"
    excuse, past = busy_text(new, moved, settings, now)
    if excuse:
        return new, "busy", excuse + why
    if past:
        why += f" (a request running, nothing moved for {settings['busy_limit_s']}s or more)"
    new["failures"] += 1
    new["reasons"] = [*new.get("reasons", []), why]
    if new["failures"] < limit:
        return new, "failure", f"{unit}: failed probe {new['failures']} of {limit}: {why}"
    reasons = new["reasons"]
    new.update(
        failures=0,
        reasons=[],
        restarts=new["restarts"] + 1,
        last_restart=wall,
        last_reason=f"{limit} consecutive failed probes ({reasons[-1]})",
        healthy=False,
    )
    line = (
        f"restarting {unit} (watchdog restart {new['restarts']}): {limit} consecutive failed "
        f"probes every {settings['interval_s']}s: " + " | ".join(reasons)
    )
    return new, "restart", line


# The textfile's counters, as gpubox.knowledge.metrics defines them (a test keeps the two
# equal): (name, help). A counted failure is a run whose probes failed and counted against the
# server (the actions below): not a warm-up's nor a busy server's.
COUNTERS = (
    ("gpubox_watchdog_restarts_total", "Restarts of the API server's unit by gpubox's watchdog."),
    (
        "gpubox_watchdog_probe_failures_total",
        "Watchdog runs whose probes of the API (/health, a one-token completion) failed.",
    ),
)
COUNTED = ("failure", "restart")
# The textfile's gauge: (name, help). A pass is a run whose probes answered ("ok"); any other
# run (a failure, a restart, a warm-up, a busy server, the unit stopped) sets it back to 0.
GAUGES = (
    (
        "gpubox_watchdog_probes_passing",
        "Watchdog runs in a row whose probes of the API passed (0 after a failed probe, a "
        "restart, a start's warm-up or the unit stopped).",
    ),
)


def count(new: dict[str, Any], action: str) -> dict[str, Any]:
    """The state with the run's counted failure added to ``probe_failures`` (only growing) and
    its pass counted in ``passing`` (the runs in a row that passed; 0 after any other)."""
    failures = int(new.get("probe_failures", 0)) + (1 if action in COUNTED else 0)
    passing = int(new.get("passing", 0)) + 1 if action == "ok" else 0
    return {**new, "probe_failures": failures, "passing": passing}


def textfile_text(state: dict[str, Any], unit: str) -> str:
    """The watchdog's textfile for ``unit``: its two counters, from 0, and its gauge."""
    label = unit.replace("\\", "\\\\").replace('"', '\\"')
    kinds = ("counter",) * len(COUNTERS) + ("gauge",) * len(GAUGES)
    values = [int(state.get(key, 0)) for key in ("restarts", "probe_failures", "passing")]
    lines = []
    for (name, text), kind, value in zip(COUNTERS + GAUGES, kinds, values, strict=True):
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines.append(f'{name}{{unit="{label}"}} {value}')
    return "".join(line + "\n" for line in lines)


def write_textfile(path: str, text: str) -> None:
    """``text`` into ``path`` whole: a temporary name beside it (not ``*.prom``, which the
    collector would read), then renamed; readable by the node exporter's user."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


# --- on the box


def _request(
    url: str, key: str, timeout: float, body: dict[str, Any] | None = None
) -> tuple[int, str, str]:
    """(status, body, error): status 0 and the error in words when nothing answered in time."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if data:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return answer.status, answer.read().decode("utf-8", "replace"), ""
    except urllib.error.HTTPError as exc:
        return exc.code, "", f"answered {exc.code}"
    except TimeoutError:
        return 0, "", f"no answer within {timeout:g}s"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return 0, "", f"no answer within {timeout:g}s"
        return 0, "", f"no answer ({reason})"


def unit_state(unit: str) -> dict[str, Any]:
    out = subprocess.run(
        ["systemctl", "show", "-p", "ActiveState,ActiveEnterTimestampMonotonic,MainPID", unit],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    start = props.get("ActiveEnterTimestampMonotonic", "0")
    return {
        "active": props.get("ActiveState") == "active",
        "start_us": int(start) if start.isdigit() else 0,
        "pid": props.get("MainPID", ""),
    }


def read(settings: dict[str, Any], state: dict[str, Any], now: float) -> dict[str, Any]:
    reading = unit_state(settings["unit"])
    if not reading["active"]:
        return reading
    try:
        with open(settings["key_file"], encoding="utf-8") as f:
            key = f.readline().strip()
    except OSError:
        key = ""
    base, timeout = settings["url"].rstrip("/"), settings["timeout_s"]
    status, _, error = _request(f"{base}/health", key, timeout)
    reading.update(health=status, health_error=error, completion=None, progress=None, busy=None)
    if status == 200 and completion_due(state, settings, now):
        body = {"model": settings["model"], "prompt": "1", "max_tokens": 1, "temperature": 0}
        code, _, error = _request(f"{base}/v1/completions", key, timeout, body)
        reading.update(completion=code, completion_error=error)
    # is it working (a long answer streaming, a long prompt)? Read even when /health gave no
    # answer: a probe can be slow while the engine is busy, and /metrics says whether it is
    code, text, _ = _request(f"{base}/metrics", key, timeout)
    if code == 200:
        progress, busy = progress_of(settings["backend"], parse_metrics(text))
        reading.update(progress=progress, busy=busy)
    return reading


def log(line: str, level: int = 6) -> None:
    """A line in the journal (the unit's SyslogIdentifier; systemd reads the <level> prefix)."""
    print(f"<{level}>{line}", flush=True)


def main(argv: list[str]) -> int:
    with open(argv[1] if len(argv) > 1 else "/etc/gpubox/watchdog.json", encoding="utf-8") as f:
        settings = json.load(f)
    path = settings["state_file"]
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {}
    now = time.monotonic()
    reading = read(settings, state, now)
    # datetime.UTC is Python 3.11's: the box's python3 may be older
    wall = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")  # noqa: UP017
    new, action, line = decide(state, reading, settings, now, wall)
    if action == "restart" and unit_state(settings["unit"])["start_us"] != reading["start_us"]:
        # started again (a deploy, its owner) while this run probed: that start has its own
        # warm-up, and the next run sees it as a new start
        new = {**state, "failures": 0, "reasons": [], "start_us": None}
        action, line = "warmup", f"{settings['unit']} started again during this run; not restarted"
    if action == "restart":
        log(line, 3)
        done = subprocess.run(
            ["systemctl", "restart", "--no-block", settings["unit"]],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            log(f"systemctl restart {settings['unit']} failed: {done.stderr.strip()}", 3)
    elif line:
        log(line, 4 if action in ("failure", "busy") else 5)
    new = count(new, action)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({**new, "last_run": wall, "last_action": action}, f)
    os.replace(tmp, path)
    if settings.get("textfile"):
        try:
            write_textfile(settings["textfile"], textfile_text(new, settings["unit"]))
        except OSError as exc:
            log(f"cannot write {settings['textfile']}: {exc}", 4)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
