"""Kernel flavours, headers meta packages and `dkms status` per bootable kernel."""

from __future__ import annotations

import pytest

from gpubox import kernels


@pytest.mark.parametrize(
    "release, meta",
    [
        ("6.8.0-88-generic", "linux-headers-generic"),
        ("6.8.0-1012-aws", "linux-headers-aws"),
        ("6.8.0-45-lowlatency", "linux-headers-lowlatency"),
        ("6.1.0-26-amd64", "linux-headers-amd64"),
        ("6.1.0-26-cloud-amd64", "linux-headers-cloud-amd64"),
        ("6.1.0-26-rt-amd64", "linux-headers-rt-amd64"),
        ("6.18.44-fc-v857", None),  # not a distribution kernel: no meta to follow
    ],
)
def test_headers_meta_follows_the_running_kernels_flavour(release: str, meta: str | None) -> None:
    packages = kernels.headers_packages(release)
    assert packages[0] == f"linux-headers-{release}"
    assert packages[1:] == ([meta] if meta else [])


# dkms 3.0.10 (Debian 12) and 3.0.11 (Ubuntu 24.04) print "module/version, kernel, arch: state"
DKMS = """\
nvidia-current/570.211.01, 6.1.0-26-amd64, x86_64: installed
nvidia-current/570.211.01, 6.1.0-28-amd64, x86_64: built
nvidia/535.216.03, 6.1.0-28-amd64, x86_64: installed (WARNING! Diff between built and installed)
virtualbox/7.0.20, 6.1.0-28-amd64, x86_64: installed
"""


def state(*lines: str) -> kernels.KernelState:
    return kernels.parse_kernel_state(list(lines))


def test_every_bootable_kernel_needs_the_module_at_the_driver_version() -> None:
    s = state(
        "R 6.1.0-26-amd64",
        "K 6.1.0-26-amd64",
        "K 6.1.0-28-amd64",
        "H 6.1.0-26-amd64",
        "DKMS",
        *("D " + line for line in DKMS.splitlines()),
    )
    assert s.kernels == ["6.1.0-26-amd64", "6.1.0-28-amd64"]
    assert s.with_headers == {"6.1.0-26-amd64"}
    # built but not installed, and another driver's module, do not count
    assert kernels.kernels_lacking_module(s, "570.211.01") == ["6.1.0-28-amd64"]
    assert kernels.kernels_lacking_module(s, "535.216.03") == ["6.1.0-26-amd64"]


def test_the_running_kernel_counts_without_a_vmlinuz_and_no_dkms_is_told_apart() -> None:
    s = state("R 6.18.44-fc-v857")
    assert s.dkms is None
    assert kernels.kernels_lacking_module(s, "570.211.01") == ["6.18.44-fc-v857"]
    s = state(
        "R 6.18.44-fc-v857", "DKMS", "D nvidia/570.211.01, 6.18.44-fc-v857, x86_64: installed"
    )
    assert kernels.kernels_lacking_module(s, "570.211.01") == []


def test_older_dkms_comma_format() -> None:
    (entry,) = kernels.parse_dkms_status("nvidia, 570.211.01, 6.8.0-88-generic, x86_64: installed")
    assert (entry.module, entry.version, entry.kernel, entry.status) == (
        "nvidia",
        "570.211.01",
        "6.8.0-88-generic",
        "installed",
    )


def test_repair_builds_where_headers_are_and_installs_headers_elsewhere() -> None:
    command = kernels.repair_command(["6.1.0-28-amd64"])
    assert "[ -e /lib/modules/6.1.0-28-amd64/build ]" in command
    assert "dkms autoinstall -k 6.1.0-28-amd64" in command
    assert "linux-headers-6.1.0-28-amd64" in command
