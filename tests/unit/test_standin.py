"""The sandbox's stand-in nvidia-smi and lspci: run as the box runs them (environment pointing
at a temporary state file and run directory), held byte for byte to the real captures they
copy, parsed back with gpubox.parsers, and under each fault the state can plant."""

from __future__ import annotations

import ast
import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest
from helpers import V100_QUERY

from gpubox import parsers
from gpubox.sandbox import standin
from gpubox.sandbox.standin import state as st

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PIN = "570.211.01"
QUERY = [
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "persistence_mode",
    "memory.total",
    "memory.used",
    "temperature.gpu",
    "power.draw",
]


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


class Box:
    """A temporary stand-in box: the state file, the run directory, the two scripts."""

    def __init__(self, root: Path, state: dict[str, Any] | None = None) -> None:
        self.root = root
        self.state_file = root / "var" / "state.json"
        self.run = root / "run"
        self.run.mkdir(parents=True, exist_ok=True)
        self.save(state if state is not None else st.default_state())
        self.load_driver(PIN)
        self.persistence(True)

    def save(self, state: dict[str, Any]) -> None:
        st.save_state(state, self.state_file)

    def load_driver(self, version: str | None) -> None:
        path = self.run / st.LOADED_DRIVER_FILE
        if version is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(version + "\n")

    def persistence(self, on: bool) -> None:
        path = self.run / st.PERSISTENCE_FILE
        if on:
            path.touch()
        else:
            path.unlink(missing_ok=True)

    def env(self) -> dict[str, str]:
        return {**os.environ, st.STATE_ENV: str(self.state_file), st.RUN_ENV: str(self.run)}

    def smi(self, *args: str, version: str = PIN) -> subprocess.CompletedProcess[str]:
        script = self.root / f"nvidia-smi-{version}"
        if not script.exists():
            script.write_text(standin.nvidia_smi_source(version))
        return subprocess.run(
            [sys.executable, str(script), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
        )

    def smi_ok(self, *args: str, version: str = PIN) -> str:
        result = self.smi(*args, version=version)
        assert result.returncode == 0, result.stderr + result.stdout
        assert result.stderr == ""
        return result.stdout

    def lspci(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(standin.LSPCI), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
        )


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def query(box: Box, *extra: str) -> list[dict[str, str | None]]:
    out = box.smi_ok(f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits", *extra)
    return parsers.parse_query_gpu(out, QUERY)


# --------------------------------------------------------------------------- the scripts


@pytest.mark.parametrize("path", [standin.NVIDIA_SMI, standin.LSPCI])
def test_scripts_are_standalone_python3_stdlib_stand_ins(path: Path):
    text = path.read_text()
    assert text.startswith("#!/usr/bin/python3\n")
    assert "STAND-IN" in text.splitlines()[1] and "never shipped to a real box" in text
    assert os.access(path, os.X_OK)
    tree = ast.parse(text)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_driver_version_placeholder():
    assert standin.NVIDIA_SMI.read_text().count(standin.DRIVER_VERSION_PLACEHOLDER) == 1
    assert 'USERSPACE_VERSION = "580.105.08"' in standin.nvidia_smi_source("580.105.08")
    # the other placeholders the packager also replaces must not occur in the script
    for other in ("@VERSION@", "__DRIVER_VERSION__", "{{DRIVER_VERSION}}", "@NVIDIA_SMI_VERSION@"):
        assert other not in standin.NVIDIA_SMI.read_text()


def test_unsubstituted_script_refuses(box: Box):
    script = box.root / "raw-nvidia-smi"
    script.write_text(standin.NVIDIA_SMI.read_text())
    result = subprocess.run(
        [sys.executable, str(script)], env=box.env(), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1 and "stand-in" in result.stderr


def test_state_round_trip_and_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    state = st.default_state()
    path = st.save_state(state, tmp_path / "a" / "state.json")
    assert st.load_state(path) == state
    monkeypatch.setenv(st.STATE_ENV, str(path))
    monkeypatch.setenv(st.RUN_ENV, str(tmp_path))
    assert st.state_path() == path and st.run_dir() == tmp_path
    assert st.load_state() == state
    monkeypatch.delenv(st.STATE_ENV)
    monkeypatch.delenv(st.RUN_ENV)
    assert st.state_path() == Path("/var/lib/gpubox-standin/state.json")
    assert st.run_dir() == Path("/run/gpubox-standin")
    (tmp_path / "bad.json").write_text('{"format": 99}')
    with pytest.raises(ValueError, match="format"):
        st.load_state(tmp_path / "bad.json")


def test_fault_helpers_validate():
    state = st.default_state()
    with pytest.raises(IndexError):
        st.set_gpu_present(state, 2, False)
    with pytest.raises(ValueError, match="not cabled"):
        st.set_link_active(state, 0, 3, False)
    st.set_link_active(state, 1, 1, False)  # the same link seen from its other end
    assert state["nvlinks"][0]["active"] is False


# --------------------------------------------------------------------------- byte for byte


def _box_like(tmp_path: Path, gpus: list[dict[str, Any]], **top: Any) -> Box:
    state = st.default_state()
    template = state["gpus"][0]
    state["gpus"] = [dict(copy.deepcopy(template), **g) for g in gpus]
    state["nvlinks"] = []
    state.update(top)
    return Box(tmp_path, state)


def test_table_570_is_the_real_layout(tmp_path: Path):
    """The 1CatAI/1Cat-vLLM#85 box (2x V100-SXM2-16GB, 570.211.01), rebuilt as a state."""
    v100_16 = {"name": "Tesla V100-SXM2-16GB", "memory_total_mib": 16384, "memory_used_mib": 5}
    box = _box_like(
        tmp_path,
        [
            dict(v100_16, bus_id="00000000:07:00.0", temperature_c=31, power_draw_w=43.0),
            dict(v100_16, bus_id="00000000:08:00.0", temperature_c=30, power_draw_w=41.0),
        ],
    )
    out = box.smi_ok().splitlines(keepends=True)
    real = fixture("nvidia-smi/table_570.211.01_2xV100-SXM2-16GB_excerpt.txt")
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}\n", out[0])
    assert "".join(out[1 : 1 + len(real.splitlines())]) == real
    # after the GPUs, 570 prints an 89-space line (llm-d/llm-d-deployer#282), then processes
    tail = fixture("nvidia-smi/table_570.133.07_RTX5070_excerpt.txt").splitlines(keepends=True)
    assert out[16:18] == tail[12:14]
    assert (
        out[18:]
        == fixture("nvidia-smi/table_580.82.09_GTX960_full.txt").splitlines(keepends=True)[14:]
    )


def test_table_580_is_the_real_layout(tmp_path: Path):
    """The 1CatAI/1Cat-vLLM#237 GPU 0 (V100-SXM2-16GB, 580.173.02, persistence off)."""
    box = _box_like(
        tmp_path,
        [
            dict(
                name="Tesla V100-SXM2-16GB",
                bus_id="00000000:0D:00.0",
                memory_total_mib=16384,
                memory_used_mib=12950,
                temperature_c=41,
                power_draw_w=57.0,
            )
        ],
    )
    box.persistence(False)
    box.load_driver("580.173.02")
    out = box.smi_ok(version="580.173.02").splitlines(keepends=True)
    real = fixture("nvidia-smi/table_580.173.02_V100-SXM2-16GB_excerpt.txt").splitlines(
        keepends=True
    )
    assert out[1:12] == real[1:12]
    full = fixture("nvidia-smi/table_580.82.09_GTX960_full.txt").splitlines(keepends=True)
    assert out[12:] == full[12:]  # empty line, then the process table


def _eight_v100(tmp_path: Path) -> Box:
    """The lukolszewski/llama.cpp machine-03 (8x V100-SXM2-32GB, 580.173.02) as a state: its
    UUIDs and bus ids, and one NVLink per "NV" of its topology matrix."""
    nvlink = fixture("nvidia-smi/nvlink-s_8xV100-SXM2-32GB_580.173.02.txt")
    uuids = re.findall(r"\(UUID: (GPU-[0-9a-f-]+)\)", nvlink)
    csv = parsers.parse_query_gpu(
        fixture("nvidia-smi/query-gpu_csv-noheader_8xV100-SXM2-32GB_580.173.02.txt"), V100_QUERY
    )
    topo = parsers.parse_topo_matrix(fixture("nvidia-smi/topo-m_8xV100-SXM2-32GB_580.173.02.txt"))
    gpus = [
        dict(
            uuid=uuids[i],
            bus_id=row["pci.bus_id"],
            power_cap_w=275,
            cpu_affinity=topo.cpu_affinity[f"GPU{i}"],
            numa_affinity=topo.numa_affinity[f"GPU{i}"],
        )
        for i, row in enumerate(csv)
    ]
    links, next_port = [], [0] * 8
    for a in range(8):
        for b in range(a + 1, 8):
            for _ in range(topo.nvlinks(a, b)):
                links.append({"a": [a, next_port[a]], "b": [b, next_port[b]], "active": True})
                next_port[a] += 1
                next_port[b] += 1
    box = _box_like(tmp_path, gpus, nvlinks=links, pcie_path="SYS")
    box.load_driver("580.173.02")
    return box


def test_nvlink_status_is_the_real_layout(tmp_path: Path):
    box = _eight_v100(tmp_path)
    assert box.smi_ok("nvlink", "-s", version="580.173.02") == fixture(
        "nvidia-smi/nvlink-s_8xV100-SXM2-32GB_580.173.02.txt"
    )


def test_query_gpu_is_the_real_layout(tmp_path: Path):
    box = _eight_v100(tmp_path)
    fields = (
        "index,name,memory.total,compute_cap,driver_version,pci.bus_id,pcie.link.gen.max,"
        "pcie.link.gen.current,pcie.link.width.max,pcie.link.width.current,power.limit,"
        "persistence_mode,ecc.mode.current"
    )
    out = box.smi_ok(f"--query-gpu={fields}", "--format=csv,noheader", version="580.173.02")
    assert out == fixture("nvidia-smi/query-gpu_csv-noheader_8xV100-SXM2-32GB_580.173.02.txt")


def test_topo_is_the_real_layout(tmp_path: Path):
    box = _eight_v100(tmp_path / "eight")
    out = box.smi_ok("topo", "-m", version="580.173.02").splitlines(keepends=True)
    real = fixture("nvidia-smi/topo-m_8xV100-SXM2-32GB_580.173.02.txt").splitlines(keepends=True)

    def without_nic(line: str) -> str:  # the stand-in box has no NIC: drop its column
        cells = line.split("\t")
        return "\t".join(cells[:9] + cells[10:])

    assert out[0] == without_nic(real[0])  # escape codes included
    assert out[1:9] == [without_nic(line) for line in real[1:9]]
    assert "".join(out[9:]) == "".join(real[10:20])  # the Legend, without the NIC Legend
    # two GPUs, no NVLink, as noonghunna/club-3090#1229 shows them (escape codes stripped there)
    two = _box_like(
        tmp_path / "two", [{}, {"bus_id": "00000000:08:00.0"}], pcie_path="PHB", cpu_affinity="0-63"
    )
    assert ANSI.sub("", two.smi_ok("topo", "-m")) == fixture(
        "nvidia-smi/topo-m_2xRTX5090_PHB_club3090-issue1229.txt"
    )


def test_list_is_the_real_capture(box: Box):
    assert box.smi_ok("-L") == fixture("nvidia-smi/list_2xV100-SXM2-32GB.txt")


def test_errors_are_the_real_messages(box: Box):
    box.load_driver(None)
    result = box.smi()
    assert (result.returncode, result.stdout) == (
        9,
        fixture("nvidia-smi/error_no-driver_gcp-pr18.txt"),
    )
    box.load_driver(PIN)
    result = box.smi("-L", version="535.161.07")
    assert (result.returncode, result.stdout) == (
        18,
        fixture("nvidia-smi/error_version-mismatch_535.161_gputil-issue55.txt"),
    )


def test_lspci_is_the_real_layout(box: Box):
    for args, name in (
        (["-Dnn"], "lspci-Dnn_reference-box_lspci-F_local.txt"),
        (["-nnD"], "lspci-Dnn_reference-box_lspci-F_local.txt"),
        ([], "lspci_reference-box_lspci-F_local.txt"),
        (["-n"], "lspci-n_reference-box_lspci-F_local.txt"),
        (["-Dnn", "-d", "10de:"], "lspci-Dnn-d10de_reference-box_lspci-F_local.txt"),
    ):
        result = box.lspci(*args)
        assert (result.returncode, result.stdout) == (0, fixture("lspci/" + name)), args


# --------------------------------------------------------------------------- reference box


def test_reference_box_round_trip(box: Box):
    table = parsers.parse_smi_table(box.smi_ok())
    assert (table.driver_version, table.cuda_version) == (PIN, "12.8")
    assert [(g.index, g.name, g.persistence, g.bus_id, g.memory_total_mib) for g in table.gpus] == [
        (0, "Tesla V100-SXM2-32GB", "On", "00000000:07:00.0", 32768),
        (1, "Tesla V100-SXM2-32GB", "On", "00000000:08:00.0", 32768),
    ]
    assert [g.uuid for g in parsers.parse_smi_list(box.smi_ok("-L"))] == [
        g["uuid"] for g in st.default_state()["gpus"]
    ]
    rows = query(box)
    assert [
        (
            r["index"],
            r["pci.bus_id"],
            r["driver_version"],
            r["persistence_mode"],
            r["memory.total"],
            r["power.draw"],
        )
        for r in rows
    ] == [
        ("0", "00000000:07:00.0", PIN, "Enabled", "32768", "41.00"),
        ("1", "00000000:08:00.0", PIN, "Enabled", "32768", "39.00"),
    ]
    with_units = box.smi_ok(f"--query-gpu={','.join(QUERY)}", "--format=csv")
    header, first = with_units.splitlines()[:2]
    assert "memory.total [MiB]" in header and "power.draw [W]" in header
    assert first.endswith(", 32768 MiB, 0 MiB, 32, 41.00 W")
    assert parsers.parse_query_gpu(with_units, QUERY)[1]["uuid"] == rows[1]["uuid"]
    status = parsers.parse_nvlink_status(box.smi_ok("nvlink", "-s"))
    assert {g: [lk.link for lk in links if lk.active] for g, links in status.items()} == {
        0: [0, 2],
        1: [1, 2],
    }
    assert all(len(links) == 6 for links in status.values())
    topo = parsers.parse_topo_matrix(box.smi_ok("topo", "-m"))
    assert topo.gpus == ["GPU0", "GPU1"] and topo.nvlinks(0, 1) == 2
    assert topo.cpu_affinity["GPU0"] == "0-7"
    pci = parsers.parse_lspci(box.lspci("-Dnn", "-d", "10de:").stdout)
    assert [(d.slot, d.device_id) for d in pci] == [
        ("0000:07:00.0", "1db5"),
        ("0000:08:00.0", "1db5"),
        ("0000:09:00.0", "128b"),
        ("0000:09:00.1", "0e0f"),
    ]


def test_options_and_aliases(box: Box):
    assert parsers.parse_nvlink_status(box.smi_ok("nvlink", "--status", "-i", "1")).keys() == {1}
    assert parsers.parse_nvlink_status(box.smi_ok("-i", "0", "nvlink", "-s")).keys() == {0}
    assert box.smi_ok("--list-gpus") == box.smi_ok("-L")
    assert box.smi_ok("topo", "--matrix") == box.smi_ok("topo", "-m")
    out = box.smi_ok(
        "--query-gpu=gpu_name,gpu_bus_id,pci.device_id", "--format=csv,noheader", "--id=1"
    )
    assert out == "Tesla V100-SXM2-32GB, 00000000:08:00.0, 0x1DB510DE\n"
    assert query(box, "-i", "1")[0]["index"] == "1"


def test_580_branch(box: Box):
    box.load_driver("580.105.08")
    table = parsers.parse_smi_table(box.smi_ok(version="580.105.08"))
    assert (table.driver_version, table.cuda_version) == ("580.105.08", "13.0")
    out = box.smi_ok("--query-gpu=driver_version", "--format=csv,noheader", version="580.105.08")
    assert out == "580.105.08\n580.105.08\n"  # the loaded module is this userspace's version
    box.load_driver("590.48.01")  # a branch the stand-in knows no CUDA version for
    result = box.smi(version="590.48.01")
    assert result.returncode == 1 and "no CUDA version" in result.stderr
    assert box.smi_ok("-L", version="590.48.01")  # the other outputs do not need it


@pytest.mark.parametrize(
    "args",
    [
        ["-q"],
        ["-pm", "2"],
        ["-pm", "1", "-i", "0"],
        ["nvlink"],
        ["topo"],
        ["--query-gpu=index"],
        ["--query-gpu=index,serial", "--format=csv"],
        ["--query-gpu=index", "--format=xml"],
        ["-i", "x", "-L"],
        ["-i", "0"],
    ],
)
def test_unsupported_requests_say_stand_in(box: Box, args: list[str]):
    result = box.smi(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("gpubox sandbox stand-in nvidia-smi:")


def test_missing_state_file(box: Box):
    box.state_file.unlink()
    result = box.smi("-L")
    assert result.returncode == 1 and "cannot read the hardware state" in result.stderr
    assert box.lspci("-Dnn").returncode == 1


def test_lspci_unsupported(box: Box):
    result = box.lspci("-vv")
    assert result.returncode == 1 and result.stderr.startswith("gpubox sandbox stand-in lspci:")


# --------------------------------------------------------------------------- faults


def test_fault_no_driver_loaded(box: Box):
    box.load_driver(None)
    for args in (
        [],
        ["-L"],
        ["nvlink", "-s"],
        ["topo", "-m"],
        [f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"],
    ):
        result = box.smi(*args)
        assert result.returncode == 9
        assert parsers.parse_smi_error(result.stdout) == "no_driver"


def test_fault_version_mismatch(box: Box):
    box.load_driver("580.105.08")  # a newer driver installed and loaded; userspace still 570
    result = box.smi("-L")
    assert result.returncode == 18
    assert parsers.parse_smi_error(result.stdout) == "version_mismatch"
    assert parsers.nvml_library_version(result.stdout) == "570.211"
    with pytest.raises(parsers.ParseError, match="version_mismatch"):
        parsers.parse_smi_table(box.smi().stdout)


def test_fault_gpu_missing(box: Box):
    state = st.default_state()
    st.set_gpu_present(state, 0, False)
    box.save(state)
    (gpu,) = parsers.parse_smi_list(box.smi_ok("-L"))
    assert (gpu.index, gpu.uuid) == (0, state["gpus"][1]["uuid"])  # renumbered
    (row,) = query(box)
    assert (row["index"], row["pci.bus_id"]) == ("0", "00000000:08:00.0")
    assert [g.bus_id for g in parsers.parse_smi_table(box.smi_ok()).gpus] == ["00000000:08:00.0"]
    status = parsers.parse_nvlink_status(box.smi_ok("nvlink", "-s"))
    assert list(status) == [0] and not any(lk.active for lk in status[0])
    topo = parsers.parse_topo_matrix(box.smi_ok("topo", "-m"))
    assert topo.gpus == ["GPU0"] and topo.links == {}
    slots = [d.slot for d in parsers.parse_lspci(box.lspci("-Dnn").stdout)]
    assert "0000:07:00.0" not in slots and "0000:08:00.0" in slots


def test_fault_gpu_not_bound_by_the_driver(box: Box):
    state = st.default_state()
    st.set_gpu_driver_bound(state, 1, False)
    box.save(state)
    assert [g.uuid for g in parsers.parse_smi_list(box.smi_ok("-L"))] == [state["gpus"][0]["uuid"]]
    slots = [d.slot for d in parsers.parse_lspci(box.lspci("-Dnn", "-d", "10de:1db5").stdout)]
    assert slots == ["0000:07:00.0", "0000:08:00.0"]


def test_fault_every_gpu_gone(box: Box):
    state = st.default_state()
    st.set_gpu_present(state, 0, False)
    st.set_gpu_present(state, 1, False)
    box.save(state)
    result = box.smi("-L")
    assert (result.returncode, result.stdout) == (6, "No devices were found\n")
    assert parsers.parse_smi_list(result.stdout) == []
    assert parsers.parse_lspci(box.lspci("-Dnn", "-d", "10de:1db5").stdout) == []


def test_fault_one_link_inactive(box: Box):
    state = st.default_state()
    st.set_link_active(state, 0, 2, False)
    box.save(state)
    status = parsers.parse_nvlink_status(box.smi_ok("nvlink", "-s"))
    assert [lk.link for lk in status[0] if lk.active] == [0]
    assert [lk.link for lk in status[1] if lk.active] == [1]  # the peer's port 2 went down too
    assert status[0][2] == parsers.NvLink(2, False, None)
    assert parsers.parse_topo_matrix(box.smi_ok("topo", "-m")).nvlinks(0, 1) == 1


def test_fault_all_links_inactive(box: Box):
    state = st.default_state()
    st.set_link_active(state, 0, 0, False)
    st.set_link_active(state, 0, 2, False)
    box.save(state)
    status = parsers.parse_nvlink_status(box.smi_ok("nvlink", "-s"))
    assert not any(lk.active for links in status.values() for lk in links)
    topo = parsers.parse_topo_matrix(box.smi_ok("topo", "-m"))
    assert topo.nvlinks(0, 1) == 0 and topo.links[("GPU0", "GPU1")] == "PIX"


def test_fault_persistence(box: Box):
    assert {r["persistence_mode"] for r in query(box)} == {"Enabled"}
    state = st.default_state()
    st.set_persistence_forced_off(state, True)
    box.save(state)  # the daemon still runs with persistence on (the marker exists)
    assert {r["persistence_mode"] for r in query(box)} == {"Disabled"}
    assert {g.persistence for g in parsers.parse_smi_table(box.smi_ok()).gpus} == {"Off"}
    box.save(st.default_state())
    box.persistence(False)  # the daemon stopped, or runs with --no-persistence-mode
    assert {r["persistence_mode"] for r in query(box)} == {"Disabled"}


# --------------------------------------------------------------------------- DCGM and gpu-burn

DCGM = "4.4.1"
NO_HOSTENGINE = fixture("dcgmi/error_no-hostengine_dcgm-exporter-issue193.txt")


class DcgmBox(Box):
    """A Box with the stand-in dcgmi and nv-hostengine, and a bin directory holding them and
    nvidia-smi (gpu_burn runs `nvidia-smi -L` through the shell, as the real one does)."""

    def __init__(self, root: Path, state: dict[str, Any] | None = None) -> None:
        super().__init__(root, state)
        self.bin = root / "bin"
        self.bin.mkdir(exist_ok=True)
        for name, text in (
            ("dcgmi", standin.dcgm_source(standin.DCGMI, DCGM)),
            ("nv-hostengine", standin.dcgm_source(standin.NV_HOSTENGINE, DCGM)),
            ("nvidia-smi", standin.nvidia_smi_source(PIN)),
        ):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.profiling = root / "libdcgmmoduleprofiling.so.4"
        self.profiling.touch()

    def env(self) -> dict[str, str]:
        return {
            **super().env(),
            st.PROFILING_MODULE_ENV: str(self.profiling),
            st.BURN_TICK_ENV: "0.05",
            "PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "LC_ALL": "C",
        }

    def hostengine(self, running: bool) -> None:
        marker = self.run / st.HOSTENGINE_FILE
        if running:
            marker.write_text(f"{os.getpid()} 127.0.0.1:5555\n")
        else:
            marker.unlink(missing_ok=True)

    def tool(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        """The stand-in ``name`` run with ``args`` to its end (30 s at most), output captured."""
        return subprocess.run(
            [sys.executable, str(self.bin / name), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
        )

    def dcgmi(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.tool("dcgmi", *args)

    def dcgmi_ok(self, *args: str) -> str:
        result = self.dcgmi(*args)
        assert (result.returncode, result.stderr) == (0, ""), result.stderr + result.stdout
        return result.stdout


@pytest.fixture
def dbox(tmp_path: Path) -> DcgmBox:
    box = DcgmBox(tmp_path)
    box.hostengine(True)
    return box


def _load_script(path: Path) -> Any:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader(path.name.replace("-", "_"), str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "path",
    [
        standin.DCGMI,
        standin.NV_HOSTENGINE,
        standin.GPU_BURN_TREE / "gpu_burn.in",
        standin.GPU_BURN_TREE / "nvcc-fatbin",
    ],
)
def test_new_scripts_are_standalone_python3_stdlib_stand_ins(path: Path):
    test_scripts_are_standalone_python3_stdlib_stand_ins(path)


def test_gpu_burn_tree_is_a_labelled_stand_in():
    assert sorted(p.name for p in standin.GPU_BURN_TREE.iterdir()) == sorted(standin.GPU_BURN_FILES)
    for name in standin.GPU_BURN_FILES:
        head = (standin.GPU_BURN_TREE / name).read_text().splitlines()[:3]
        assert any("STAND-IN" in line for line in head), name
        assert "never shipped to a real box" in (standin.GPU_BURN_TREE / name).read_text(), name


def test_dcgm_version_placeholder():
    for script in (standin.DCGMI, standin.NV_HOSTENGINE):
        assert script.read_text().count(standin.DCGM_VERSION_PLACEHOLDER) == 1
        assert 'DCGM_VERSION = "4.6.0"' in standin.dcgm_source(script, "4.6.0")


def test_unsubstituted_dcgm_scripts_refuse(dbox: DcgmBox):
    for script in (standin.DCGMI, standin.NV_HOSTENGINE):
        result = subprocess.run(
            [sys.executable, str(script), "--version"],
            env=dbox.env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 1 and "stand-in" in result.stderr


def test_state_helpers_for_dcgm_and_burn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    state = st.default_state()
    st.set_gpu_burn_faulty(state, 1, True)
    st.set_gpu_nvlink_traffic(state, 0, 3_000_000_000, 2_000_000_000)
    assert state["gpus"][1]["burn_faulty"] and not state["gpus"][0]["burn_faulty"]
    assert state["gpus"][0]["nvlink_bandwidth_total"] == 5000
    with pytest.raises(IndexError):
        st.set_gpu_burn_faulty(state, 2, True)
    monkeypatch.delenv(st.PROFILING_MODULE_ENV, raising=False)
    assert st.profiling_module_path() == Path(
        "/usr/lib/x86_64-linux-gnu/libdcgmmoduleprofiling.so.4"
    )
    monkeypatch.setenv(st.PROFILING_MODULE_ENV, str(tmp_path / "x.so"))
    assert st.profiling_module_path() == tmp_path / "x.so"


# --- dcgmi


def test_dcgmi_without_host_engine_is_the_real_error(dbox: DcgmBox):
    dbox.hostengine(False)
    for args in (["discovery", "-l"], ["dmon", "-e", "449", "-c", "1"], ["diag", "-r", "1"]):
        result = dbox.dcgmi(*args)
        assert (result.returncode, result.stdout) == (235, NO_HOSTENGINE), args
    assert parsers.parse_dcgmi_error(dbox.dcgmi("discovery", "-l").stdout) == "no_hostengine"
    # a marker left by a host engine that died is no host engine
    (dbox.run / st.HOSTENGINE_FILE).write_text("999999999 127.0.0.1:5555\n")
    assert dbox.dcgmi("discovery", "-l").returncode == 235
    result = dbox.dcgmi("--host", "10.0.0.5", "discovery", "-l")
    assert result.stdout.splitlines()[0].endswith("specified host: 10.0.0.5")


def test_dcgmi_version(dbox: DcgmBox):
    dbox.hostengine(False)  # --version needs no host engine
    assert dbox.dcgmi_ok("--version") == "\ndcgmi  version: 4.4.1\n\n"


def test_dcgmi_discovery_is_the_real_layout(tmp_path: Path):
    """The liguodongiot/llm-action 8x H800 machine as a state: DCGM 4.4 prints the 3.x
    capture's tables byte for byte, then its ConnectX and CPU tables."""
    real = fixture("dcgmi/discovery-l_8xH800_llm-action.txt")
    rows = re.findall(r"PCI Bus ID: (\S+) .*\n.*Device UUID: (\S+) ", real)
    assert len(rows) == 8
    gpus = [dict(name="NVIDIA H800", bus_id=bus, uuid=uuid) for bus, uuid in rows]
    box = DcgmBox(tmp_path, None)
    state = st.default_state()
    template = state["gpus"][0]
    state["gpus"] = [dict(copy.deepcopy(template), **g) for g in gpus]
    state["nvlinks"] = []
    box.save(state)
    box.hostengine(True)
    out = box.dcgmi_ok("discovery", "-l")
    assert out.startswith(real)
    assert out[len(real) :] == (
        "0 ConnectX found.\n+----------+\n| ConnectX |\n+----------+\n+----------+\n"
        "0 CPUs found.\n"
        + real.splitlines(keepends=True)[1]
        + "| CPU ID | Device Information"
        + " " * 51
        + "|\n"
        + real.splitlines(keepends=True)[1] * 2
    )


def test_dcgmi_discovery_round_trip_and_faults(dbox: DcgmBox):
    gpus = parsers.parse_dcgmi_discovery(dbox.dcgmi_ok("discovery", "--list"))
    assert [(g.id, g.name, g.bus_id, g.uuid) for g in gpus] == [
        (i, g["name"], g["bus_id"], g["uuid"]) for i, g in enumerate(st.default_state()["gpus"])
    ]
    state = st.default_state()
    st.set_gpu_present(state, 0, False)
    dbox.save(state)
    out = dbox.dcgmi_ok("discovery", "-l")
    assert out.startswith("1 GPU found.\n")
    assert [g.bus_id for g in parsers.parse_dcgmi_discovery(out)] == ["00000000:08:00.0"]


def test_dcgmi_dmon_columns_are_the_real_layout(dbox: DcgmBox):
    """DCGM 4.4's first column is 11 wide where the 3.1.8 capture's is 10; the field columns
    (shortname, width + 8) are the same."""
    real = fixture("dcgmi/dmon-i0-e1011,1012,1009,1010-c5_H800_llm-action.txt").splitlines()
    state = st.default_state()
    state["gpus"][0].update(pcie_tx_bytes=498948, pcie_rx_bytes=1555)
    dbox.save(state)
    out = dbox.dcgmi_ok("dmon", "-i", "0", "-e", "1011,1012,1009,1010", "-c", "3", "-d", "1")
    lines = out.splitlines()
    assert lines[0][:11] == "#Entity    " and lines[1] == "ID" + " " * 121
    width = 28 * 3  # NVLTX, NVLRX, PCITX: WIDTH_20 fields in both versions
    for ours, theirs in zip(lines[:5], real[:5], strict=True):
        assert ours[11 : 11 + width] == theirs[10 : 10 + width]
        assert ours.split()[:2] == theirs.split()[:2]
    assert lines[4].split()[2:] == ["0", "0", "498948", "1555"]


def test_dcgmi_dmon_round_trip(dbox: DcgmBox):
    state = st.default_state()
    st.set_gpu_nvlink_traffic(state, 1, 12_000_000_000, 11_000_000_000)
    state["gpus"][0]["gpu_util"] = 97
    dbox.save(state)
    out = dbox.dcgmi_ok("dmon", "-e", "150,155,203,449,1011,1012", "-c", "3", "-d", "1")
    sample = parsers.parse_dcgmi_dmon(out)
    assert sample.columns == ["TMPTR", "POWER", "GPUTL", "NBWLT", "NVLTX", "NVLRX"]
    assert [r.entity for r in sample.rows] == ["GPU 0", "GPU 1"] * 3
    assert sample.rows[0].values["NVLTX"] is None  # profiling fields: N/A at first
    assert sample.latest["GPU 1"] == {
        "TMPTR": 28.0,
        "POWER": 39.0,
        "GPUTL": 0.0,
        "NBWLT": 23000.0,
        "NVLTX": 12e9,
        "NVLRX": 11e9,
    }
    assert sample.latest["GPU 0"]["GPUTL"] == 97.0
    assert "39.000" in out  # power is a double, printed %.3f
    one = parsers.parse_dcgmi_dmon(dbox.dcgmi_ok("dmon", "-e", "449,1011,1012", "-c", "1"))
    assert one.latest["GPU 0"] == {"NBWLT": 0.0, "NVLTX": None, "NVLRX": None}


def test_dcgmi_dmon_without_the_profiling_module(dbox: DcgmBox):
    dbox.profiling.unlink()
    result = dbox.dcgmi("dmon", "-e", "449,1011,1012", "-c", "1")
    real = fixture("dcgmi/dmon-e1002_module-not-loaded_3.x_dcgm-issue50.txt").splitlines(True)
    assert result.returncode == 223
    assert result.stderr == "".join(real[2:])
    assert result.stdout.startswith("#Entity    NBWLT") and result.stdout.count("\n") == 2
    assert parsers.parse_dcgmi_error(result.stderr) == "module_not_loaded"
    # fields the core module serves still work
    assert dbox.dcgmi_ok("dmon", "-e", "150,449", "-c", "1").count("GPU ") == 2


def test_dcgmi_dmon_until_a_signal(dbox: DcgmBox):
    proc = subprocess.Popen(
        [sys.executable, str(dbox.bin / "dcgmi"), "dmon", "-e", "150", "-d", "50"],
        env=dbox.env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(4)]
    assert lines[2].startswith("GPU 0")
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert rest.endswith("\n\ndmon was stopped due to receiving a signal\n")


def test_dcgmi_diag_json_is_jsoncpp_layout():
    """jsoncpp 1.9.5 (DCGM 4.4.1's) writes the real capture's document like this; the capture
    lost the space jsoncpp leaves after " :" at a line end."""
    dcgmi = _load_script(standin.DCGMI)
    real = fixture("dcgmi/diag-r1-j_GB10_4.2.3_fail.json")
    ours = dcgmi.styled(json.loads(real))
    assert ours.endswith("}\n") and '" : \n' in ours
    assert [ln.rstrip() for ln in ours.splitlines()] == real.splitlines()


def test_dcgmi_diag_levels_pass(dbox: DcgmBox):
    names = {}
    for level in ("1", "2", "3", "4"):
        result = dbox.dcgmi("diag", "-r", level, "-j")
        assert result.returncode == 0, result.stderr
        diag = parsers.parse_dcgmi_diag_json(result.stdout)
        assert diag.passed and diag.level == int(level)
        assert (diag.version, diag.driver_version) == (DCGM, PIN)
        assert all(t.results == {0: "Pass", 1: "Pass"} for t in diag.tests)
        names[level] = [t.name for t in diag.tests]
    assert names["1"] == ["software"]
    assert names["2"] == ["software", "pcie", "memory"]
    assert set(names["4"]) - set(names["3"]) == {"memtest", "pulse_test"}
    doc = json.loads(dbox.dcgmi_ok("diag", "-r", "quick", "-j"))
    assert doc["entity_groups"] == [
        {
            "entities": [
                {"device_id": "1db5", "entity_id": 0},
                {"device_id": "1db5", "entity_id": 1},
            ],
            "entity_group": "GPU",
            "entity_group_id": 1,
        }
    ]
    one = parsers.parse_dcgmi_diag_json(dbox.dcgmi_ok("diag", "-r", "2", "-j", "-i", "1"))
    assert all(t.results == {1: "Pass"} for t in one.tests)


def test_dcgmi_diag_persistence_off_is_the_real_finding(dbox: DcgmBox):
    dbox.persistence(False)
    result = dbox.dcgmi("diag", "-r", "1", "-j")
    assert result.returncode == 226  # DCGM_ST_NVVS_ERROR, as the GB10 capture's dcgmi exited
    diag = parsers.parse_dcgmi_diag_json(result.stdout)
    real = parsers.parse_dcgmi_diag_json(fixture("dcgmi/diag-r1-j_GB10_4.2.3_fail.json"))
    assert not diag.passed and diag.tests[0].results == {0: "Fail", 1: "Fail"}
    assert diag.tests[0].messages[0] == real.tests[0].messages[0]
    ours = json.loads(result.stdout)["DCGM Diagnostic"]["test_categories"][0]["tests"][0]
    theirs = json.loads(fixture("dcgmi/diag-r1-j_GB10_4.2.3_fail.json"))
    assert (
        ours["results"][0]
        == theirs["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]
    )


def test_dcgmi_diag_faulty_gpu(dbox: DcgmBox):
    state = st.default_state()
    st.set_gpu_burn_faulty(state, 1, True)
    dbox.save(state)
    assert dbox.dcgmi("diag", "-r", "1", "-j").returncode == 0  # software checks only
    result = dbox.dcgmi("diag", "-r", "2", "-j")
    assert result.returncode == 205  # DCGM_ST_NVVS_ISOLATE_ERROR
    diag = parsers.parse_dcgmi_diag_json(result.stdout)
    memory = next(t for t in diag.tests if t.name == "memory")
    assert not diag.passed and memory.results == {0: "Pass", 1: "Fail"}
    assert memory.messages == ["Found 4 faulty memory elements on GPU 1"]
    cli = dbox.dcgmi("diag", "-r", "2")
    assert cli.returncode == 205
    assert "| Warning: GPU1             | Found 4 faulty memory elements on GPU 1        |\n" in (
        cli.stdout
    )


def test_dcgmi_diag_table_is_the_real_layout(dbox: DcgmBox):
    real = fixture("dcgmi/diag-r2_1xT4_3.3.1_go-dcgm-issue52_excerpt.txt").splitlines(True)
    out = dbox.dcgmi_ok("diag", "-r", "2").splitlines(True)
    assert out[:5] == real[:5]  # banner, frame, Metadata
    assert out[5] == real[5].replace("3.3.1", "4.4.1")
    assert out[6] == real[6].replace("535.129.03", PIN)
    assert out[7] == real[7].replace("1eb8" + " " * 6, "1db5, 1db5")
    assert out[8] == real[8]  # the Deployment banner
    assert (
        out[9] == "| software                  | Pass                                           |\n"
    )
    assert (
        out[-1]
        == "+---------------------------+------------------------------------------------+\n"
    )
    assert all(len(line) == 79 for line in out[1:])


@pytest.mark.parametrize(
    "args",
    [
        ["-v"],
        ["nvlink", "-s"],
        ["discovery", "-c"],
        ["dmon", "-l"],
        ["dmon", "-e", "1001"],
        ["dmon", "-e", "449", "-i", "7"],
        ["diag", "-r", "memory"],
        ["diag", "-r", "5"],
    ],
)
def test_dcgmi_unsupported_requests_say_stand_in(dbox: DcgmBox, args: list[str]):
    result = dbox.dcgmi(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("gpubox sandbox stand-in dcgmi:")


# --- nv-hostengine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_hostengine(box: DcgmBox, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(box.bin / "nv-hostengine"), *args],
        env=box.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc


@contextmanager
def _hostengine(box: DcgmBox, *args: str) -> Iterator[tuple[subprocess.Popen[str], IO[str]]]:
    """nv-hostengine started with ``args``, and its stdout; stopped by SIGTERM (and waited for,
    30 s at most) when the block ends."""
    proc = _start_hostengine(box, *args)
    assert proc.stdout is not None
    try:
        yield proc, proc.stdout
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_nv_hostengine_listens_marks_and_stops_on_sigterm(tmp_path: Path):
    box = DcgmBox(tmp_path)
    port = _free_port()
    args = ("-n", "--service-account", "nvidia-dcgm", "-p", str(port))
    with _hostengine(box, *args) as (proc, stdout):
        line = stdout.readline()
        assert line == f"Started host engine version 4.4.1 using port number: {port} \n"
        marker = (box.run / st.HOSTENGINE_FILE).read_text().split()
        assert marker == [str(proc.pid), f"127.0.0.1:{port}"]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        assert parsers.parse_dcgmi_discovery(box.dcgmi_ok("discovery", "-l"))
        # the port is taken now: a second one fails like the real one
        second = _start_hostengine(box, "-n", "-p", str(port))
        out, _ = second.communicate(timeout=30)
        assert (second.returncode, out) == (255, "Err: Failed to start DCGM Server: -7\n")
    assert proc.returncode == 0
    assert not (box.run / st.HOSTENGINE_FILE).exists()
    assert box.dcgmi("discovery", "-l").returncode == 235


def test_nv_hostengine_bind_all_and_unix_socket(tmp_path: Path):
    box = DcgmBox(tmp_path)
    port = _free_port()
    with _hostengine(box, "-n", "-b", "ALL", "-p", str(port)) as (_, stdout):
        stdout.readline()
        assert (box.run / st.HOSTENGINE_FILE).read_text().split()[1] == f"*:{port}"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    path = tmp_path / "he.sock"
    with _hostengine(box, "-n", "-d", str(path)) as (proc, stdout):
        assert (
            stdout.readline() == f"Started host engine version 4.4.1 using socket path: {path} \n"
        )
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
    assert proc.returncode == 0 and not path.exists()


def test_nv_hostengine_daemon_and_term(tmp_path: Path):
    box = DcgmBox(tmp_path)
    pidfile = tmp_path / "nvhostengine.pid"
    port = str(_free_port())
    started = box.tool("nv-hostengine", "-p", port, "--pid", str(pidfile))
    assert started.returncode == 0
    assert started.stdout == f"Started host engine version 4.4.1 using port number: {port} \n"
    pid = int(pidfile.read_text())
    assert (box.run / st.HOSTENGINE_FILE).read_text().split()[0] == str(pid)
    again = box.tool("nv-hostengine", "-p", port, "--pid", str(pidfile))
    assert (again.returncode, again.stdout) == (1, f"Host engine already running with pid {pid}\n")
    stop = box.tool("nv-hostengine", "-t", "--pid", str(pidfile))
    assert stop.stdout == "Host engine successfully terminated.\n"
    assert not (box.run / st.HOSTENGINE_FILE).exists()


def test_nv_hostengine_bad_arguments(tmp_path: Path):
    box = DcgmBox(tmp_path)
    result = box.tool("nv-hostengine", "-n", "--bogus")
    assert result.returncode == 255
    assert "nv-hostengine failed to parse command line arguments" in result.stderr


# --- gpu-burn

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
NVCC_128 = fixture("nvcc/nvcc-version_12.8.93_1cat-issue237.txt")
NVCC_130 = fixture("nvcc/nvcc-version_13.0.88_local.txt")


class BurnTree:
    """The stand-in gpu-burn tree unpacked in a temporary directory, with a CUDA toolkit whose
    nvcc only answers --version (the sandbox's stand-in nvcc does the same)."""

    def __init__(self, box: DcgmBox, banner: str | None = NVCC_128) -> None:
        self.box = box
        self.src = box.root / "gpu-burn"
        shutil.copytree(standin.GPU_BURN_TREE, self.src)
        self.cuda = box.root / "cuda-12.8"
        (self.cuda / "bin").mkdir(parents=True)
        if banner is not None:
            nvcc = self.cuda / "bin" / "nvcc"
            nvcc.write_text(f"#!/bin/sh\ncat <<'EOF'\n{banner}EOF\n")
            nvcc.chmod(0o755)

    def make(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", f"CUDAPATH={self.cuda}", *args],
            cwd=self.src,
            # a top-level make, as a user runs it (not make[1] under `make test`)
            env={
                k: v
                for k, v in self.box.env().items()
                if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")
            },
            capture_output=True,
            text=True,
            timeout=60,
        )

    def burn(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.src / "gpu_burn"), *args],
            cwd=cwd or self.src,
            env=self.box.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def tree(dbox: DcgmBox) -> BurnTree:
    tree = BurnTree(dbox)
    result = tree.make("COMPUTE=70")
    assert result.returncode == 0, result.stderr
    return tree


def terminal(text: str) -> str:
    """What a terminal shows: each "\\r" returns to the line start (no line here is longer
    than the one it overwrites), tabs at 8."""
    return "\n".join(line.split("\r")[-1] for line in text.split("\n")).expandtabs(8)


@needs_make
def test_make_builds_for_compute_70_with_cuda_12_8(tree: BurnTree):
    assert (tree.src / "compare.fatbin").read_text().splitlines()[1:] == [
        "nvcc release 12.8",
        "image compute_70",
    ]
    script = (tree.src / "gpu_burn").read_text()
    assert 'COMPUTE = "70"' in script and os.access(tree.src / "gpu_burn", os.X_OK)
    clean = tree.make("clean")
    assert clean.returncode == 0 and not (tree.src / "gpu_burn").exists()


@needs_make
def test_make_with_cuda_13_refuses_compute_70(dbox: DcgmBox):
    tree = BurnTree(dbox, NVCC_130)
    result = tree.make("COMPUTE=70")
    assert result.returncode == 2
    assert "nvcc fatal   : Unsupported gpu architecture 'compute_70'\n" in result.stderr
    assert "make: *** [Makefile:39: compare.fatbin] Error 1\n" in result.stderr
    assert not (tree.src / "compare.fatbin").exists() and not (tree.src / "gpu_burn").exists()
    assert tree.make("COMPUTE=75").returncode == 0  # what CUDA 13 can still target


@needs_make
def test_make_without_nvcc_fails_in_the_shell(dbox: DcgmBox):
    tree = BurnTree(dbox, None)
    result = tree.make("COMPUTE=70")
    assert result.returncode == 2
    assert f"{tree.cuda}/bin/nvcc: not found\n" in result.stderr
    assert "make: *** [Makefile:39: compare.fatbin] Error 127\n" in result.stderr


@needs_make
def test_burn_passes_in_the_real_format(tree: BurnTree):
    result = tree.burn("1")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "cuInit returned 0 (no error)\n" * 2
    shown = terminal(result.stdout).splitlines()
    assert shown[:4] == [
        "Using compare file: compare.fatbin",
        "Burning for 1 seconds.",
        *fixture("nvidia-smi/list_2xV100-SXM2-32GB.txt").splitlines(),
    ]
    assert shown[4] == (
        "Initialized device 0 with 32510 MB of memory (32138 MB available, using 28924 MB of "
        "it), using FLOATS"
    )
    assert shown[5] == "Results are 268435456 bytes each, thus performing 110 iterations"
    # the end, as the nixpkgs transcript of the current version shows it for one GPU
    real = fixture("gpu-burn/burn_1xRTX3060_fatbin_nixpkgs-pr524738.txt").splitlines()
    end = shown[shown.index("Killing processes with SIGTERM (soft kill)") :]
    assert end == [
        *real[16:19],
        "Freed memory for dev 1",
        "Uninitted cublas",
        *real[19:21],
        real[21].replace("1 GPUs", "2 GPUs"),
        real[22],
        real[22].replace("GPU 0", "GPU 1"),
    ]
    summary = next(line for line in shown if "Summary at:" in line)
    assert re.fullmatch(r" {8}Summary at:   \w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \w+ \d{4}", summary)
    progress = [s for line in result.stdout.split("\n") for s in line.split("\r") if "proc'd" in s]
    assert re.fullmatch(
        r"\d+\.\d%  proc'd: \d+ \(14000 Gflop/s\) - \d+ \(14000 Gflop/s\)   errors: 0 - 0   "
        r"temps: 32 C - 28 C ",
        progress[-1],
    )
    burn = parsers.parse_gpu_burn(result.stdout)
    assert burn.ok(2) and burn.gflops == [14000.0, 14000.0] and burn.seconds == 1


@needs_make
def test_burn_faulty_gpu_exits_zero(tree: BurnTree):
    state = st.default_state()
    st.set_gpu_burn_faulty(state, 1, True)
    tree.box.save(state)
    result = tree.burn("-d", "1")
    assert result.returncode == 0
    assert result.stdout.endswith("\nTested 2 GPUs:\n\tGPU 0: OK\n\tGPU 1: FAULTY\n")
    assert "errors: 0 - 4096  (WARNING!)  temps:" in result.stdout
    assert "using DOUBLES" in result.stdout and "(6100 Gflop/s)" in result.stdout
    burn = parsers.parse_gpu_burn(result.stdout)
    assert burn.gpus == {0: "OK", 1: "FAULTY"} and burn.errors[1] > 0
    assert burn.problems(2) == ["FAULTY: GPU 1"]


@needs_make
def test_burn_one_gpu_and_options(tree: BurnTree):
    result = tree.burn("-tc", "-m", "50%", "-i", "1", "1")
    assert result.returncode == 0
    assert (
        "Initialized device 1 with 32510 MB of memory (32138 MB available, using 16069 MB "
        "of it), using FLOATS, using Tensor Cores\n" in result.stdout
    )
    assert result.stdout.endswith(
        "Freed memory for dev 1\nUninitted cublas\ndone\n\nTested 1 GPUs:\n\tGPU 0: OK\n"
    )
    assert parsers.parse_gpu_burn(result.stdout).ok(1)
    listing = tree.burn("-l")
    assert listing.stderr == "cuInit returned 0 (no error)\n"
    assert parsers.parse_gpu_burn_list(listing.stdout) == [
        (0, "Tesla V100-SXM2-32GB", 34089),
        (1, "Tesla V100-SXM2-32GB", 34089),
    ]
    help_text = tree.burn("-h").stdout
    assert help_text.startswith("GPU Burn\nUsage: gpu-burn [OPTIONS] [TIME]\n\n-m X\tUse X MB")
    bad = tree.burn("-m", "lots", "1")
    assert (bad.returncode, bad.stderr) == (22, "Syntax error near -m\n")
    no_time = tree.burn("-i", "0")
    assert no_time.stdout.startswith(
        "Run length not specified in the command line. Using compare file: compare.fatbin\n"
        "Burning for 10 seconds.\n"
    )


@needs_make
def test_burn_default_compute_75_cannot_run_on_volta(dbox: DcgmBox):
    tree = BurnTree(dbox)
    assert tree.make().returncode == 0  # COMPUTE ?= 75, as the real Makefile
    assert 'COMPUTE = "75"' in (tree.src / "gpu_burn").read_text()
    result = tree.burn("1")
    assert result.returncode == 123  # ENOMEDIUM
    message = (
        "Couldn't init a GPU test: Error in load module (gpu_burn-drv.cpp:244): "
        "no kernel image is available for execution on the device\n"
    )
    assert result.stderr.count(message) == 2
    assert result.stderr.endswith(
        "read[0] error 0read[1] error 0\n\nNo clients are alive!  Aborting\n"
    )
    assert "proc'd: -1 (0 Gflop/s) - -1 (0 Gflop/s)   errors: 0  (DIED!)- 0  (DIED!)" in (
        result.stdout
    )
    burn = parsers.parse_gpu_burn(result.stdout + result.stderr)
    assert burn.aborted and burn.died and burn.tested is None
    assert burn.init_errors[0] == message.strip()


@needs_make
def test_burn_needs_compare_fatbin_in_the_working_directory(tree: BurnTree):
    elsewhere = tree.box.root / "elsewhere"
    elsewhere.mkdir()
    result = tree.burn("1", cwd=elsewhere)
    assert result.returncode == 123
    assert (
        result.stderr.count(
            "Couldn't init a GPU test: Error in couldn't find compare kernel: compare.fatbin "
            "(gpu_burn-drv.cpp:241): named symbol not found\n"
        )
        == 2
    )
    found = tree.burn("-c", str(tree.src / "compare.fatbin"), "1", cwd=elsewhere)
    assert found.returncode == 0 and parsers.parse_gpu_burn(found.stdout).ok(2)


@needs_make
def test_burn_without_gpus(tree: BurnTree):
    bad_id = tree.burn("-i", "5", "1")
    assert bad_id.returncode == 123
    assert "Couldn't init a GPU test: Error (gpu_burn-drv.cpp:112): invalid device ordinal\n" in (
        bad_id.stderr
    )
    tree.box.load_driver(None)
    result = tree.burn("1")
    assert result.returncode == 19  # ENODEV
    assert result.stderr == (
        "cuInit returned 100 (no CUDA-capable device is detected)\n"
        "Couldn't init CUDA: Error (gpu_burn-drv.cpp:317): no CUDA-capable device is detected\n"
        "Couldn't init a GPU test: Error (gpu_burn-drv.cpp:112): initialization error\n"
        "No CUDA devices\n"
    )
    assert parsers.parse_smi_error(result.stdout) == "no_driver"  # its `nvidia-smi -L`
    listing = tree.burn("-l")
    assert listing.returncode == -signal.SIGABRT
    assert listing.stderr.endswith("  what():  No CUDA capable GPUs found.\n\n")


def test_unbuilt_gpu_burn_template_refuses(dbox: DcgmBox):
    result = subprocess.run(
        [sys.executable, str(standin.GPU_BURN_TREE / "gpu_burn.in"), "1"],
        env=dbox.env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1 and "stand-in" in result.stderr


# --------------------------------------------------------------------------- persistence mode


def test_pm_through_the_running_daemon(box: Box):
    box.persistence(False)
    (box.run / st.PERSISTENCED_FILE).write_text(f"{os.getpid()} {PIN}\n")  # a live PID
    out = box.smi_ok("-pm", "1")
    assert out == (
        "Enabled persistence mode for GPU 00000000:07:00.0.\n"
        "Enabled persistence mode for GPU 00000000:08:00.0.\n"
        "All done.\n"
    )
    assert {r["persistence_mode"] for r in query(box)} == {"Enabled"}
    assert box.smi_ok("--persistence-mode=1").startswith(
        "Persistence mode is already Enabled for GPU 00000000:07:00.0.\n"
    )
    assert box.smi_ok("-pm", "0").splitlines()[0] == (
        "Disabled persistence mode for GPU 00000000:07:00.0."
    )
    assert not (box.run / st.PERSISTENCE_FILE).exists()
    assert {r["persistence_mode"] for r in query(box)} == {"Disabled"}
    assert box.smi_ok("--persistence-mode", "DISABLED").startswith("Persistence mode is already")


def test_pm_without_the_daemon_is_legacy_mode(box: Box):
    box.persistence(False)
    (box.run / st.PERSISTENCED_FILE).write_text("999999999 570.211.01\n")  # a dead PID
    out = box.smi_ok("-pm", "1")
    assert out.splitlines()[0] == "Enabled Legacy persistence mode for GPU 00000000:07:00.0."
    assert (box.run / st.PERSISTENCE_FILE).read_text().split()[0] == "legacy"
    assert {r["persistence_mode"] for r in query(box)} == {"Enabled"}


def test_pm_needs_a_loaded_driver(box: Box):
    box.load_driver(None)
    box.persistence(False)
    result = box.smi("-pm", "1")
    assert result.returncode == 9 and not (box.run / st.PERSISTENCE_FILE).exists()


def persistenced_script(tmp_path: Path) -> Path:
    """The stand-in nvidia-persistenced as the package installs it, with its run files (and
    its pid directory, /var/run/nvidia-persistenced in the box) under ``tmp_path``."""
    from gpubox.sandbox import repo_debs

    run = tmp_path / "run"
    text = repo_debs._template(
        "nvidia-persistenced",
        version=PIN,
        package_version=f"{PIN}-1",
        branch="570",
        loaded_file=run / st.LOADED_DRIVER_FILE,
        persistence_file=run / st.PERSISTENCE_FILE,
        persistenced_file=run / st.PERSISTENCED_FILE,
    ).replace("/var/run/nvidia-persistenced", str(tmp_path / "piddir"))
    script = tmp_path / "nvidia-persistenced"
    script.write_text(text)
    return script


def test_persistenced_fails_without_its_user(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, str(persistenced_script(tmp_path)), "--user", "nvpd-not-here"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "Failed to find user 'nvpd-not-here'" in result.stderr
    assert not (tmp_path / "run" / st.PERSISTENCE_FILE).exists()


def test_persistenced_and_nvidia_smi_pm(box: Box):
    script = persistenced_script(box.root)
    box.persistence(False)
    daemon = subprocess.Popen(
        [sys.executable, str(script), "--user", "root", "--foreground"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_file = box.run / st.PERSISTENCED_FILE
        for _ in range(100):
            if run_file.exists() and (box.run / st.PERSISTENCE_FILE).exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert run_file.read_text() == f"{daemon.pid} {PIN}\n"  # persistence on by default
        assert box.smi_ok("-pm", "0").startswith("Disabled persistence mode for GPU")
        assert box.smi_ok("-pm", "1").startswith("Enabled persistence mode for GPU")
    finally:
        daemon.terminate()
        daemon.wait(10)
    assert not run_file.exists() and not (box.run / st.PERSISTENCE_FILE).exists()
    assert box.smi_ok("-pm", "1").startswith("Enabled Legacy persistence mode")


def test_lspci_machine_readable_as_the_legacy_check_reads_it(box: Box):
    result = box.lspci("-mn")
    assert result.returncode == 0, result.stderr
    assert '09:00.0 "0300" "10de" "128b" -ra1 "" ""\n' in result.stdout
    assert '07:00.0 "0302" "10de" "1db5" -ra1 "" ""\n' in result.stdout
    single = box.lspci("-nn", "-s", "09:00.0").stdout
    assert single == (
        "09:00.0 VGA compatible controller [0300]: NVIDIA Corporation GK208B [GeForce GT 710] "
        "[10de:128b] (rev a1)\n"
    )
    assert box.lspci("--version").stdout == "lspci version 3.9.0\n"
    assert box.lspci("-m").returncode == 1  # names in -m form: not served


# --------------------------------------------------------------------------- Debian-derived
# The stand-in NVIDIA debian12 driver packages, built from Debian's real ones (STANDINS.md).
# These read the real-package cache (<cache dir>/debian-real), which the sandbox build fills
# from Debian's archive once (debian_real.ensure; about 130 MB).

REAL_FULL = "535.309.01-0+deb12u1"


@pytest.fixture(scope="module")
def real():
    from gpubox.sandbox import debian_real

    return debian_real.ensure()


@pytest.fixture(scope="module")
def built(real, tmp_path_factory):
    """The driver packages of every build served, built into an unsigned flat repository."""
    from gpubox import catalog
    from gpubox.sandbox import repo_build, repo_driver

    cat = catalog.load()
    debs = repo_driver.all_driver_packages(cat, real)
    dest = repo_build.build_packages(debs, tmp_path_factory.mktemp("standin-repo"))
    return {"debs": debs, "repo": dest, "cat": cat}


def deb_field(path: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(path), name], capture_output=True, text=True, check=True
    ).stdout.strip()


def deb_member(path: Path, member: str) -> str:
    """A file of a .deb's data archive (``./usr/...``) or, without a slash, its control."""
    if "/" not in member:
        with tempfile.TemporaryDirectory(prefix="gpubox-test-") as tmp:
            subprocess.run(["dpkg-deb", "-e", str(path), tmp], check=True)
            return (Path(tmp) / member).read_text()
    tar = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", str(path)], capture_output=True, check=True
    ).stdout
    return subprocess.run(
        ["tar", "-xOf", "-", member], input=tar, capture_output=True, check=True
    ).stdout.decode()


def rewritten(text: str, real_full: str, pv: str) -> str:
    """The test's own statement of the rewrite: the real build's full version, upstream
    version and lone branch become the stand-in's."""
    up, new_up = real_full.split("-")[0], pv.split("-")[0]
    branch, new_branch = up.split(".")[0], new_up.split(".")[0]
    text = text.replace(real_full, pv).replace(up, new_up)
    return re.sub(rf"\(>= {branch}\)", f"(>= {new_branch})", text)


RELATIONS = ("Pre-Depends", "Depends", "Recommends", "Suggests", "Provides", "Conflicts")


@pytest.mark.parametrize(
    "name",
    [
        "libcuda1",
        "nvidia-smi",
        "nvidia-kernel-dkms",
        "nvidia-kernel-support",
        "nvidia-alternative",
        "nvidia-persistenced",
        "libnvidia-ml1",
    ],
)
@pytest.mark.parametrize("pv", ["570.211.01-1", "580.105.08-1", "580.900.01-1"])
def test_relations_are_debians_re_versioned(real, built, name: str, pv: str):
    package = real.package(name)
    real_deb = real.base / "debs" / package.filename
    ours = built["repo"] / f"{name}_{pv}_amd64.deb"
    assert deb_field(ours, "Version") == pv
    for field in RELATIONS:
        want = rewritten(deb_field(real_deb, field), package.version, pv)
        got = deb_field(ours, field)
        if name == "libcuda1" and field == "Provides":  # plus the newer CUDA releases
            assert got.startswith(want + ", libcuda-12.3-1")
        else:
            assert got == want, field
        assert "535." not in got and "(>= 535)" not in got
    assert deb_field(ours, "X-Gpubox-Standin-Of").startswith(f"Debian's {name} {package.version}")


def test_key_relations_are_the_real_ones(built):
    """The shapes a hand-written stand-in got wrong, read from the built packages."""
    repo = built["repo"]
    libcuda = deb_field(repo / "libcuda1_570.211.01-1_amd64.deb", "Depends")
    assert libcuda.startswith("nvidia-support, nvidia-alternative (= 570.211.01-1)")
    assert "libnvidia-pkcs11-openssl3 (= 570.211.01-1)" in libcuda
    dkms = repo / "nvidia-kernel-dkms_570.211.01-1_amd64.deb"
    assert deb_field(dkms, "Pre-Depends") == "nvidia-installer-cleanup"
    assert "dkms (>= 3.0.3-4~)" in deb_field(dkms, "Depends")
    support = deb_field(repo / "nvidia-kernel-support_570.211.01-1_amd64.deb", "Depends")
    assert "nvidia-kernel-common (>= 20151021)" in support
    assert "nvidia-modprobe (>= 570)" in support
    alternative = repo / "nvidia-alternative_570.211.01-1_amd64.deb"
    assert deb_field(alternative, "Depends") == "glx-alternative-nvidia (>= 1.2)"
    assert "nvidia-legacy-check (>= 495)" in deb_field(alternative, "Pre-Depends")


def test_persistenced_runs_as_nvpd(real, built):
    ours = built["repo"] / "nvidia-persistenced_570.211.01-1_amd64.deb"
    postinst = deb_member(ours, "postinst")
    assert "adduser --system --group" in postinst and "--home /var/run/nvpd/" in postinst
    assert re.search(r"^\s*nvpd$", postinst, re.M)
    assert "useradd" not in postinst and "nvidia-persistenced --user nvidia" not in postinst
    unit = deb_member(ours, "./lib/systemd/system/nvidia-persistenced.service")
    assert "\nExecStart=/usr/bin/nvidia-persistenced --user nvpd\n" in unit
    real_deb = real.base / "debs" / real.package("nvidia-persistenced").filename
    assert unit == deb_member(real_deb, "./lib/systemd/system/nvidia-persistenced.service")
    assert postinst == deb_member(real_deb, "postinst")  # no version inside: byte for byte
    daemon = deb_member(ours, "./usr/bin/nvidia-persistenced")
    assert "gpubox sandbox stand-in" in daemon and "@" not in daemon.split("import")[0]


def test_maintainer_scripts_and_conffiles_are_debians(real, built):
    repo = built["repo"]
    for name, member in (
        ("nvidia-alternative", "postinst"),
        ("nvidia-alternative", "triggers"),
        ("nvidia-kernel-dkms", "prerm"),
        ("nvidia-legacy-check", "preinst"),
        ("nvidia-kernel-support", "conffiles"),
        ("libcuda1", "postinst"),
        ("libcuda1", "shlibs"),
    ):
        package = real.package(name)
        real_text = deb_member(real.base / "debs" / package.filename, member)
        ours = deb_member(repo / f"{name}_570.211.01-1_amd64.deb", member)
        want = rewritten(real_text, package.version, "570.211.01-1")
        if member == "postinst" and name == "nvidia-alternative":
            want = want.replace(" 535 $slaves", " 570 $slaves").replace(
                "$((535 - 1))", "$((570 - 1))"
            )
        assert ours == want, (name, member)
    alt = deb_member(repo / "nvidia-alternative_570.211.01-1_amd64.deb", "postinst")
    assert (
        "update-alternatives --install /usr/lib/nvidia/nvidia nvidia /usr/lib/nvidia/current 570 "
        in alt
    )
    assert "/etc/nvidia/nvidia-570.211.01/nvidia-modprobe.conf" in alt
    legacy = deb_member(repo / "nvidia-legacy-check_570.211.01-1_amd64.deb", "preinst")
    assert "\n10DE128B\n" in legacy  # the reference box's GT 710: a legacy GPU
    modprobe = deb_member(
        repo / "nvidia-kernel-support_570.211.01-1_amd64.deb",
        "./etc/nvidia/current/nvidia-modprobe.conf",
    )
    assert modprobe.startswith("install nvidia modprobe -i nvidia-current $CMDLINE_OPTS\n")


def test_payload_is_a_stand_in_where_it_touches_hardware(built):
    repo = built["repo"]
    smi = deb_member(
        repo / "nvidia-smi_580.105.08-1_amd64.deb", "./usr/lib/nvidia/current/nvidia-smi"
    )
    assert 'USERSPACE_VERSION = "580.105.08"' in smi
    lib = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", str(repo / "libcuda1_570.211.01-1_amd64.deb")],
        capture_output=True,
        check=True,
    ).stdout
    listing = subprocess.run(
        ["tar", "-tvf", "-"], input=lib, capture_output=True, check=True
    ).stdout.decode()
    assert "./usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.570.211.01" in listing
    assert "libcuda.so.1 -> libcuda.so.570.211.01" in listing
    so = subprocess.run(
        ["tar", "-xOf", "-", "./usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.570.211.01"],
        input=lib,
        capture_output=True,
        check=True,
    ).stdout
    from gpubox.sandbox import debfile

    assert so[:4] == b"\x7fELF" and len(so) < 20000
    assert debfile.elf_info(so) == {"type": "library", "soname": "libcuda.so.1"}


def test_dkms_source_builds_placeholder_modules(real, built, tmp_path: Path):
    from gpubox.sandbox import kernel

    deb = built["repo"] / "nvidia-kernel-dkms_570.211.01-1_amd64.deb"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / "pkg")], check=True)
    src = tmp_path / "pkg/usr/src/nvidia-current-570.211.01"
    real_conf = deb_member(
        real.base / "debs" / real.package("nvidia-kernel-dkms").filename,
        f"./usr/src/nvidia-current-{REAL_FULL.split('-')[0]}/dkms.conf",
    )
    assert (src / "dkms.conf").read_text() == rewritten(real_conf, REAL_FULL, "570.211.01-1")
    assert sorted(p.name for p in src.iterdir()) == [
        "Makefile",
        "README.gpubox-sandbox",
        "dkms.conf",
        "gpubox-standin-ko",
    ]
    version = "6.1.0-99-amd64"
    kernel.install_kernel(tmp_path / "root", version)
    headers = tmp_path / f"root/usr/src/linux-headers-{version}"
    assert "PREEMPT_RT" not in (headers / ".config").read_text().replace(
        "CONFIG_PREEMPT_RT is not set", ""
    )
    make = ["make", "-C", str(src), "modules", f"KERNEL_UNAME={version}", f"SYSSRC={headers}"]
    result = subprocess.run(make, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for module in ("nvidia", "nvidia-modeset", "nvidia-drm", "nvidia-uvm", "nvidia-peermem"):
        data = (src / f"{module}.ko").read_bytes()
        assert data[:4] == b"\x7fELF"
        assert b"version=570.211.01\0" in data and f"vermagic={version} ".encode() in data
    no_headers = subprocess.run(
        [*make[:-1], f"SYSSRC={tmp_path / 'nothing'}"], capture_output=True, text=True
    )
    assert no_headers.returncode != 0 and "no kernel headers" in no_headers.stderr


def test_standin_kernel_tree(tmp_path: Path):
    from gpubox.sandbox import kernel

    kernel.install_kernel(tmp_path, "6.18.44-fc-v857")
    modules = tmp_path / "lib/modules/6.18.44-fc-v857"
    assert os.readlink(modules / "build") == "/usr/src/linux-headers-6.18.44-fc-v857"
    assert (tmp_path / "usr/src/linux-headers-6.18.44-fc-v857/include").is_dir()
    assert (modules / "modules.order").exists() and (
        tmp_path / "boot/config-6.18.44-fc-v857"
    ).exists()
    kernel.install_kernel(tmp_path, "6.18.45-x", headers=False)
    assert not (tmp_path / "lib/modules/6.18.45-x/build").exists()
    with pytest.raises(kernel.KernelError):
        kernel.install_kernel(tmp_path, "../etc")


def test_the_documented_install_resolves_with_apt(real, built):
    """apt's real resolver, Debian's real index plus the stand-in repository: NVIDIA's
    documented install resolves under a pin like the deploy's, from the stand-ins derived
    from Debian's packages and Debian's own support packages; without the pin the newer
    branch's packages win and the exact versions cannot be met."""
    from gpubox.sandbox import debian_real, repo_build

    pv = "570.211.01-1"
    install = [
        "install",
        "--no-install-recommends",
        f"nvidia-driver-cuda={pv}",
        f"nvidia-kernel-dkms={pv}",
    ]
    pin = repo_build.driver_pin(built["debs"], pv)
    result = debian_real.simulate(real, [built["repo"]], install, preferences=pin)
    assert result.returncode == 0, result.stdout + result.stderr
    installs = debian_real.simulated_installs(result.stdout)
    ours = {n for n, v in installs.items() if v == pv}
    assert ours == {
        "nvidia-driver-cuda",
        *(p.name for p in real.packages.values() if not p.name.startswith("nvidia-open-")),
    }
    for debian in (
        "dkms",
        "nvidia-support",
        "nvidia-kernel-common",
        "nvidia-installer-cleanup",
        "glx-alternative-nvidia",
        "update-glx",
    ):
        assert debian in installs and installs[debian] != pv
    assert not [n for n, v in installs.items() if v.startswith(("535.", "580."))]
    assert repo_build.check_driver_install(real, built["repo"], built["debs"], built["cat"]) == []

    unpinned = debian_real.simulate(real, [built["repo"]], install)
    assert unpinned.returncode != 0
    # the newest build served wins: the invented patch release of 580, not the catalog's
    assert "but 580.900.01-1 is to be installed" in unpinned.stdout


def test_the_repository_serves_each_build_whole_and_cuda_drivers_follows_the_newest(real, built):
    """Three driver builds side by side, each with the same package set (NEWER_580 derived
    as 580.105.08 is, re-versioned, its module source at its own version); the cuda-drivers
    trap, asked for without a pin, installs the newest build, as NVIDIA's does."""
    from gpubox import catalog
    from gpubox.sandbox import debian_real, repo_driver

    assert repo_driver.NEWER_580 == "580.900.01"
    assert repo_driver.NEWER_580 not in Path(catalog.__file__).with_name("catalog.yml").read_text()
    builds = repo_driver.served_builds(built["cat"])
    assert [b.version for b in builds] == ["570.211.01", "580.105.08", "580.900.01"]
    names = {
        b.package_version: {d.name for d in built["debs"] if d.version == b.package_version}
        for b in builds
    }
    assert names["580.900.01-1"] == names["580.105.08-1"] == names["570.211.01-1"]
    dkms = built["repo"] / "nvidia-kernel-dkms_580.900.01-1_amd64.deb"
    makefile = deb_member(dkms, "./usr/src/nvidia-current-580.900.01/Makefile")
    assert "--version 580.900.01 " in makefile
    smi = deb_member(
        built["repo"] / "nvidia-smi_580.900.01-1_amd64.deb", "./usr/lib/nvidia/current/nvidia-smi"
    )
    assert 'USERSPACE_VERSION = "580.900.01"' in smi
    trap = debian_real.simulate(
        real, [built["repo"]], ["install", "--no-install-recommends", "cuda-drivers"]
    )
    assert trap.returncode == 0, trap.stdout + trap.stderr
    installs = debian_real.simulated_installs(trap.stdout)
    assert installs["cuda-drivers"] == installs["nvidia-driver-cuda"] == "580.900.01-1"
    assert installs["nvidia-kernel-dkms"] == "580.900.01-1"


def test_standins_doc_lists_every_package(built):
    from gpubox.sandbox import repo, repo_tools

    doc = (Path(repo.__file__).parent / "STANDINS.md").read_text()
    names = {d.name for d in built["debs"]}
    names |= {d.name for d in repo_tools.all_toolkit_packages()}
    names |= {
        d.name for c in repo_tools.CUDA_STANDINS for d in repo_tools.cuda_packages(c, built["cat"])
    }
    names |= {d.name for d in repo_tools.dcgm_packages(built["cat"]["dcgm"]["version"])}
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"STANDINS.md does not list {missing}"


def test_debians_legacy_check_finds_the_gt_710(built, box: Box, tmp_path: Path):
    """The real nvidia-legacy-check preinst's detection (its own shell code, run against the
    stand-in lspci) flags the reference box's display card, as it would on the real box; a
    box without that card passes."""
    preinst = deb_member(built["repo"] / "nvidia-legacy-check_570.211.01-1_amd64.deb", "preinst")
    assert ". /usr/share/debconf/confmodule\n" in preinst
    detect = preinst.replace(". /usr/share/debconf/confmodule\n", "")
    detect = detect[: detect.index('if [ "$1" = "install" ]')] + "find_unsupported_gpus\n"
    script = tmp_path / "detect.sh"
    script.write_text(detect)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "lspci").write_text(standin.LSPCI.read_text())
    (bindir / "lspci").chmod(0o755)
    env = {**box.env(), "PATH": f"{bindir}:/usr/bin:/bin"}

    def found() -> str:
        result = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert found() == "09:00.0\n"
    state = st.default_state()
    for device in state["pci_devices"]:
        if device["device_id"] == "128b":
            device["present"] = False
    box.save(state)
    assert found() == ""


def test_the_t4_box_answers_as_the_recorded_t4_capture(tmp_path: Path):
    """The fleet's second box: one Tesla T4, no NVLink; name, bus id and memory as the real
    1x T4 `nvidia-smi --query-gpu` capture has them; lspci names the T4's PCI id."""
    box = Box(tmp_path, st.t4_state())
    capture = fixture("nvidia-smi/query-gpu_csv_1xT4_NA.csv").splitlines()
    header = [h.strip() for h in capture[0].split(",")]
    real = dict(zip(header, (v.strip() for v in capture[1].split(",")), strict=True))
    [gpu] = query(box)
    assert (gpu["name"], gpu["pci.bus_id"]) == (real["name"], real["pci.bus_id"])
    assert gpu["memory.total"] == real["memory.total [MiB]"] == "15360"
    assert box.smi_ok("-L").startswith("GPU 0: Tesla T4 (UUID: GPU-")
    devices = parsers.parse_lspci(box.lspci("-Dnn", "-d", "10de:").stdout)
    t4 = [d for d in devices if d.class_code == "0302"]
    assert [(d.vendor_id, d.device_id) for d in t4] == [("10de", "1eb8")]
    assert "Tesla T4" in t4[0].description
