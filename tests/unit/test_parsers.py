"""The parsers on real captured outputs (tests/fixtures, sources in tests/fixtures/SOURCES.md)
and on the edge cases those captures show: one GPU, inactive links, no NVLink, N/A values,
the driver/library mismatch, tabs turned into spaces, excerpts that stop mid-table."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from helpers import V100_QUERY

from gpubox import parsers
from gpubox.parsers import ParseError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_every_fixture_has_a_source():
    sources = fixture("SOURCES.md")
    files = [p for p in FIXTURES.rglob("*") if p.is_file() and p.name != "SOURCES.md"]
    assert files
    missing = [
        str(p.relative_to(FIXTURES)) for p in files if str(p.relative_to(FIXTURES)) not in sources
    ]
    assert not missing, f"fixtures without an entry in SOURCES.md: {missing}"


# --------------------------------------------------------------------------- errors


def test_smi_error_version_mismatch():
    for name in (
        "nvidia-smi/error_version-mismatch_535.161_gputil-issue55.txt",
        "nvidia-smi/error_version-mismatch_570.124_tinygrad-issue47.txt",
    ):
        assert parsers.parse_smi_error(fixture(name)) == "version_mismatch"
    text = fixture("nvidia-smi/error_version-mismatch_570.124_tinygrad-issue47.txt")
    assert parsers.nvml_library_version(text) == "570.124"


def test_smi_error_no_driver():
    text = fixture("nvidia-smi/error_no-driver_gcp-pr18.txt")
    assert parsers.parse_smi_error(text) == "no_driver"
    assert parsers.nvml_library_version(text) is None
    # the same message with a typographic apostrophe, as some copies show it
    assert parsers.parse_smi_error(text.replace("couldn't", "couldn\u2018t")) == "no_driver"


def test_smi_error_none_on_good_output():
    assert parsers.parse_smi_error(fixture("nvidia-smi/list_2xV100-SXM2-32GB.txt")) is None
    assert parsers.parse_smi_error("") is None


@pytest.mark.parametrize(
    "parse",
    [
        parsers.parse_smi_list,
        parsers.parse_smi_table,
        parsers.parse_nvlink_status,
        parsers.parse_topo_matrix,
        lambda text: parsers.parse_query_gpu(text, ["index", "name"]),
    ],
)
def test_nvidia_smi_parsers_refuse_the_mismatch_error(parse):
    with pytest.raises(ParseError, match="version_mismatch"):
        parse(fixture("nvidia-smi/error_version-mismatch_535.161_gputil-issue55.txt"))


# --------------------------------------------------------------------------- -L


def test_smi_list_two_v100():
    gpus = parsers.parse_smi_list(fixture("nvidia-smi/list_2xV100-SXM2-32GB.txt"))
    assert gpus == [
        parsers.SmiGpu(0, "Tesla V100-SXM2-32GB", "GPU-dae76d0e-3414-958a-8f3e-fc6682b36f31"),
        parsers.SmiGpu(1, "Tesla V100-SXM2-32GB", "GPU-60f2c95a-c564-a078-2a14-b4ff488806ca"),
    ]


def test_smi_list_one_gpu_and_no_devices():
    one = fixture("nvidia-smi/list_2xV100-SXM2-32GB.txt").splitlines()[1] + "\n"
    assert [g.index for g in parsers.parse_smi_list(one)] == [1]
    assert parsers.parse_smi_list("No devices were found\n") == []
    assert parsers.parse_smi_list("") == []


def test_smi_list_garbage():
    with pytest.raises(ParseError, match="nvidia-smi -L"):
        parsers.parse_smi_list("GPU zero is fine\n")


# --------------------------------------------------------------------------- --query-gpu


def test_query_gpu_noheader_eight_v100():
    rows = parsers.parse_query_gpu(
        fixture("nvidia-smi/query-gpu_csv-noheader_8xV100-SXM2-32GB_580.173.02.txt"), V100_QUERY
    )
    assert len(rows) == 8
    assert rows[0] == {
        "index": "0",
        "name": "Tesla V100-SXM2-32GB",
        "memory.total": "32768 MiB",
        "compute_cap": "7.0",
        "driver_version": "580.173.02",
        "pci.bus_id": "00000000:1A:00.0",
        "pcie.link.gen.max": "3",
        "pcie.link.gen.current": "3",
        "pcie.link.width.max": "16",
        "pcie.link.width.current": "16",
        "power.limit": "275.00 W",
        "persistence_mode": "Enabled",
        "ecc.mode.current": "Enabled",
    }
    assert [r["pci.bus_id"] for r in rows][-1] == "00000000:B3:00.0"


def _header_fields(name: str) -> list[str]:
    header = fixture(name).splitlines()[0]
    return [cell.split(" [")[0].strip() for cell in header.split(",")]


def test_query_gpu_with_header_and_units():
    name = "nvidia-smi/query-gpu_csv_4xT4.csv"
    rows = parsers.parse_query_gpu(fixture(name), _header_fields(name))
    assert [r["pci.bus_id"] for r in rows] == [f"0000000{i}:00:00.0" for i in range(1, 5)]
    assert rows[0]["memory.total"] == "16384"
    assert rows[0]["utilization.gpu"] == "0"


def test_query_gpu_na_values_become_none():
    name = "nvidia-smi/query-gpu_csv_1xT4_NA.csv"
    (row,) = parsers.parse_query_gpu(fixture(name), _header_fields(name))
    assert row["temperature.memory"] is None  # printed "N/A"
    assert row["power.draw.average"] is None  # printed "[N/A]"
    assert row["power.draw.instant"] == "9.31"
    assert row["driver_version"] == "550.54.15"


def test_query_gpu_header_must_name_the_fields():
    name = "nvidia-smi/query-gpu_csv_4xT4.csv"
    fields = _header_fields(name)
    with pytest.raises(ParseError, match="header"):
        parsers.parse_query_gpu(fixture(name), [fields[0], *fields[2:], fields[1]])


def test_query_gpu_wrong_field_count():
    with pytest.raises(ParseError, match="expected 2 comma-separated values"):
        parsers.parse_query_gpu(
            fixture("nvidia-smi/query-gpu_csv-noheader_8xV100-SXM2-32GB_580.173.02.txt"),
            ["index", "name"],
        )


def test_query_gpu_no_devices_and_empty():
    assert parsers.parse_query_gpu("No devices were found\n", ["index"]) == []
    assert parsers.parse_query_gpu("", ["index"]) == []
    with pytest.raises(ParseError):
        parsers.parse_query_gpu("0", [])


# --------------------------------------------------------------------------- the table


def test_smi_table_570_two_v100():
    table = parsers.parse_smi_table(
        fixture("nvidia-smi/table_570.211.01_2xV100-SXM2-16GB_excerpt.txt")
    )
    assert (table.driver_version, table.cuda_version, table.smi_version) == (
        "570.211.01",
        "12.8",
        "570.211.01",
    )
    assert [(g.index, g.name, g.persistence, g.bus_id) for g in table.gpus] == [
        (0, "Tesla V100-SXM2-16GB", "On", "00000000:07:00.0"),
        (1, "Tesla V100-SXM2-16GB", "On", "00000000:08:00.0"),
    ]
    gpu0 = table.gpus[0]
    assert (gpu0.memory_used_mib, gpu0.memory_total_mib) == (5, 16384)
    assert (gpu0.fan, gpu0.temperature_c, gpu0.perf) == ("N/A", 31, "P0")
    assert (gpu0.power_draw_w, gpu0.power_cap_w, gpu0.gpu_util_pct) == (43, 300, 0)
    assert (gpu0.ecc, gpu0.display_active, gpu0.compute_mode) == ("0", "Off", "Default")


def test_smi_table_580_one_gpu_persistence_off():
    table = parsers.parse_smi_table(
        fixture("nvidia-smi/table_580.173.02_V100-SXM2-16GB_excerpt.txt")
    )
    assert (table.driver_version, table.cuda_version) == ("580.173.02", "13.0")
    (gpu,) = table.gpus
    assert (gpu.persistence, gpu.bus_id, gpu.memory_used_mib) == ("Off", "00000000:0D:00.0", 12950)


def test_smi_table_full_with_processes_and_fan():
    table = parsers.parse_smi_table(fixture("nvidia-smi/table_580.82.09_GTX960_full.txt"))
    (gpu,) = table.gpus
    assert (gpu.name, gpu.fan, gpu.perf, gpu.ecc) == ("NVIDIA GeForce GTX 960", "0%", "P8", "N/A")
    other = parsers.parse_smi_table(fixture("nvidia-smi/table_570.133.07_RTX5070_excerpt.txt"))
    assert other.gpus[0].memory_used_mib == 304


def test_smi_table_cut_after_the_first_row():
    lines = fixture("nvidia-smi/table_570.211.01_2xV100-SXM2-16GB_excerpt.txt").splitlines()
    table = parsers.parse_smi_table("\n".join(lines[:-1]))
    assert table.gpus[1].bus_id == "00000000:08:00.0"
    assert table.gpus[1].memory_total_mib is None


def test_smi_table_garbage_and_no_devices():
    with pytest.raises(ParseError, match="banner"):
        parsers.parse_smi_table("hello\n")
    with pytest.raises(ParseError, match="No devices"):
        parsers.parse_smi_table("No devices were found\n")


# --------------------------------------------------------------------------- nvlink -s


def test_nvlink_eight_v100_all_active():
    status = parsers.parse_nvlink_status(
        fixture("nvidia-smi/nvlink-s_8xV100-SXM2-32GB_580.173.02.txt")
    )
    assert sorted(status) == list(range(8))
    for links in status.values():
        assert [(lk.link, lk.active, lk.speed_gbs) for lk in links] == [
            (n, True, 25.781) for n in range(6)
        ]


def test_nvlink_two_v100_inactive_links_without_leading_whitespace():
    gpu0 = parsers.parse_nvlink_status(
        fixture("nvidia-smi/nvlink-s-i0_2xV100-SXM2-16GB_rwth-page.txt")
    )
    gpu1 = parsers.parse_nvlink_status(
        fixture("nvidia-smi/nvlink-s-i1_2xV100-SXM2-16GB_rwth-page.txt")
    )
    assert [lk.link for lk in gpu0[0] if lk.active] == [0, 2]
    assert [lk.link for lk in gpu1[1] if lk.active] == [1, 2]
    assert gpu0[0][1] == parsers.NvLink(1, False, None)


def test_nvlink_inactive_links_with_spaces_and_a_redacted_uuid():
    status = parsers.parse_nvlink_status(
        fixture("nvidia-smi/nvlink-s_V100-SXM2-32GB_inactive_azhpc-issue73.txt")
    )
    assert list(status) == [3]
    assert [lk.link for lk in status[3] if not lk.active] == [3, 5]


def test_nvlink_integer_speeds():
    status = parsers.parse_nvlink_status(
        fixture("nvidia-smi/nvlink-s_2xA100-SXM4-80GB_nccl-tests-issue228.txt")
    )
    assert len(status[0]) == 12 and status[1][11].speed_gbs == 25.0


def test_nvlink_no_nvlink_and_garbage():
    assert parsers.parse_nvlink_status("") == {}
    text = (
        "GPU 2: NVIDIA RTX A6000 (UUID: GPU-02c05ee3-bdb5-aac7-f9e8-a4c8f3f725b3)\n"
        "NVML: Unable to retrieve NVLink information as all links are inActive\n"
    )
    assert parsers.parse_nvlink_status(text) == {2: []}
    with pytest.raises(ParseError, match="before any"):
        parsers.parse_nvlink_status("\t Link 0: 25.781 GB/s\n")
    with pytest.raises(ParseError, match="unknown NVLink state"):
        parsers.parse_nvlink_status("GPU 0: X (UUID: GPU-1)\n\t Link 0: broken\n")
    with pytest.raises(ParseError, match="not `nvidia-smi nvlink -s`"):
        parsers.parse_nvlink_status("something else\n")


# --------------------------------------------------------------------------- topo -m


def test_topo_eight_v100_with_escape_codes_nic_and_legends():
    topo = parsers.parse_topo_matrix(fixture("nvidia-smi/topo-m_8xV100-SXM2-32GB_580.173.02.txt"))
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert topo.nics == ["NIC0"]
    assert topo.nvlinks(0, 1) == 1 and topo.nvlinks("GPU0", "GPU3") == 2
    assert topo.nvlinks(0, 5) == 0  # SYS
    assert topo.links[("GPU0", "NIC0")] == "NODE"
    assert topo.links[("GPU4", "GPU0")] == "NV2"
    assert topo.cpu_affinity["GPU4"] == "20-39,60-79" and topo.numa_affinity["GPU4"] == "1"
    assert topo.nic_names == {"NIC0": "mlx5_2"}
    for (a, b), value in topo.links.items():
        assert topo.links[(b, a)] == value


def test_topo_two_gpus_without_nvlink():
    topo = parsers.parse_topo_matrix(
        fixture("nvidia-smi/topo-m_2xRTX5090_PHB_club3090-issue1229.txt")
    )
    assert topo.gpus == ["GPU0", "GPU1"] and topo.nics == []
    assert topo.links == {("GPU0", "GPU1"): "PHB", ("GPU1", "GPU0"): "PHB"}
    assert topo.nvlinks(0, 1) == 0
    assert topo.nvlinks(0, 7) == 0  # unknown GPU


def test_topo_spaces_instead_of_tabs_with_nic_rows():
    topo = parsers.parse_topo_matrix(
        fixture("nvidia-smi/topo-m_2GPU_NV12_NICs_spaces_dask-cuda-issue1358.txt")
    )
    assert topo.gpus == ["GPU0", "GPU1"]
    assert topo.nics == ["NIC0", "NIC1", "NIC2"]
    assert topo.nvlinks(0, 1) == 12
    assert topo.links[("NIC2", "NIC3")] == "PXB"
    assert topo.cpu_affinity["GPU1"] == "48-63,176-191" and topo.numa_affinity["GPU1"] == "3"


def test_topo_garbage():
    with pytest.raises(ParseError, match="GPU0"):
        parsers.parse_topo_matrix("nothing here\n")
    with pytest.raises(ParseError, match="matrix row"):
        parsers.parse_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \t0-7\n")


# --------------------------------------------------------------------------- nvcc


def test_nvcc_versions():
    assert parsers.parse_nvcc_version(
        fixture("nvcc/nvcc-version_12.8.93_1cat-issue237.txt")
    ) == parsers.NvccVersion("12.8", "12.8.93")
    assert parsers.parse_nvcc_version(
        fixture("nvcc/nvcc-version_13.0.88_local.txt")
    ) == parsers.NvccVersion("13.0", "13.0.88")
    with pytest.raises(ParseError, match="nvcc --version"):
        parsers.parse_nvcc_version("bash: nvcc: command not found\n")


# --------------------------------------------------------------------------- lspci


def test_lspci_reference_box():
    devices = parsers.parse_lspci(fixture("lspci/lspci-Dnn_reference-box_lspci-F_local.txt"))
    v100 = [d for d in devices if (d.vendor_id, d.device_id) == ("10de", "1db5")]
    assert [d.slot for d in v100] == ["0000:07:00.0", "0000:08:00.0"]
    assert v100[0] == parsers.PciDevice(
        slot="0000:07:00.0",
        class_code="0302",
        class_name="3D controller",
        vendor_id="10de",
        device_id="1db5",
        description="NVIDIA Corporation GV100GL [Tesla V100 SXM2 32GB]",
        revision="a1",
    )
    gt710 = [d for d in devices if d.device_id == "128b"]
    assert gt710[0].class_code == "0300"
    assert gt710[0].description == "NVIDIA Corporation GK208B [GeForce GT 710]"
    assert [d.device_id for d in devices if d.vendor_id == "10b5"] == ["8749"] * 3
    nvidia = parsers.parse_lspci(fixture("lspci/lspci-Dnn-d10de_reference-box_lspci-F_local.txt"))
    assert [d.device_id for d in nvidia] == ["1db5", "1db5", "128b", "0e0f"]


def test_lspci_unnamed_devices_and_no_revision():
    devices = parsers.parse_lspci(fixture("lspci/lspci-Dnn_dev-vm_local.txt"))
    assert devices[0].description == "Intel Corporation Device" and devices[0].revision is None
    assert devices[1].class_code == "ffff"


def test_lspci_without_domain_and_with_detail_lines():
    (gt710,) = parsers.parse_lspci(fixture("lspci/lspci-nn_GT710B_antergos-issue9.txt"))
    assert (gt710.slot, gt710.device_id) == ("01:00.0", "128b")
    devices = parsers.parse_lspci(fixture("lspci/lspci-nnk_2xRTX3090_club3090-pr594.txt"))
    assert [(d.slot, d.class_code) for d in devices] == [
        ("05:00.0", "0300"),
        ("05:00.1", "0403"),
        ("0a:00.0", "0300"),
        ("0a:00.1", "0403"),
    ]


def test_lspci_sysfs_fallback_line():
    # the line gpubox.infra.host_facts prints from sysfs when lspci is absent
    (dev,) = parsers.parse_lspci("0000:1a:00.0 Class [0302]: NVIDIA Corporation Device [10de:1db5]")
    assert (dev.class_code, dev.device_id) == ("0302", "1db5")


def test_lspci_refuses_output_without_numbers():
    with pytest.raises(ParseError, match="-nn"):
        parsers.parse_lspci(fixture("lspci/lspci_reference-box_lspci-F_local.txt"))


# --------------------------------------------------------------------------- apt-cache policy


def test_apt_policy_pins_none_and_installed_marker():
    policy = parsers.parse_apt_policy(fixture("apt/apt-cache-policy_debian12_pinned_local.txt"))
    assert list(policy) == ["curl", "bash", "logrotate", "mokutil"]  # nvidia-driver-570 unknown
    curl = policy["curl"]
    assert (curl.installed, curl.candidate) == ("7.88.1-10+deb12u14", "7.88.1-10+deb12u14")
    pinned = [v for v in curl.versions if v.installed]
    assert [(v.version, v.priority, v.sources, v.source_priorities) for v in pinned] == [
        ("7.88.1-10+deb12u14", 1001, ["/var/lib/dpkg/status"], [100])
    ]
    assert curl.versions[0].sources == [
        "http://mirror.example.org/debian bookworm/main amd64 Packages"
    ]
    assert [(v.version, v.priority) for v in policy["bash"].versions] == [
        ("5.2.15-2+b13", -1),
        ("5.2.15-2+b8", 100),
    ]
    logrotate = policy["logrotate"]
    assert (logrotate.installed, logrotate.candidate) == (None, None)
    assert logrotate.versions[0].source_priorities == [500, 100]
    assert policy["mokutil"].versions[0].installed


def test_apt_policy_nvidia_repository_pinned_out():
    policy = parsers.parse_apt_policy(
        fixture("apt/apt-cache-policy_fabricmanager_pinned-out_fm-issue3_excerpt.txt")
    )
    fm = policy["cuda-drivers-fabricmanager"]
    assert fm.installed is None and fm.candidate is None
    assert {v.priority for v in fm.versions} == {-1}
    assert fm.versions[0].sources[0].startswith("https://developer.download.nvidia.com/")


def test_apt_policy_empty_and_garbage():
    assert parsers.parse_apt_policy("") == {}
    with pytest.raises(ParseError, match="PACKAGE:"):
        parsers.parse_apt_policy("  Installed: 1.0\n")
    with pytest.raises(ParseError, match="C locale"):
        parsers.parse_apt_policy("bash:\n  Installiert: 5.2\n")


# --------------------------------------------------------------------------- apt-mark, dpkg


def test_showhold():
    assert parsers.parse_showhold(fixture("apt/apt-mark-showhold_debian12_local.txt")) == {"curl"}
    assert parsers.parse_showhold(fixture("apt/apt-mark-showhold_connectbox-pr218.txt")) == {
        "linux-dtb-dev-sun8i",
        "linux-image-dev-sun8i",
        "linux-u-boot-nanopineo-dev",
    }
    assert parsers.parse_showhold("") == set()
    assert parsers.parse_showhold("libnvidia-compute-570:amd64\n") == {
        "libnvidia-compute-570:amd64"
    }
    with pytest.raises(ParseError, match="showhold"):
        parsers.parse_showhold("E: Could not open lock file\n")


def test_dpkg_query():
    packages = parsers.parse_dpkg_query(fixture("apt/dpkg-query_debian12_local.txt"))
    assert {n: (p.version, p.status) for n, p in packages.items()} == {
        "bash": ("5.2.15-2+b8", "ii "),
        "curl": ("7.88.1-10+deb12u14", "hi "),
        "logrotate": ("3.21.0-1", "rc "),
        "mokutil": ("0.6.0-2", "ii "),
    }
    assert packages["curl"].held and packages["curl"].installed
    assert not packages["logrotate"].installed and not packages["bash"].held


def test_dpkg_query_stripped_status_and_messages():
    text = "bash\t5.2.15-2+b8\tii\ndpkg-query: no packages found matching nvidia-smi\n"
    assert parsers.parse_dpkg_query(text)["bash"].status == "ii "
    with pytest.raises(ParseError, match="PACKAGE<TAB>VERSION<TAB>STATUS"):
        parsers.parse_dpkg_query("ii  bash  5.2.15-2+b8  amd64  GNU Bourne Again SHell\n")
    with pytest.raises(ParseError, match="status"):
        parsers.parse_dpkg_query("bash\t5.2\tinstalled\n")


# --------------------------------------------------------------------------- os-release, SB


def test_os_release():
    debian = parsers.parse_os_release(fixture("os/os-release_debian12_local.txt"))
    assert (debian["ID"], debian["VERSION_ID"], debian["VERSION_CODENAME"]) == (
        "debian",
        "12",
        "bookworm",
    )
    ubuntu = parsers.parse_os_release(
        fixture("os/os-release_ubuntu-noble-devel_tailscale-issue10699.txt")
    )
    assert (ubuntu["ID"], ubuntu["VERSION_ID"], ubuntu["ID_LIKE"]) == ("ubuntu", "24.04", "debian")
    assert ubuntu["LOGO"] == "ubuntu-logo"
    assert parsers.parse_os_release('# comment\nNAME=\'a "b"\'\nX="c\\"d"\n') == {
        "NAME": 'a "b"',
        "X": 'c"d',
    }
    with pytest.raises(ParseError, match="KEY=value"):
        parsers.parse_os_release("not os-release\n")


def test_secure_boot():
    assert parsers.parse_secure_boot(fixture("os/mokutil-sb-state_enabled_sos-issue1574.txt"))
    assert (
        parsers.parse_secure_boot(
            fixture("os/mokutil-sb-state_disabled-setup-mode_system76-pr388.txt")
        )
        is False
    )
    assert parsers.parse_secure_boot(fixture("os/mokutil-sb-state_no-efi_local.txt")) is None
    with pytest.raises(ParseError, match="SecureBoot"):
        parsers.parse_secure_boot("mokutil: command not found\n")


def test_parsers_package_is_pure():
    modules = sorted(Path(parsers.__file__).parent.glob("*.py"))
    assert len(modules) > 1, modules
    imported = {
        name
        for module in modules
        for node in ast.walk(ast.parse(module.read_text()))
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    # Its own modules, and nothing outside the standard library's text and data tools.
    imported = {name.split(".")[0] for name in imported if not name.startswith("gpubox.parsers.")}
    allowed = {"__future__", "re", "json", "dataclasses", "typing", "collections"}
    assert imported <= allowed, imported


# --------------------------------------------------------------------------- gpu-burn


def test_gpu_burn_current_version_passes():
    result = parsers.parse_gpu_burn(fixture("gpu-burn/burn_1xRTX3060_fatbin_nixpkgs-pr524738.txt"))
    assert (result.tested, result.gpus, result.errors, result.gflops) == (
        1,
        {0: "OK"},
        [0],
        [9360.0],
    )
    assert (result.died, result.aborted, result.seconds, result.doubles) == (
        False,
        False,
        10,
        False,
    )
    assert result.compare_file is not None and result.compare_file.endswith("/compare.fatbin")
    assert result.progress_reports == 4 and result.init_errors == []
    assert result.ok(1) and result.problems(1) == []
    assert result.problems(2) == ["gpu-burn tested 1 GPUs, expected 2"]


def test_gpu_burn_two_gpus_unfinished_excerpt():
    text = fixture("gpu-burn/burn_2xRTX4090_gpu-burn-issue96_excerpt.txt")
    result = parsers.parse_gpu_burn(text)
    assert result.tested is None and result.gpus == {}
    assert (result.gflops, result.errors, result.progress_reports) == (
        [52045.0, 51946.0],
        [0, 0],
        5,
    )
    assert result.problems(2) == ["gpu-burn did not finish (no 'Tested N GPUs:' line)"]


def test_gpu_burn_faulty_exits_zero_but_is_not_ok():
    result = parsers.parse_gpu_burn(
        fixture("gpu-burn/burn_16xV100-SXM3_faulty_gpu-burn-issue12_excerpt.txt")
    )
    assert result.tested == 16 and set(result.gpus.values()) == {"FAULTY"}
    warned = [i for i, count in enumerate(result.errors) if count]
    assert warned == [1, 2, 3, 4, 9, 11, 14]  # the "(WARNING!)" GPUs, counts overflowed
    assert result.errors[1] == -524288000
    assert not result.died and not result.ok(16)
    assert result.problems(16)[0].startswith("FAULTY: GPU 0, GPU 1,")


def test_gpu_burn_died_and_aborted():
    result = parsers.parse_gpu_burn(fixture("gpu-burn/burn_1xT4_died_gpu-burn-issue53.txt"))
    assert (result.died, result.aborted, result.tested, result.seconds) == (True, True, None, 10)
    assert result.init_errors == ["Couldn't init a GPU test: Error:"]
    assert result.gflops == [0.0] and result.errors == [0]
    assert "gpu-burn aborted: no worker was alive" in result.problems(1)


def test_gpu_burn_ok_without_any_report_is_not_ok():
    result = parsers.parse_gpu_burn(
        fixture("gpu-burn/burn_1xA2000_no-report_gpu-burn-issue124.txt")
    )
    assert result.gpus == {0: "OK"} and result.tested == 1
    assert result.compare_file == "compare.ptx" and result.progress_reports == 0
    assert result.problems(1) == ["no GPU ever reported progress"]


def test_gpu_burn_raw_carriage_returns_and_interleaved_stderr():
    """As a pipe receives it: reports overwritten with "\\r" on one line, stderr's "read[i]
    error 0" (no newline) in the middle, tabs kept."""
    lines = fixture("gpu-burn/burn_2xRTX4090_gpu-burn-issue96_excerpt.txt").splitlines()
    reports = [ln for ln in lines if "proc'd" in ln]
    raw = "\r" + "\r".join(reports[:3]) + "read[1] error 0\r" + reports[3] + "\n\tSummary at: x\n"
    result = parsers.parse_gpu_burn(raw)
    assert result.progress_reports == 4 and result.gflops == [52371.0, 52472.0]
    died = reports[4].replace("324 (51946", "-1 (0").replace("0 - 0 ", "0 - 0  (DIED!)")
    assert parsers.parse_gpu_burn(raw + "\r" + died).died


