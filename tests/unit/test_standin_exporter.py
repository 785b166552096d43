"""The sandbox's stand-in dcgm-exporter (sandbox/packages/dcgm-exporter), run here as its image
runs it: the product's exporter_label.py beside it, the stand-in nv-hostengine listening on
loopback with a stand-in state file (or none). Its labels are the pinned rule's, the product's
check reads them as it reads the real exporter's, and its values follow the box's state at
each scrape (issue 31 E): a GPU fallen off the bus drops its series, a link down fails DCGM's
NVLink health watch, a planted XID or ECC error shows, and -f serves only the counters listed."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubox.checks import dcgm as dcgm_checks
from gpubox.checks.core import Output, Reading, Recorded
from gpubox.config import load_host_config
from gpubox.knowledge import exporter_label
from gpubox.sandbox import repo_debs, standin
from gpubox.sandbox.standin import state as st

HERE = repo_debs.PACKAGES_DIR / "dcgm-exporter"
LIB = Path(exporter_label.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def engine(tmp_path: Path, state: dict | None = None) -> Iterator[int]:
    """The stand-in nv-hostengine on a free loopback port, reading ``state`` (the reference
    box's by default) from a state file under ``tmp_path``; yields its port."""
    state_file = tmp_path / "state.json"
    st.save_state(st.default_state() if state is None else state, state_file)
    script = tmp_path / "nv-hostengine"
    script.write_text(standin.dcgm_source(standin.NV_HOSTENGINE, "4.4.1"))
    port = free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        st.STATE_ENV: str(state_file),
        st.RUN_ENV: str(tmp_path / "run"),
    }
    proc = subprocess.Popen(
        [sys.executable, str(script), "-n", "-p", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None and "Started host engine" in proc.stdout.readline()
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# The image's python3 has only the standard library modules the check image copies
# (build-check-image's MODULES): no idna codec, which a str host name passed to
# socket.getaddrinfo needs. The exporter runs here without it, as there (a sitecustomize).
NO_IDNA = """\
import codecs, encodings
codecs.unregister(encodings.search_function)
find = encodings.search_function
codecs.register(lambda name: None if name.replace("-", "_") == "idna" else find(name))
encodings._cache.pop("idna", None)
"""


@contextlib.contextmanager
def exporter(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    site = Path(tempfile.mkdtemp(prefix="gpubox-no-idna-"))
    (site / "sitecustomize.py").write_text(NO_IDNA)
    environ = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(site),
        "GPUBOX_EXPORTER_LIB": str(LIB),
        **(env or {}),
    }
    argv = [sys.executable, str(HERE / "dcgm-exporter"), *args]
    proc = subprocess.Popen(argv, env=environ, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def stderr(proc: subprocess.Popen[str]) -> str:
    return proc.stderr.read() if proc.stderr else ""


def metrics(port: int, proc: subprocess.Popen[str]) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    for _ in range(100):
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.read().decode()
        except OSError:
            assert proc.poll() is None, stderr(proc)
            time.sleep(0.05)
    raise AssertionError(f"{url} never answered")


@pytest.mark.parametrize(
    ("engine_host", "label"), [("localhost", "localhost"), ("127.0.0.1", "127.0.0.1")]
)
def test_the_label_is_the_host_part_of_the_engines_address(
    tmp_path: Path, engine_host: str, label: str
):
    listen = free_port()
    with engine(tmp_path) as port, exporter(
        "--address", f"127.0.0.1:{listen}", "--remote-hostengine-info", f"{engine_host}:{port}",
        env={"NODE_NAME": "ignored-in-remote-mode"},
    ) as proc:  # fmt: skip
        text = metrics(listen, proc)
    labels = exporter_label.hostname_labels(text)
    assert len(labels) == len(samples(text)) and set(labels) == {label}
    assert 'modelName="Tesla V100-SXM2-32GB"' in text
    # the product's checks read it as they read the real exporter's
    config = load_host_config("box", {"dcgm_exporter": True})
    assert dcgm_checks.exporter(config, reading(text, "box")) == []
    problem = dcgm_checks.exporter_hostname(config, reading(text, "box"))
    assert problem is not None and f'Hostname="{label}"' in problem
    assert dcgm_checks.exporter_hostname(config, reading(text, label)) is None


def test_without_an_engine_it_exits_naming_the_address():
    with exporter("--address", f"127.0.0.1:{free_port()}", "-r", f"127.0.0.1:{free_port()}") as p:
        assert p.wait(timeout=20) == 1
        assert "error connecting to nv-hostengine at 127.0.0.1:" in stderr(p)


def test_an_unknown_flag_is_refused_as_the_real_cli_refuses_it():
    with exporter("--bogus", "1") as proc:
        assert proc.wait(timeout=20) == 1
        assert "flag provided but not defined: -bogus" in stderr(proc)


def reading(metrics_text: str, hostname: str) -> Reading:
    outputs = {
        "exporter_metrics": Output(0, metrics_text, "", "curl"),
        "hostname": Output(0, hostname + "\n", "", "hostname"),
    }
    config = load_host_config("box", {"dcgm_exporter": True})
    return Reading(config, Recorded(outputs, None))


# --- values from the box's state, through the host engine (issue 31 E)

SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)$")


def samples(text: str) -> list[tuple[str, dict[str, str], str]]:
    """(name, labels, value) of every sample of an exposition."""
    found = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            labels = dict(re.findall(r'([A-Za-z_]+)="((?:[^"\\]|\\.)*)"', match.group(2)))
            found.append((match.group(1), labels, match.group(3)))
    return found


def scrape(tmp_path: Path, state: dict | None = None, *args: str) -> str:
    listen = free_port()
    with engine(tmp_path, state) as port, exporter(
        "-a", f"127.0.0.1:{listen}", "-r", f"localhost:{port}", *args
    ) as proc:  # fmt: skip
        return metrics(listen, proc)


def values(text: str, name: str) -> dict[str, str]:
    """GPU id -> value of metric ``name``."""
    return {labels["gpu"]: value for n, labels, value in samples(text) if n == name}


COUNTERS = """\
# a counters file as gpubox's (issue 31 A): name, type, help
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).
DCGM_FI_DEV_FB_USED, gauge, Frame buffer memory used (in MB).
DCGM_FI_DEV_FB_FREE, gauge, Frame buffer memory free (in MB).
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.
DCGM_FI_DEV_RETIRED_PENDING, counter, Total number of pages pending retirement.
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, counter, Total number of NVLink data CRC errors.
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, counter, Total number of NVLink recovery errors.
DCGM_FI_DRIVER_VERSION, label, Driver Version
DCGM_EXP_GPU_HEALTH_STATUS, gauge, GPU health status.
"""


def counters_file(tmp_path: Path, text: str = COUNTERS) -> str:
    path = tmp_path / "counters.csv"
    path.write_text(text)
    return str(path)


def test_the_values_are_the_boxs_state_and_the_counters_those_of_the_file(tmp_path: Path):
    state = st.default_state()
    state["gpus"][0]["memory_used_mib"] = 1000
    text = scrape(tmp_path, state, "-f", counters_file(tmp_path))
    names = {name for name, _, _ in samples(text)}
    assert names == {
        line.split(",")[0]
        for line in COUNTERS.splitlines()
        if line and not line.startswith("#") and "label" not in line
    }
    gpus = st.default_state()["gpus"]
    assert values(text, "DCGM_FI_DEV_GPU_TEMP") == {
        "0": str(gpus[0]["temperature_c"]),
        "1": str(gpus[1]["temperature_c"]),
    }
    assert values(text, "DCGM_FI_DEV_POWER_USAGE")["0"] == f"{gpus[0]['power_draw_w']:f}"
    assert values(text, "DCGM_FI_DEV_FB_USED") == {"0": "1000", "1": "0"}
    assert values(text, "DCGM_FI_DEV_FB_FREE") == {"0": str(32768 - 1000), "1": "32768"}
    uuids = {labels["UUID"] for _, labels, _ in samples(text)}
    assert uuids == {g["uuid"] for g in gpus}
    assert "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C)." in text
    assert "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter" in text
    health = [(lab["gpu"], lab["health_watch"], v) for n, lab, v in samples(text)
              if n == "DCGM_EXP_GPU_HEALTH_STATUS"]  # fmt: skip
    assert len(health) == 20 and {v for _, _, v in health} == {"0"}


def test_a_gpu_off_the_bus_drops_its_series_and_its_peers_nvlink_health_fails(tmp_path: Path):
    state = st.set_gpu_present(st.default_state(), 1, False)
    text = scrape(tmp_path, state, "-f", counters_file(tmp_path))
    assert set(values(text, "DCGM_FI_DEV_GPU_TEMP")) == {"0"}
    assert {labels["UUID"] for _, labels, _ in samples(text)} == {state["gpus"][0]["uuid"]}
    nvlink = [
        (labels["health_error_code"], value)
        for name, labels, value in samples(text)
        if name == "DCGM_EXP_GPU_HEALTH_STATUS" and labels["health_watch"] == "NVLINK"
    ]
    assert nvlink == [("DCGM_FR_NVLINK_DOWN", "20")]


def test_a_link_down_fails_the_nvlink_health_watch_of_both_gpus(tmp_path: Path):
    state = st.set_link_active(st.default_state(), 0, 2, False)
    text = scrape(tmp_path, state, "-f", counters_file(tmp_path))
    health = {
        (labels["gpu"], labels["health_watch"]): (labels["health_error_code"], value)
        for name, labels, value in samples(text)
        if name == "DCGM_EXP_GPU_HEALTH_STATUS"
    }
    assert health[("0", "NVLINK")] == health[("1", "NVLINK")] == ("DCGM_FR_NVLINK_DOWN", "20")
    assert health[("0", "MEM")] == ("DCGM_FR_OK", "0")


def test_planted_errors_show_and_the_health_watch_follows(tmp_path: Path):
    state = st.set_gpu_errors(st.default_state(), 1, xid_last=79, ecc_dbe_volatile=2)
    st.set_gpu_errors(state, 0, nvlink_crc_data_errors=12, retired_pages_pending=1)
    text = scrape(tmp_path, state, "-f", counters_file(tmp_path))
    assert values(text, "DCGM_FI_DEV_XID_ERRORS") == {"0": "0", "1": "79"}
    assert values(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == {"0": "0", "1": "2"}
    assert values(text, "DCGM_FI_DEV_RETIRED_PENDING") == {"0": "1", "1": "0"}
    assert values(text, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL") == {"0": "12", "1": "0"}
    mem = {
        labels["gpu"]: (labels["health_error_code"], value)
        for name, labels, value in samples(text)
        if name == "DCGM_EXP_GPU_HEALTH_STATUS" and labels["health_watch"] == "MEM"
    }
    assert mem == {
        "0": ("DCGM_FR_PENDING_PAGE_RETIREMENTS", "10"),
        "1": ("DCGM_FR_VOLATILE_DBE_DETECTED", "20"),
    }
    with pytest.raises(ValueError, match="unknown GPU error field"):
        st.set_gpu_errors(state, 0, xid=1)


def test_each_scrape_reads_the_state_anew(tmp_path: Path):
    listen = free_port()
    with engine(tmp_path) as port, exporter(
        "-a", f"127.0.0.1:{listen}", "-r", f"localhost:{port}", "-f", counters_file(tmp_path)
    ) as proc:  # fmt: skip
        before = metrics(listen, proc)
        st.save_state(st.set_gpu_present(st.default_state(), 0, False), tmp_path / "state.json")
        after = metrics(listen, proc)
    assert set(values(before, "DCGM_FI_DEV_GPU_TEMP")) == {"0", "1"}
    assert set(values(after, "DCGM_FI_DEV_GPU_TEMP")) == {"0"}  # renumbered, as DCGM does
    uuid = st.default_state()["gpus"][1]["uuid"]
    assert {labels["UUID"] for _, labels, _ in samples(after)} == {uuid}


def test_the_t4_box_serves_its_one_gpu(tmp_path: Path):
    text = scrape(tmp_path, st.t4_state())
    assert {labels["modelName"] for _, labels, _ in samples(text)} == {"Tesla T4"}
    assert set(values(text, "DCGM_FI_DEV_GPU_UTIL")) == {"0"}
    config = load_host_config("box", {"dcgm_exporter": True})
    assert dcgm_checks.exporter(config, reading(text, "box")) == []


def test_without_a_counters_file_the_default_counters_and_the_recorded_layout(tmp_path: Path):
    """Without -f: the default counters; the three recorded ones (metrics.prom, from
    NVIDIA/dcgm-exporter issue 250) are rendered line for line as recorded, for GPUs with the
    recorded UUIDs and bus ids."""
    recorded = (HERE / "metrics.prom").read_text()
    state = st.default_state()
    for gpu, (_, labels, _) in zip(state["gpus"], samples(recorded)[:2], strict=True):
        gpu["uuid"], gpu["bus_id"] = labels["UUID"], labels["pci_bus_id"]
    text = scrape(tmp_path, state)
    names = {name for name, _, _ in samples(text)}
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_USED"} <= names
    assert "DCGM_EXP_GPU_HEALTH_STATUS" not in names  # only when the counters file asks
    assert "DCGM_FI_DEV_ROW_REMAP_FAILURE" not in names  # a V100 has no row remapping
    rendered = set(text.replace('Hostname="localhost"', 'Hostname="@HOSTNAME@"').splitlines())
    assert set(recorded.splitlines()) <= rendered


def test_a_counters_file_it_cannot_read_stops_it(tmp_path: Path):
    bad = counters_file(tmp_path, "DCGM_FI_DEV_GPU_TEMP, histogram, no\n")
    with engine(tmp_path) as port, exporter(
        "-a", f"127.0.0.1:{free_port()}", "-r", f"127.0.0.1:{port}", "-f", bad
    ) as proc:  # fmt: skip
        assert proc.wait(timeout=20) == 1
        assert "unknown counter type 'histogram'" in stderr(proc)


def test_the_host_engine_answers_the_fields_request_only(tmp_path: Path):
    with engine(tmp_path) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GPUBOX-STANDIN-FIELDS\n")
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"anything else\n")
            assert sock.recv(10) == b""
    document = json.loads(reply)
    assert document["ok"] and [g["dcgm_id"] for g in document["gpus"]] == [0, 1]
    assert [(g["nvlink_links"], g["nvlink_links_down"]) for g in document["gpus"]] == [
        (2, 0),
        (2, 0),
    ]
