"""Kernel flavours, headers meta packages and `dkms status` per bootable kernel."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpubox.base import kernels

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


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


# The headers meta follows the series the box boots: the installed image metas (Ubuntu's
# linux-meta / linux-meta-hwe-*, Debian's linux-signed-amd64 metas) and their versions.
# dpkg-query's format: tests/fixtures/apt/dpkg-query_debian12_local.txt and
# tests/fixtures/apt/dpkg-query-linux_debian12_local.txt ("un " for names dpkg only knows of).

HWE = kernels.KernelMeta("linux-image-generic-hwe-24.04", "6.14.0-36.36~24.04.1")
GA = kernels.KernelMeta("linux-image-generic", "6.8.0-88.89")


@pytest.mark.parametrize(
    "package, version, flavour, series, headers",
    [
        ("linux-image-generic", "6.8.0-88.89", "generic", "6.8", "linux-headers-generic"),
        (
            "linux-image-generic-hwe-24.04",
            "6.17.0-35.35~24.04.1",  # packages.ubuntu.com/noble/linux-generic-hwe-24.04
            "generic",
            "6.17",
            "linux-headers-generic-hwe-24.04",
        ),
        # the versions below are of the shape the linux-meta sources give (X.Y.Z-ABI.N[~24.04.1]);
        # only the series (X.Y) is read from them
        ("linux-image-oem-24.04", "6.11.0-1017.17", "oem", "6.11", "linux-headers-oem-24.04"),
        ("linux-image-oem-24.04b", "6.11.0-1017.17", "oem", "6.11", "linux-headers-oem-24.04b"),
        (
            "linux-image-lowlatency",
            "6.8.0-45.45.1",
            "lowlatency",
            "6.8",
            "linux-headers-lowlatency",
        ),
        (
            "linux-image-lowlatency-hwe-24.04",
            "6.11.0-1007.7~24.04.1",
            "lowlatency",
            "6.11",
            "linux-headers-lowlatency-hwe-24.04",
        ),
        (
            "linux-image-generic-6.14",
            "6.14.0-36.36~24.04.1",
            "generic",
            "6.14",
            "linux-headers-generic-6.14",
        ),
        ("linux-image-virtual", "6.8.0-88.89", "generic", "6.8", "linux-headers-virtual"),
        ("linux-image-amd64", "6.1.158-1", "amd64", "6.1", "linux-headers-amd64"),
        ("linux-image-cloud-amd64", "6.1.158-1", "cloud-amd64", "6.1", "linux-headers-cloud-amd64"),
        ("linux-image-rt-amd64", "6.1.158-1", "rt-amd64", "6.1", "linux-headers-rt-amd64"),
        ("linux-image-amd64", "6.12.48-1~bpo12+1", "amd64", "6.12", "linux-headers-amd64"),
    ],
)
def test_an_image_meta_names_its_flavour_series_and_headers_meta(
    package: str, version: str, flavour: str, series: str, headers: str
) -> None:
    meta = kernels.KernelMeta(package, version)
    assert (meta.flavour, meta.series, meta.headers) == (flavour, series, headers)


def test_metas_are_told_from_kernels_by_the_release_in_their_name() -> None:
    text = "\n".join(
        [
            "linux-image-6.14.0-36-generic\t6.14.0-36.36~24.04.1\tii ",
            "linux-image-unsigned-6.14.0-36-generic\t6.14.0-36.36~24.04.1\tii ",
            "linux-image-6.12.38+deb13-amd64\t6.12.38-1\tii ",
            "linux-image-generic-hwe-24.04\t6.14.0-36.36~24.04.1\tii ",
            "linux-image-generic\t6.8.0-88.89\trc ",  # removed: not installed
            "linux-image-virtual\t\tun ",  # only known to dpkg
            "linux-image-amd64-dbg\t6.1.158-1\tii ",
        ]
    )
    assert kernels.parse_kernel_metas(text) == [HWE]


def test_the_local_dpkg_query_output_without_any_image_reads_as_no_meta() -> None:
    text = (FIXTURES / "apt" / "dpkg-query-linux_debian12_local.txt").read_text()
    assert kernels.parse_kernel_metas(text) == []


@pytest.mark.parametrize(
    "release, flavour, series",
    [
        ("6.12.38+deb13-amd64", "amd64", "6.12"),  # Debian 13
        ("6.12.12+bpo-amd64", "amd64", "6.12"),  # bookworm-backports
        ("6.14.0-36-generic", "generic", "6.14"),
    ],
)
def test_release_flavour_and_series(release: str, flavour: str, series: str) -> None:
    assert (kernels.flavour(release), kernels.series(release)) == (flavour, series)


def test_hwe_desktop_headers_follow_hwe_never_ga() -> None:
    booted = ["6.14.0-35-generic", "6.14.0-36-generic"]
    assert kernels.headers_packages("6.14.0-36-generic", booted, [HWE]) == [
        "linux-headers-6.14.0-36-generic",
        "linux-headers-generic-hwe-24.04",
    ]
    # GA and HWE metas, only HWE kernels boot: only the HWE headers meta
    assert kernels.headers_packages("6.14.0-36-generic", booted, [GA, HWE]) == [
        "linux-headers-6.14.0-36-generic",
        "linux-headers-generic-hwe-24.04",
    ]
    # a GA kernel in /boot as well: both series are followed
    both = kernels.headers_packages("6.14.0-36-generic", [*booted, "6.8.0-88-generic"], [GA, HWE])
    assert both[1:] == ["linux-headers-generic", "linux-headers-generic-hwe-24.04"]


def test_without_an_image_meta_the_running_flavour_decides_as_before() -> None:
    assert kernels.headers_packages("6.8.0-88-generic", [], []) == [
        "linux-headers-6.8.0-88-generic",
        "linux-headers-generic",
    ]
    assert kernels.headers_packages("6.1.0-26-amd64") == [
        "linux-headers-6.1.0-26-amd64",
        "linux-headers-amd64",
    ]


def test_a_meta_of_a_series_nothing_boots_gets_no_headers() -> None:
    # the GA meta alone on a box booting a custom kernel: its 6.8 series boots nowhere
    assert kernels.headers_packages("6.18.44-fc-v857", ["6.18.44-fc-v857"], [GA]) == [
        "linux-headers-6.18.44-fc-v857"
    ]
    # Debian: linux-image-amd64 follows 6.1; a cloud kernel boots: no linux-headers-amd64
    amd64 = kernels.KernelMeta("linux-image-amd64", "6.1.158-1")
    cloud = kernels.KernelMeta("linux-image-cloud-amd64", "6.1.158-1")
    assert kernels.headers_packages("6.1.0-40-cloud-amd64", [], [amd64, cloud]) == [
        "linux-headers-6.1.0-40-cloud-amd64",
        "linux-headers-cloud-amd64",
    ]


def test_dkms_installed_is_read_from_its_tree_as_dkms_status_decides(tmp_path: Path) -> None:
    """dkms 3.x's _is_module_installed: the kernel-K-A link resolves to VERSION/K/A, whose
    module/ holds the built module; a build without the link is "built", not installed."""
    import subprocess

    tree = tmp_path / "dkms"

    def build(module: str, version: str, kernel: str, ko: str | None = "nvidia.ko") -> Path:
        d = tree / module / version / kernel / "x86_64" / "module"
        d.mkdir(parents=True)
        if ko:
            (d / ko).write_text("")
        return d.parent

    installed = build("nvidia-current", "570.211.01", "6.1.0-28-amd64")
    (tree / "nvidia-current" / "kernel-6.1.0-28-amd64-x86_64").symlink_to(
        installed.relative_to(tree / "nvidia-current")
    )
    build("nvidia-current", "570.211.01", "6.1.0-30-amd64")  # built, never installed
    zst = build("nvidia", "570.211.01", "6.8.0-88-generic", "nvidia.ko.zst")
    (tree / "nvidia" / "kernel-6.8.0-88-generic-x86_64").symlink_to(zst)
    empty = build("nvidia", "570.211.01", "6.8.0-90-generic", None)  # the build failed
    (tree / "nvidia" / "kernel-6.8.0-90-generic-x86_64").symlink_to(empty)
    (tree / "nvidia" / "kernel-6.8.0-91-generic-x86_64").symlink_to(tree / "gone")

    out = subprocess.run(
        ["sh", "-c", kernels.dkms_installed_command(str(tree))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert sorted(out.splitlines()) == [
        "D nvidia-current/570.211.01, 6.1.0-28-amd64, x86_64: installed",
        "D nvidia/570.211.01, 6.8.0-88-generic, x86_64: installed",
    ]
    state = kernels.parse_kernel_state(["R 6.8.0-88-generic", "DKMS", *out.splitlines()])
    assert kernels.kernels_lacking_module(state, "570.211.01") == []
    assert {e.kernel for e in state.dkms or []} == {"6.1.0-28-amd64", "6.8.0-88-generic"}


# Issue 29 D12: the running kernel's headers, asked of the box's apt first.


def test_the_headers_query_reads_apts_candidates_and_a_dropped_package_as_absent() -> None:
    recorded = (FIXTURES / "apt/apt-cache-policy_linux-headers_debian12_local.txt").read_text()
    assert kernels.parse_headers_query("## lists\n" + recorded) == {
        "linux-headers-6.1.0-57-amd64": "6.1.192-3",
        "linux-headers-amd64": "6.1.192-3",
    }  # linux-headers-6.1.0-26-amd64, asked too, printed nothing: gone from the index
    assert kernels.parse_headers_query("## lists\n") == {}
    assert kernels.parse_headers_query(recorded) is None  # no lists: apt knows nothing yet
    assert kernels.parse_headers_query("## lists\nGarbage line\n") is None
    # the command on this machine, with the real apt-cache: a package no archive has
    out = subprocess.run(
        ["sh", "-c", kernels.headers_query_command("linux-headers-0.0.0-gpubox-none")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    assert kernels.parse_headers_query(out.stdout) in ({}, None)


def test_a_running_kernel_with_its_own_headers_tree_is_built_against_it() -> None:
    """The sandbox's case: a kernel built elsewhere, headers in /lib/modules/K/build, no
    package anywhere."""
    s = state("R 6.18.44-fc-v1147", "H 6.18.44-fc-v1147", "DKMS")
    plan = kernels.headers_plan("6.18.44-fc-v1147", s, [], "570.211.01", True, {})
    assert plan.packages == [] and plan.repair == ["6.18.44-fc-v1147"]
    assert plan.warning == (
        "kernel headers: linux-headers-6.18.44-fc-v1147 is in none of the box's apt "
        "repositories; skipped: DKMS builds the NVIDIA module for 6.18.44-fc-v1147 against "
        "/lib/modules/6.18.44-fc-v1147/build, which is there"
    )
    assert kernels.headers_question("6.18.44-fc-v1147", s, "570.211.01", False) is None
    assert kernels.headers_question("6.18.44-fc-v1147", s, "570.211.01", True) == (
        "linux-headers-6.18.44-fc-v1147"
    )


def test_offered_or_unknown_headers_plan_as_before() -> None:
    s = state("R 6.8.0-88-generic")
    for offers in (None, {"linux-headers-6.8.0-88-generic": "6.8.0-88.89"}):
        plan = kernels.headers_plan("6.8.0-88-generic", s, [], "570.211.01", True, offers)
        assert plan.packages == ["linux-headers-6.8.0-88-generic", "linux-headers-generic"]
        assert plan.repair == ["6.8.0-88-generic"] and plan.warning is None
    # the repair asks for the running kernel's headers when it has no tree: asked then too
    assert kernels.headers_question("6.8.0-88-generic", s, "570.211.01", False) == (
        "linux-headers-6.8.0-88-generic"
    )
