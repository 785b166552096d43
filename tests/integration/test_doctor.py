"""gpubox doctor, gpubox bench and gpubox nvlink against the sandbox box after a deploy: a
converged box is OK; bench's defaults and every slot full at once complete every request;
backend.sane fails on a stand-in server that answers "!!!!"; `gpubox bench --smoke` measures
the served llama-server; llama-bench runs beside the served figures; each planted fault (a GPU
missing, an NVLink link down, persistence off) is named with its fix; nvlink labels the
stand-in's traffic; the watchdog restarts a llama-server frozen right after its start and
doctor shows it. The tests run in order on one box."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import box_sh, plant

from gpubox import bench as bench_records
from gpubox import checks
from gpubox.base import layout
from gpubox.commands import demo
from gpubox.config import load_host_config
from gpubox.plans import model as plan_model
from gpubox.remote import inventory
from gpubox.sandbox.standin import state as standin_state

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_box")]


def gpubox(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m gpubox.<module> ARGS` in the sandbox's network namespace (as the CLI's
    `gpubox doctor` / `gpubox nvlink` run them)."""
    argv = demo.in_netns([sys.executable, "-m", f"gpubox.{module}", *args])
    return subprocess.run(argv, cwd=demo.ROOT, text=True, capture_output=True, timeout=600)


def doctor_json() -> tuple[int, dict]:
    proc = gpubox("doctor", demo.INVENTORY, "--json")
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    [report] = json.loads(proc.stdout)["hosts"]
    return proc.returncode, report


def messages(report: dict) -> list[str]:
    return [f"{f['message']} -> {f['fix']}" for f in report["findings"]]


def failing_ids(report: dict) -> set[str]:
    return {f["check"] for f in report["findings"]}


def test_a_deployed_box_is_ok():
    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    before = box_sh("dpkg -l | sha256sum; systemctl list-units --state=active | sha256sum")
    rc, report = doctor_json()
    assert rc == 0 and report["ok"], messages(report)
    assert len(report["gpus"]["gpus"]) == 2 and report["dcgm"]["gpus"] == 2
    assert report["backend"]["health"] == 200
    text = gpubox("doctor", demo.INVENTORY)
    assert text.returncode == 0 and "OK: no deviation from the inventory" in text.stdout
    assert box_sh("dpkg -l | sha256sum; systemctl list-units --state=active | sha256sum") == (
        before
    )