@pytest.mark.parametrize(
    "text", ["", "GPU 0: Tesla T4 (UUID: GPU-1)\n", "Tested 2 GPUs:\n", "50.0%  proc'd: x\n"]
)
def test_gpu_burn_refuses_other_output(text):
    if text.startswith("Tested"):  # a verdict alone is gpu-burn output, just an unfinished one
        assert parsers.parse_gpu_burn(text).tested == 2
        return
    with pytest.raises(ParseError):
        parsers.parse_gpu_burn(text)


def test_gpu_burn_list():
    # No real `gpu_burn -l` transcript was found: the lines follow gpu_burn-drv.cpp's
    # printf("ID %i: %s, %ldMB\n", ...) with cuDeviceTotalMem / 1000 / 1000 (34089730048 bytes
    # for a V100-SXM2-32GB), after initCuda's stderr line.
    text = (
        "cuInit returned 0 (no error)\n"
        "ID 0: Tesla V100-SXM2-32GB, 34089MB\n"
        "ID 1: Tesla V100-SXM2-32GB, 34089MB\n"
    )
    devices = parsers.parse_gpu_burn_list(text)
    assert devices == [
        parsers.GpuBurnDevice(0, "Tesla V100-SXM2-32GB", 34089),
        parsers.GpuBurnDevice(1, "Tesla V100-SXM2-32GB", 34089),
    ]
    assert devices[1] == (1, "Tesla V100-SXM2-32GB", 34089)
    assert parsers.parse_gpu_burn_list("") == []
    with pytest.raises(ParseError, match="gpu_burn -l"):
        parsers.parse_gpu_burn_list(
            "cuInit returned 100 (no CUDA-capable device is detected)\n"
            "Couldn't init CUDA: Error (gpu_burn-drv.cpp:317): no CUDA-capable device is detected\n"
        )


