"""DCGM: the host engine runs on localhost only and answers for every GPU."""

from __future__ import annotations

import re

import pytest

from gpubox import parsers

NVLINK_FIELDS = "449,1011,1012"


@pytest.mark.quick
def test_dcgm_packages_pinned_and_held(box):
    dcgm = box.config.catalog["dcgm"]
    box.assert_pinned_and_held("DCGM packages", dcgm["packages"], dcgm["version"])


@pytest.mark.quick
def test_nvidia_dcgm_is_active(box):
    box.assert_service_up("nvidia-dcgm")


@pytest.mark.quick
def test_the_host_engine_listens_on_localhost_only(box):
    listening = box.out("ss -H -ltnp")
    addresses = [line.split()[3] for line in listening.splitlines() if "nv-hostengine" in line]
    assert addresses, f"{box.name}: nv-hostengine listens on no TCP port"
    exposed = [a for a in addresses if not re.match(r"^(127\.\d+\.\d+\.\d+|\[::1\]):\d+$", a)]
    assert not exposed, f"{box.name}: nv-hostengine listens beyond localhost: {exposed}"


@pytest.mark.gpu
def test_dcgmi_discovers_every_gpu(box):
    gpus = parsers.parse_dcgmi_discovery(box.out("dcgmi discovery -l"))
    assert len(gpus) == box.config.gpu_count, (
        f"{box.name}: dcgmi discovery lists {len(gpus)} GPU(s), expected {box.config.gpu_count}"
    )


@pytest.mark.gpu
def test_dcgmi_dmon_reports_nvlink_fields_for_every_gpu(box):
    # The profiling fields (1011/1012) read N/A in the first samples after a start: take three.
    result = box.run(f"dcgmi dmon -e {NVLINK_FIELDS} -c 3")
    assert result.rc == 0, (
        f"{box.name}: dcgmi dmon failed: {(result.stdout + result.stderr)[-400:]}"
    )
    latest = parsers.parse_dcgmi_dmon(result.stdout).latest
    missing = [
        f"{entity} {column}"
        for entity, values in latest.items()
        for column, value in values.items()
        if value is None
    ]
    assert len(latest) == box.config.gpu_count and not missing, (
        f"{box.name}: dcgmi dmon -e {NVLINK_FIELDS}: {len(latest)} GPU(s); "
        f"no value for {missing} (1011/1012 need datacenter-gpu-manager-4-proprietary)"
    )


@pytest.mark.gpu
def test_dcgm_exporter_serves_gpu_and_nvlink_metrics(box):
    if not box.config.dcgm_exporter:
        pytest.skip("dcgm_exporter is off in the inventory")
    address = box.config.dcgm_exporter_address
    url = (
        f"http://{'127.0.0.1' if address in ('0.0.0.0', '') else address}:"
        f"{box.config.dcgm_exporter_port}/metrics"
    )
    metrics = box.out(f"curl -fsS --max-time 10 {url}")
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"):
        assert name in metrics, f"{box.name}: {url} has no {name}"
