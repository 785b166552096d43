"""The Hostname label rule of the pinned dcgm-exporter (gpubox.knowledge.exporter_label).

The cases of GetHostname are those of NVIDIA/dcgm-exporter's own
internal/pkg/hostname/hostname_test.go at tag 4.4.1-4.6.0 (the catalog's image), plus gpubox's
(the box's name through --remote-hostengine-info); SplitHostPort's are Go's documented forms
(src/net/ipsock.go)."""

from __future__ import annotations

import re

import pytest

from gpubox.knowledge.exporter_label import exporter_hostname, hostname_labels, split_host_port


@pytest.mark.parametrize(
    ("remote", "kubernetes", "node_name", "want"),
    [
        # hostname_test.go: UseRemoteHE false -> os.Hostname(), or NODE_NAME when set
        (None, False, "", "test-hostname"),
        (None, False, "node-7", "node-7"),
        # UseRemoteHE true -> the host part, whatever NODE_NAME says
        ("example.com:5555", False, "node-7", "example.com"),
        ("127.0.0.1", False, "", "127.0.0.1"),  # no port: the value as it is
        ("localhost:5555", False, "", "localhost"),
        # --kubernetes wins over remote mode: the local hostname
        ("localhost", True, "", "test-hostname"),
        # gpubox's unit before and after the fix
        ("127.0.0.1:5555", False, "gpu-07", "127.0.0.1"),
        ("gpu-07:5555", False, "", "gpu-07"),
        ("[::1]:5555", False, "", "::1"),
    ],
)
def test_the_label_is_the_pinned_rule(remote, kubernetes, node_name, want):
    got = exporter_hostname(
        remote, kubernetes=kubernetes, node_name=node_name, local_hostname="test-hostname"
    )
    assert got == want


@pytest.mark.parametrize(
    ("hostport", "want"),
    [
        ("gpu-07:5555", ("gpu-07", "5555")),
        ("[::1]:5555", ("::1", "5555")),
        ("[fe80::1%eth0]:80", ("fe80::1%eth0", "80")),
        ("host:", ("host", "")),
        (":9400", ("", "9400")),
    ],
)
def test_split_host_port_as_go(hostport, want):
    assert split_host_port(hostport) == want


@pytest.mark.parametrize(
    ("hostport", "why"),
    [
        ("gpu-07", "missing port"),
        ("::1:5555", "too many colons"),
        ("[::1]", "missing port"),
        ("[::1]x:5", "missing port"),
        ("[::1]:5:6", "too many colons"),
        ("[::1:5555", "missing ']'"),
        ("a]:5", "unexpected ']'"),
        ("a[b:5", "unexpected '['"),
    ],
)
def test_split_host_port_refuses_what_go_refuses(hostport, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        split_host_port(hostport)


def test_the_labels_are_read_from_gpu_and_nvlink_samples():
    # the GPU format (Hostname=) as issue NVIDIA/dcgm-exporter#250 shows it; the per-link
    # NVLink format (hostname=) as render_metrics.go at the pinned tag writes it
    metrics = (
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a6158b59-2c1e-1e63-0068-9178c4298abd",'
        'device="nvidia0",modelName="Tesla V100-SXM2-32GB",Hostname="r6i3n0"} 0\n'
        'DCGM_FI_DEV_NVLINK_TX{nvlink="0",gpu="0",hostname="r6i3n0",container=""} 0\n'
        'DCGM_FI_DEV_XID_ERRORS{gpu="1",modelName="x",err_msg="Hostname=\\"a\\""} 0\n'
    )
    assert hostname_labels(metrics) == ["r6i3n0", "r6i3n0"]
    assert hostname_labels("# HELP x\nup 1\n") == []
