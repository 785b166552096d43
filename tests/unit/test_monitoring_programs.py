"""The two standard-library programs the monitoring stage runs on a box (issue 31 A and C): the
metrics relay (gpubox.knowledge.metrics_relay: GET /metrics only, the API key read from its file
at each request and sent upstream, never shown; bounded answers) and the secrets' renderer
(gpubox.knowledge.render_secrets: alertmanager.yml written 0640 with the secrets' files' content,
only when it differs, never printing them). Servers bind 127.0.0.1 and serve a bounded number
of requests."""

from __future__ import annotations

import http.client
import os
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import yaml

from gpubox.knowledge import metrics_relay, render_secrets

METRICS = b"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n"


class Upstream(BaseHTTPRequestHandler):
    """llama-server's /metrics as the relay sees it: 401 without the key the test expects."""

    expected = ""
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        auth = self.headers.get("Authorization", "")
        Upstream.seen.append(auth)
        body = METRICS * (1000 if self.path == "/big" else 1)
        status = 200 if auth == f"Bearer {Upstream.expected}" else 401
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def serve(server: HTTPServer, requests: int) -> threading.Thread:
    server.timeout = 10

    def loop() -> None:
        for _ in range(requests):
            server.handle_request()
        server.server_close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def ask(port: int, method: str = "GET", path: str = "/metrics") -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(method, path)
    answer = connection.getresponse()
    body = answer.read()
    connection.close()
    return answer.status, body


def test_the_relay_serves_only_get_metrics_with_the_key_read_at_each_request(tmp_path: Path):
    key = tmp_path / "api-key"
    key.write_text("first-key\n")
    upstream = HTTPServer(("127.0.0.1", 0), Upstream)
    up_port = upstream.server_address[1]
    settings = {
        "upstream": f"http://127.0.0.1:{up_port}/metrics",
        "key_file": str(key),
        "timeout_s": 5,
        "max_bytes": 10_000,
    }
    relay = HTTPServer(("127.0.0.1", 0), metrics_relay.handler(settings))
    port = relay.server_address[1]
    Upstream.expected, Upstream.seen = "first-key", []
    up_thread, relay_thread = serve(upstream, 4), serve(relay, 7)

    assert ask(port) == (200, METRICS)
    key.write_text("rotated-key\n")  # a key changed on the box: the next request reads it
    Upstream.expected = "rotated-key"
    assert ask(port) == (200, METRICS)
    assert Upstream.seen == ["Bearer first-key", "Bearer rotated-key"]
    # nothing but GET /metrics; the API's own paths are not relayed
    assert ask(port, path="/v1/models")[0] == 404
    assert ask(port, method="POST")[0] == 405
    # the backend refusing the key is a 502 that never shows it
    Upstream.expected = "another"
    status, body = ask(port)
    assert status == 502 and b"401" in body and b"rotated" not in body
    # an answer over max_bytes is not passed on
    settings["upstream"] = f"http://127.0.0.1:{up_port}/big"
    Upstream.expected = "rotated-key"
    status, body = ask(port)
    assert status == 502 and b"over 10000 bytes" in body
    # no key file: 502 naming the file's problem, the upstream never asked
    key.unlink()
    status, body = ask(port)
    assert status == 502 and b"API key file" in body
    relay_thread.join(10)
    upstream.server_close()
    up_thread.join(1)


def test_the_renderer_writes_the_secrets_into_the_file_0640_and_only_when_it_differs(
    tmp_path: Path,
):
    webhook = tmp_path / "webhook-url"
    webhook.write_text("https://hooks.example.org/T/s3cr3t\n")
    template = tmp_path / "alertmanager.yml.in"
    template.write_text(
        "receivers:\n- name: gpubox\n  webhook_configs:\n"
        f"  - url: {render_secrets.PLACEHOLDER.format(path=webhook)}\n"
    )
    output = tmp_path / "alertmanager.yml"
    program = [sys.executable, render_secrets.__file__]
    unit = "gpubox-test-no-such-unit"  # no User=: root's group

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*program, *args, str(template), str(output), unit],
            capture_output=True,
            text=True,
            timeout=30,
        )

    assert run("--check").stdout == "differs\n" and not output.exists()
    wrote = run()
    assert wrote.returncode == 0, wrote.stderr
    assert "s3cr3t" not in wrote.stdout + wrote.stderr
    data = yaml.safe_load(output.read_text())
    assert data["receivers"][0]["webhook_configs"][0]["url"] == "https://hooks.example.org/T/s3cr3t"
    assert stat.S_IMODE(output.stat().st_mode) == 0o640 and output.stat().st_gid == 0
    assert run("--check").stdout == "same\n"
    again = run()
    assert again.returncode == 0 and again.stdout == ""  # unchanged: not written
    webhook.write_text("https://hooks.example.org/T/rotated\n")
    assert run("--check").stdout == "differs\n"
    assert run().returncode == 0 and "rotated" in output.read_text()
    os.chmod(output, 0o644)  # a mode changed by hand is put back
    assert run("--check").stdout == "differs\n"
    webhook.unlink()
    missing = run()
    assert missing.returncode == 1 and str(webhook) in missing.stderr


def test_the_monitor_checks_fact_reads_prometheus_json_without_a_line_end(tmp_path: Path):
    """The check's one command on the box, run by sh with curl and systemctl answering as the
    real ones do (Prometheus's API answers JSON with no line end): every section parses."""
    from helpers import REFERENCE

    from gpubox.checks import monitoring as checks_monitoring
    from gpubox.config import load_host_config

    config = load_host_config("b", {**REFERENCE, "monitoring": "prometheus", "dcgm_exporter": True})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    targets = (
        '{"status":"success","data":{"activeTargets":'
        '[{"labels":{"host":"b","job":"node"},"health":"up"}]}}'
    )
    rules = '{"status":"success","data":{"groups":[{"name":"g","rules":[{"name":"BoxDown"}]}]}}'
    (bin_dir / "curl").write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do url=$a; done\n'
        'case "$url" in\n'
        f"  *9100/metrics) printf 'node_load1 0\\ngpubox_gpus_expected 2\\n' ;;\n"
        f"  *targets*) printf '%s' '{targets}' ;;\n"
        f"  *rules*) printf '%s' '{rules}' ;;\n"
        "esac\n"
    )
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        "printf 'Id=prometheus.service\\nActiveState=active\\nUnitFileState=enabled\\n'\n"
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    command = checks_monitoring._monitor(config, None)
    assert command is not None
    ran = subprocess.run(
        ["/bin/sh", "-c", command],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    reading = checks_monitoring.parse_monitor(ran.stdout)
    assert reading["node"] == "gpubox_gpus_expected 2\n"
    assert reading["targets"]["data"]["activeTargets"][0]["health"] == "up"
    assert reading["rules"]["data"]["groups"][0]["rules"] == [{"name": "BoxDown"}]
    assert reading["units"]["prometheus"]["ActiveState"] == "active"