# --------------------------------------------------------------------------- dcgmi


def test_dcgmi_errors():
    assert (
        parsers.parse_dcgmi_error(fixture("dcgmi/error_no-hostengine_dcgm-exporter-issue193.txt"))
        == "no_hostengine"
    )
    assert (
        parsers.parse_dcgmi_error(
            fixture("dcgmi/dmon-e1002_module-not-loaded_3.x_dcgm-issue50.txt")
        )
        == "module_not_loaded"
    )
    assert parsers.parse_dcgmi_error(fixture("dcgmi/discovery-l_8xH800_llm-action.txt")) is None


def test_dcgmi_discovery_8_gpus():
    gpus = parsers.parse_dcgmi_discovery(fixture("dcgmi/discovery-l_8xH800_llm-action.txt"))
    assert [g.id for g in gpus] == list(range(8))
    assert gpus[0] == parsers.DcgmGpu(
        0, "NVIDIA H800", "00000000:18:00.0", "GPU-34bf77d1-c686-6821-79a8-32d326c5039c"
    )
    assert gpus[7].bus_id == "00000000:E2:00.0"


def test_dcgmi_discovery_4x_layouts():
    text = fixture("dcgmi/discovery-l_8xH800_llm-action.txt")
    more = text + "0 ConnectX found.\n+----------+\n| ConnectX |\n+----------+\n+----------+\n"
    assert len(parsers.parse_dcgmi_discovery(more)) == 8
    active = text.replace("8 GPUs found.", "8 GPUs found (Active).")
    assert len(parsers.parse_dcgmi_discovery(active)) == 8