def bench(tmp_path, name: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`gpubox bench` against the box's llama-server; its process and its --json report."""
    key = tmp_path / "api-key"
    key.write_text(box_sh("cat /etc/gpubox/api-key"))
    out = tmp_path / f"{name}.json"
    proc = gpubox(
        "bench",
        "http://127.0.0.1:8080",
        "--model",
        "qwen3-next",
        "--api-key-file",
        str(key),
        "--json",
        str(out),
        *args,
    )
    print(f"\n[{name}]\n{proc.stdout}{proc.stderr[-2000:]}")
    report = json.loads(out.read_text()) if out.exists() else {}
    return proc, report


def levels(report: dict) -> list[dict]:
    [result] = report["results"].values()
    return result["levels"]


def test_bench_with_its_defaults_completes_every_request_at_every_level(tmp_path):
    """gpubox bench's defaults (256-word prompts, 256 tokens out, concurrency 1, 2 and 4) on
    the sandbox's two slots of 2048 tokens: concurrency 4 waits for a slot, nothing fails
    (with one shared pool of 2048 tokens, as llama-server ran before, 2 and 4 failed every
    request with "Context size has been exceeded")."""
    proc, report = bench(tmp_path, "defaults")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "TTFT" in proc.stdout
    found = {lv["max_concurrency"]: (lv["completed"], lv["failed"]) for lv in levels(report)}
    assert found == {1: (8, 0), 2: (8, 0), 4: (16, 0)}


def test_every_slot_holds_its_whole_context_at_the_same_time(tmp_path):
    """model_parallel requests that each fill most of one slot's model_ctx run side by side,
    and twice as many wait their turn: every one completes, every answer full length."""
    config = _config()
    ctx, slots = config.model_ctx, config.model_parallel
    # how many tokens a word of the bench's prompts costs on this model (chat template too)
    probe, report = bench(
        tmp_path, "probe", "--concurrency", "1", "--requests", "1", "--warmup", "0",
        "--prompt-tokens", "200", "--max-tokens", "1",
    )  # fmt: skip
    assert probe.returncode == 0
    per_word = levels(report)[0]["total_input_tokens"] / 200
    out = 256
    words = int((ctx - out - 64) / per_word)
    proc, report = bench(
        tmp_path, "full-slots", "--concurrency", f"{slots},{2 * slots}",
        "--requests", str(2 * slots), "--warmup", "0",
        "--prompt-tokens", str(words), "--max-tokens", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for level in levels(report):
        n = level["completed"]
        assert (n, level["failed"]) == (2 * slots, 0), level["errors"]
        prompt = level["total_input_tokens"] / n
        print(
            f"concurrency {level['max_concurrency']}: {n} requests of {prompt:.0f} prompt "
            f"tokens + {out} out, in slots of {ctx}"
        )
        # each request filled most of its slot: together they were more than one slot holds
        assert ctx * 0.8 <= prompt + out <= ctx
        assert level["total_output_tokens"] == n * out


# backend.sane (issue 19): the tiny model's answers pass it (every host-check and doctor run of
# this module), and a server that answers "!!!!" (vLLM #10656's garbage, in llama-server's
# answer shape) fails it. The stand-in takes llama-server's port while the unit is stopped; it
# answers at most STANDIN_REQUESTS requests within STANDIN_SECONDS, then exits by itself.
STANDIN_SECONDS = 90
STANDIN_REQUESTS = 200
STANDIN_PATH = "/root/gpubox-garbage-api.py"
STANDIN = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

port, alias, seconds, requests = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
ANSWER = "!!!!"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, code, body, kind="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.send(200, json.dumps({"status": "ok"}))
        elif self.path == "/v1/models":
            model = {"id": alias, "object": "model", "owned_by": "llamacpp"}
            self.send(200, json.dumps({"object": "list", "data": [model]}))
        else:
            self.send(404, json.dumps({"error": {"code": 404, "message": "File Not Found"}}))

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if request.get("stream"):
            events = [
                {"choices": [{"finish_reason": None, "index": 0, "delta": {"content": ANSWER}}]},
                {"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}]},
            ]
            body = "".join("data: " + json.dumps(e) + "\\n\\n" for e in events)
            self.send(200, body + "data: [DONE]\\n\\n", "text/event-stream")
            return
        message = {"role": "assistant", "content": ANSWER}
        choice = {"finish_reason": "stop", "index": 0, "message": message}
        self.send(200, json.dumps({"choices": [choice], "object": "chat.completion"}))


server = HTTPServer(("127.0.0.1", port), Handler)
server.timeout = 1
end = time.monotonic() + seconds
for _ in range(requests):
    if time.monotonic() > end:
        break
    server.handle_request()
"""


def _health_loop(url: str, seconds: int = 120) -> str:
    return f"for i in $(seq {seconds}); do curl -sf -o /dev/null {url} && break; sleep 1; done"


def test_backend_sane_passes_the_tiny_model_and_fails_a_garbage_answer():
    config = _config()
    unit, health = layout.LLAMA_SERVER, f"http://127.0.0.1:{config.api_port}/health"
    # what the check adds to every deploy's quick checks: its two requests, on the tiny model
    took = []
    start = time.monotonic()
    box_sh("true")
    ssh = time.monotonic() - start
    for name in ("sane_short", "sane_long"):
        command = checks.FACTS[name].command_for(config, None)
        start = time.monotonic()
        status, _, body = box_sh(command).partition("\n")
        took.append(time.monotonic() - start)
        assert status == "200", name
        print(f"\n{name}: {body[:700]}")
    print(
        f"backend.sane's requests on the tiny model: {took[0]:.2f} s and {took[1]:.2f} s "
        f"(one SSH command alone: {ssh:.2f} s)"
    )
    box_sh(f"cat > {STANDIN_PATH}", stdin=STANDIN)
    box_sh(f"systemctl stop {unit}")
    pid = ""
    try:
        args = f"{config.api_port} {config.model_alias} {STANDIN_SECONDS} {STANDIN_REQUESTS}"
        pid = box_sh(
            f"setsid python3 {STANDIN_PATH} {args} </dev/null >/dev/null 2>&1 & echo $!"
        ).strip()
        box_sh(_health_loop(health, 20))
        host = demo.checks(extra=("-m", "quick", "-k", "backend.sane or backend.chat"))
    finally:
        if pid.isdigit():
            box_sh(f"kill {pid} 2>/dev/null; true")
        box_sh(f"rm -f {STANDIN_PATH}; systemctl start {unit}; {_health_loop(health)}")
    assert set(host.failures) == {"backend.sane"}, host.output[-3000:]  # the shape is right
    found = host.failures["backend.sane"]
    assert "the answer to the short prompt content is one character repeated ('!' 4 of 4" in found
    assert "the answer to the long prompt" in found
    assert box_sh(f"curl -s -o /dev/null -w '%{{http_code}}' {health}") == "200"


def test_the_smoke_test_measures_the_served_llama_server():
    proc = gpubox("bench", "--smoke", demo.INVENTORY)
    print("\n" + proc.stdout + proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "smoke test of gpubox-sandbox (llamacpp):" in proc.stdout
    [row] = [ln for ln in proc.stdout.splitlines() if ln.startswith("  served ")]
    assert row.split()[3] == "text"
    assert "keep: served (the deployed configuration; nothing to set)" in proc.stdout


# gpubox bench --llama-bench against the same box, for real: the deploy built llama-bench
# beside llama-server (a CPU build), and `gpubox bench --inventory inventories/sandbox.py
# --llama-bench` runs it over SSH on the tiny model, with gpubox-llama-server stopped for the
# run and healthy again after it; --split-modes reports the mode llama.cpp refuses on a CPU
# build (tensor) as failed with llama.cpp's reason, and names the mode to set.

HOST = "gpubox-sandbox"
UNIT = "gpubox-llama-server"


def llama_bench(
    tmp_path: Path, *args: str, key_file: bool = True
) -> subprocess.CompletedProcess[str]:
    """`gpubox bench --inventory inventories/sandbox.py ARGS` in the sandbox's network namespace,
    a short served bench (1 stream, 4 requests). Its records go where a user's would (the
    sandbox reads GPUBOX_STATE_DIR too, so it is left alone). ``key_file``: the API key copied
    to a local file and given with --api-key-file; without it the bench reads it from the box
    over the inventory's SSH connection."""
    given = []
    if key_file:
        key = tmp_path / "api-key"
        key.write_text(box_sh("cat /etc/gpubox/api-key"))
        given = ["--api-key-file", str(key)]
    argv = demo.in_netns(
        [
            sys.executable, "-m", "gpubox.bench", "--inventory", demo.INVENTORY,
            *given, "--concurrency", "1", "--requests", "4",
            "--prompt-tokens", "64", "--max-tokens", "32", *args,
        ]
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "GPUBOX_API_KEY"}
    proc = subprocess.run(
        argv, cwd=demo.ROOT, text=True, capture_output=True, timeout=1200, env=env
    )
    print("\n" + proc.stdout + proc.stderr[-3000:])
    return proc


def service_is_back() -> None:
    assert box_sh(f"systemctl is-active {UNIT}", check=False).strip() == "active"
    code = box_sh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/health")
    assert code == "200"
    assert box_sh("test -e /run/gpubox-llama-bench.pid || echo gone").strip() == "gone"


def test_the_deploy_built_llama_bench():
    assert box_sh("ls /opt/llama.cpp/*/bin/llama-bench").strip()
    service_is_back()


def test_llama_bench_beside_the_served_figures(tmp_path):
    out = tmp_path / "bench.json"
    pid_before = box_sh(f"systemctl show -p MainPID --value {UNIT}").strip()
    # as a user runs it: no key copied, the API on the box's loopback (api_host's default)
    proc = llama_bench(tmp_path, "--llama-bench", "--json", str(out), key_file=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"{HOST}: the API at 127.0.0.1:8080 on the box, through an SSH tunnel from " in (
        proc.stderr
    )
    assert box_sh("cat /etc/gpubox/api-key").strip() not in proc.stdout + proc.stderr
    assert f"{HOST}: stopping {UNIT} for llama-bench" in proc.stderr
    assert f"{HOST}: {UNIT} healthy again after" in proc.stderr
    service_is_back()
    # a new server process: it was stopped and started, not left running beside the bench
    assert box_sh(f"systemctl show -p MainPID --value {UNIT}").strip() != pid_before

    [mode] = json.loads(out.read_text())["llama_bench"][HOST]["modes"]
    assert mode["mode"] == "layer" and mode["ok"], mode
    pp512, tg128 = mode["tests"]["pp512"], mode["tests"]["tg128"]
    assert pp512["avg_ts"] > 0 and tg128["avg_ts"] > 0
    assert pp512["split_mode"] == tg128["split_mode"] == "layer"
    assert tg128["backends"] == "CPU" and tg128["n_gpu_layers"] == 999
    assert len(tg128["samples_ts"]) == 3
    for name, test in (("tg128", tg128), ("pp512", pp512)):
        print(f"\n[llama-bench] tiny model {name} {test['avg_ts']:.1f} ± {test['stddev_ts']:.1f}")

    # one table: llama-bench's rows beside the served ones
    table = proc.stdout[proc.stdout.index(f"{HOST}: llama-bench") :].splitlines()
    assert table[1].split()[:3] == ["tok/s", "-sm", "layer"] and "served," in table[1]
    assert table[2].split()[:2] == ["prompt", "(pp512)"] and len(table[2].split()) == 6
    assert table[3].split()[:3] == ["decode", "(tg128)", f"{tg128['avg_ts']:.1f}"]

    record = bench_records.load_record(HOST, "http://127.0.0.1:8080")
    assert record is not None and record["levels"][0]["completed"] == 4  # the served figures
    kept = record["llama_bench"]["modes"]["layer"]["tg128"]["avg_ts"]
    assert kept == pytest.approx(tg128["avg_ts"])


def test_split_modes_name_the_one_to_set(tmp_path):
    proc = llama_bench(tmp_path, "--split-modes", "layer,tensor")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # A CPU build has no device to split a tensor over: llama.cpp refuses the model.
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("  -sm tensor failed: ")]
    assert len(failed) == 1 and "exit status 1" in failed[0], proc.stdout
    assert "-sm layer failed" not in proc.stdout
    [advice] = [ln for ln in proc.stdout.splitlines() if ln.startswith('set "llamacpp_split_mode"')]
    assert advice.startswith('set "llamacpp_split_mode": "layer" (tg128 ')
    assert advice.endswith(" tok/s vs tensor failed) (already set)")
    service_is_back()


def test_a_missing_gpu_is_named():
    plant(lambda s: standin_state.set_gpu_present(s, 1, False))
    try:
        rc, report = doctor_json()
        assert rc == 1
        [found] = [m for m in messages(report) if "nvidia-smi lists 1 GPU(s)" in m]
        assert (
            "nvidia-smi lists 1 GPU(s), expected 2 Tesla V100-SXM2-32GB; lspci shows 1 NVIDIA "
            "3D controller(s)"
        ) in found and found.endswith("-> check the card/power/PCIe; lspci -d 10de:")
        assert {"gpu.listed", "nvlink.links", "nvlink.topology"} <= failing_ids(report)
    finally:
        plant(lambda s: standin_state.set_gpu_present(s, 1, True))


def test_a_link_down_is_named():
    plant(lambda s: standin_state.set_link_active(s, 0, 2, False))
    try:
        rc, report = doctor_json()
        assert rc == 1
        assert failing_ids(report) == {"nvlink.links"}
        [found] = messages(report)
        assert "GPU 0: 1 NVLink link(s) active, expected 2" in found
        assert "GPU 1: 1 NVLink link(s) active, expected 2" in found
    finally:
        plant(lambda s: standin_state.set_link_active(s, 0, 2, True))


def test_persistence_off_is_named():
    plant(lambda s: standin_state.set_persistence_forced_off(s, True))
    try:
        proc = gpubox("doctor", demo.INVENTORY)
        assert proc.returncode == 1
        assert "[gpu.persistence] gpubox-sandbox: persistence mode is not Enabled on GPU 0" in (
            proc.stdout
        )
        assert "-> sudo systemctl restart nvidia-persistenced" in proc.stdout
    finally:
        plant(lambda s: standin_state.set_persistence_forced_off(s, False))
    rc, report = doctor_json()
    assert rc == 0, messages(report)


def test_nvlink_labels_the_traffic():
    def traffic(s: dict) -> None:
        standin_state.set_gpu_nvlink_traffic(s, 0, 25_000_000_000, 24_500_000_000)
        standin_state.set_gpu_nvlink_traffic(s, 1, 24_500_000_000, 25_000_000_000)

    plant(traffic)
    try:
        proc = gpubox("commands.nvlink", demo.INVENTORY, "--count", "3", "--interval", "0.2")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "NVLink traffic on gpubox-sandbox, sample 3" in proc.stdout
        assert "warming up" in proc.stdout  # the first samples of the profiling fields
        last = proc.stdout.split("sample 3")[1]
        assert "GPU 0  25.0 GB/s  24.5 GB/s  49.5 GB/s" in last
        assert "all    49.5 GB/s  49.5 GB/s  99.0 GB/s" in last
    finally:
        plant(lambda s: [standin_state.set_gpu_nvlink_traffic(s, i, 0, 0) for i in (0, 1)])


# The watchdog (docs/watchdog.md) with short times: a probe every 5 s, a restart after 3
# failures, 10 s for a start to answer healthy, each answer waited for 2 s, a completion at
# every probe. The "converged" deploy of
# the agreement tests below puts the defaults back.
WATCHDOG_SHORT = {
    "watchdog_interval_s": 5,
    "watchdog_failures": 3,
    "watchdog_grace_s": 10,
    "watchdog_timeout_s": 2,
    "watchdog_completion_every_s": 0,
}


def watchdog_state() -> dict:
    text = box_sh(f"cat {layout.WATCHDOG_STATE} 2>/dev/null; true").strip()
    return json.loads(text) if text else {}


def wait_for(what: str, condition, limit: float, step: float = 1.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"{what}: not within {limit:.0f}s")


def test_the_watchdog_restarts_a_llama_server_frozen_right_after_its_start():
    """Issue 29 C7: a start the watchdog never saw healthy has watchdog_grace_s to answer.
    As a deploy does, the server is restarted and its /health awaited (ops/serving.py), then
    frozen before the watchdog's next run: restarted once the grace has passed (before the
    fix: never, the watchdog waited for a healthy probe of its own)."""
    began = time.monotonic()
    extra = tuple(a for k, v in WATCHDOG_SHORT.items() for a in ("--data", f"{k}={v}"))
    short = demo.deploy("deploy/watchdog.py", extra=extra)
    assert short.rc == 0 and not short.failed_hosts, short.output[-3000:]
    assert short.changed >= 1, short.changed_names  # the settings and the timer
    unit = layout.LLAMA_SERVER
    before = watchdog_state().get("restarts", 0)
    since = box_sh("date '+%Y-%m-%d %H:%M:%S'").strip()
    health = "curl -s -o /dev/null -w '%{http_code}' --max-time 2 http://127.0.0.1:8080/health"
    # The timer is held only while the server restarts, answers and is frozen, so that no run
    # of the watchdog falls in between (one that did would make this the case of a server
    # frozen after a healthy probe, which the unit tests cover); it starts again at once.
    out = box_sh(
        f"systemctl stop {layout.WATCHDOG_TIMER} {layout.WATCHDOG}.service; "
        f"systemctl restart {unit}; code=; "
        f'for i in $(seq 150); do code=$({health}); [ "$code" = 200 ] && break; sleep 0.2; '
        f"done; pid=$(systemctl show -p MainPID --value {unit}); kill -STOP $pid; "
        f"systemctl start {layout.WATCHDOG_TIMER}; echo $code $pid"
    )
    frozen = time.monotonic()
    code, pid_text = out.split()
    pid = int(pid_text)
    try:
        assert code == "200", out
        # the grace (10 s from the start), then three probes 5 s apart, each waiting 2 s for
        # /health and 2 s for /metrics: about 40 s
        limit = WATCHDOG_SHORT["watchdog_grace_s"] + 3 * (5 + 2 * 2) + 15
        new_pid = wait_for(
            "the watchdog's restart (a new MainPID)",
            lambda: (
                (p := int(box_sh(f"systemctl show -p MainPID --value {unit}").strip() or 0))
                not in (0, pid)
                and p
            ),
            limit,
        )
    finally:
        box_sh(f"kill -CONT {pid} 2>/dev/null; true")  # only if it is still there
    latency = time.monotonic() - frozen
    journal = box_sh(f"journalctl -t {layout.WATCHDOG} --since '{since}' --no-pager -o cat")
    print(f"\nwatchdog: restarted after {latency:.1f}s (pid {pid} -> {new_pid})\n{journal}")
    restart = f"restarting {unit} (watchdog restart {before + 1}): 3 consecutive failed probes"
    assert restart in journal
    # it never saw this start healthy: the failures counted because the grace had passed
    assert "answers healthy since its start" not in journal.split(restart)[0], journal
    assert "/health no answer within 2s (not healthy " in journal
    assert "after its start; grace 10s)" in journal
    assert f"{unit}: failed probe 1 of 3" in journal
    wait_for("/health after the restart", lambda: box_sh(f"{health}; true") == "200", 60)
    _, report = doctor_json()
    watchdog = report["watchdog"]
    assert watchdog["restarts"] == before + 1 and watchdog["active"] == "active", watchdog
    assert "3 consecutive failed probes" in watchdog["last_reason"]
    text = gpubox("doctor", demo.INVENTORY).stdout
    assert f"Watchdog  timer active/enabled, {before + 1} restart(s), last " in text, text
    print(f"watchdog test: {time.monotonic() - began:.1f}s in all")


# Agreement (issue 10): doctor and the host checks judge with the same checks, so for each fault
# planted on the converged box both name the same failing checks, and on the converged box both
# are green. The host checks run the quick ones; doctor's failures must all be among those.


def _config():
    ((name, data),) = inventory.load(str(demo.ROOT / demo.INVENTORY))
    return load_host_config(name, data)


def _faults() -> list[tuple[str, str, str, set[str]]]:
    """(name, plant, restore, checks that must fail): shell commands run in the box."""
    config = _config()
    held = config.driver_packages("debian").installed[0]
    prefix = config.cuda["prefix"]
    model = plan_model.plan(config).path
    unit = layout.LLAMA_SERVER
    health = f"http://127.0.0.1:{config.api_port}/health"
    drop_runtime = (
        "import json; p = '/etc/docker/daemon.json'; d = json.load(open(p)); "
        "d.pop('runtimes', None); json.dump(d, open(p, 'w'))"
    )
    return [
        ("converged", "true", "true", set()),
        ("package-unheld", f"apt-mark unhold {held}", f"apt-mark hold {held}", {"driver.held"}),
        (
            "pin-removed",
            f"mv {layout.DRIVER_PIN} /root/gpubox-pin.bak",
            f"mv /root/gpubox-pin.bak {layout.DRIVER_PIN}",
            {"driver.pins"},
        ),
        (
            "service-stopped",
            f"systemctl stop {unit}",
            f"systemctl start {unit}; for i in $(seq 120); do "
            f"curl -sf -o /dev/null {health} && break; sleep 1; done",
            {"backend.service", "backend.health"},
        ),
        (
            "cuda-repointed",
            f"ln -sfn /usr/lib {layout.USR_LOCAL_CUDA}",
            f"ln -sfn {prefix} {layout.USR_LOCAL_CUDA}",
            {"cuda.link"},
        ),
        (
            "runtime-removed",
            f'cp -p {layout.DAEMON_JSON} /root/daemon.json.bak && python3 -c "{drop_runtime}"',
            f"mv /root/daemon.json.bak {layout.DAEMON_JSON}",
            {"docker.daemon-json"},
        ),
        (
            "model-truncated",
            # a truncated copy in its place (the server keeps the whole file it has open)
            f"mv {model} {model}.whole && head -c 4096 {model}.whole > {model}",
            f"mv {model}.whole {model}",
            {"model.verified"},
        ),
        ("converged-again", "true", "true", set()),
    ]


FAULT_NAMES = [
    "converged",
    "package-unheld",
    "pin-removed",
    "service-stopped",
    "cuda-repointed",
    "runtime-removed",
    "model-truncated",
    "converged-again",
]


@pytest.mark.parametrize("fault", FAULT_NAMES)
def test_doctor_and_the_host_checks_name_the_same_failing_checks(fault):
    if fault == "converged":
        run = demo.deploy()
        assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    name, plant_it, restore, expected = next(f for f in _faults() if f[0] == fault)
    box_sh(plant_it)
    try:
        _, report = doctor_json()
        doctor_failed, doctor_judged = failing_ids(report), set(report["checks"])
        host = demo.checks(extra=("-m", "quick"))
        host_failed = set(host.failures)
    finally:
        box_sh(restore)
    quick = {c.id for c in checks.select(["quick"])}
    print(f"{name}: doctor {sorted(doctor_failed)}; host checks {sorted(host_failed)}")
    assert expected <= doctor_failed, messages(report)
    assert expected <= host_failed, host.output[-3000:]
    assert doctor_failed <= quick, doctor_failed - quick
    assert host_failed & doctor_judged == doctor_failed, (host_failed, doctor_failed)
    if not expected:
        assert not doctor_failed and not host_failed and host.passed > 0
