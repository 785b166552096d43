"""The sandbox's stand-in nvidia-smi and lspci: run as the box runs them (environment pointing
at a temporary state file and run directory), held byte for byte to the real captures they
copy, parsed back with gpubox.parsers, and under each fault the state can plant."""

from __future__ import annotations

import ast
import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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
        fixture("nvidia-smi/query-gpu_csv-noheader_8xV100-SXM2-32GB_580.173.02.txt"),
        [
            "index",
            "name",
            "memory.total",
            "compute_cap",
            "driver_version",
            "pci.bus_id",
            "pcie.link.gen.max",
            "pcie.link.gen.current",
            "pcie.link.width.max",
            "pcie.link.width.current",
            "power.limit",
            "persistence_mode",
            "ecc.mode.current",
        ],
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
        ["-pm", "1"],
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