def test_dcgmi_discovery_refusals():
    text = fixture("dcgmi/discovery-l_8xH800_llm-action.txt")
    with pytest.raises(ParseError, match="8 GPUs found but the table lists 7"):
        parsers.parse_dcgmi_discovery(
            text.replace("8 GPUs found.", "8 GPUs found.", 1).replace(
                "| 7      | Name: NVIDIA H800", "|        | Name: NVIDIA H800"
            )
        )
    with pytest.raises(ParseError, match="no_hostengine"):
        parsers.parse_dcgmi_discovery(
            fixture("dcgmi/error_no-hostengine_dcgm-exporter-issue193.txt")
        )
    with pytest.raises(ParseError, match="GPUs found"):
        parsers.parse_dcgmi_discovery("nothing here\n")


def test_dcgmi_dmon_with_na_samples():
    sample = parsers.parse_dcgmi_dmon(
        fixture("dcgmi/dmon-i0-e1011,1012,1009,1010-c5_H800_llm-action.txt")
    )
    assert sample.columns == ["NVLTX", "NVLRX", "PCITX", "PCIRX"]
    assert len(sample.rows) == 5 and {r.entity for r in sample.rows} == {"GPU 0"}
    assert sample.rows[0].values == {"NVLTX": None, "NVLRX": None, "PCITX": None, "PCIRX": None}
    assert sample.latest == {
        "GPU 0": {"NVLTX": 0.0, "NVLRX": 0.0, "PCITX": 548740.0, "PCIRX": 1555.0}
    }


def test_dcgmi_dmon_refusals():
    with pytest.raises(ParseError, match="module_not_loaded"):
        parsers.parse_dcgmi_dmon(fixture("dcgmi/dmon-e1002_module-not-loaded_3.x_dcgm-issue50.txt"))
    text = fixture("dcgmi/dmon-i0-e1011,1012,1009,1010-c5_H800_llm-action.txt")
    with pytest.raises(ParseError, match="3 values for 4 fields"):
        parsers.parse_dcgmi_dmon(text + "GPU 1     0    0    0\n")
    with pytest.raises(ParseError, match="non-numeric"):
        parsers.parse_dcgmi_dmon(text + "GPU 1     0    0    0    busy\n")
    with pytest.raises(ParseError, match="header changed"):
        parsers.parse_dcgmi_dmon(text + "#Entity   NVLTX\n")
    with pytest.raises(ParseError, match="#Entity"):
        parsers.parse_dcgmi_dmon("GPU 0 1 2\n")


def test_dcgmi_diag_json_dcgm4_failure():
    diag = parsers.parse_dcgmi_diag_json(fixture("dcgmi/diag-r1-j_GB10_4.2.3_fail.json"))
    assert (diag.passed, diag.level, diag.version, diag.driver_version) == (
        False,
        1,
        "4.2.3",
        "580.82.09",
    )
    (test,) = diag.tests
    assert (test.name, test.category, test.status, test.results) == (
        "software",
        "Deployment",
        "Fail",
        {0: "Fail"},
    )
    assert test.messages[0].startswith("Persistence Mode: Persistence mode for GPU 0 is disabled.")
    assert test.info[0].startswith("Error getting the SRAM Threshold Count for GPU 0.")
    assert (
        parsers.parse_dcgmi_diag_json(fixture("dcgmi/diag-r1-j_GB10_4.2.3_fail.json"), 3).level == 3
    )


def test_dcgmi_diag_json_pass_and_runtime_error():
    passing = fixture("dcgmi/diag-r1-j_GB10_4.2.3_fail.json").replace('"Fail"', '"Pass"')
    assert parsers.parse_dcgmi_diag_json(passing).passed
    # the shape of HelperDisplayFailureMessage's JSON (DCGM 4.4.1 dcgmi/Diag.cpp)
    error = json.dumps({"DCGM Diagnostic": {"runtime_error": "Error: x", "version": "4.4.1"}})
    diag = parsers.parse_dcgmi_diag_json(error)
    assert (diag.passed, diag.tests, diag.runtime_error, diag.version) == (
        False,
        [],
        "Error: x",
        "4.4.1",
    )


def test_dcgmi_diag_json_refusals():
    with pytest.raises(ParseError, match="3.x"):
        parsers.parse_dcgmi_diag_json('{"DCGM GPU Diagnostic": {}}')
    with pytest.raises(ParseError, match="no_hostengine"):
        parsers.parse_dcgmi_diag_json(
            fixture("dcgmi/error_no-hostengine_dcgm-exporter-issue193.txt")
        )
    with pytest.raises(ParseError, match="not valid JSON"):
        parsers.parse_dcgmi_diag_json("{ nope")
    with pytest.raises(ParseError, match="no JSON"):
        parsers.parse_dcgmi_diag_json("Successfully ran diagnostic for group.\n")
