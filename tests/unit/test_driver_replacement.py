"""gpubox.preflight.driver_replacement: apt's simulation parsed, when it runs, what preflight
prints, and
the simulation's script (read-only for the host's apt). apt's own answer to the script is
tests/resolver/test_desktop_driver.py."""

from __future__ import annotations

import shlex
from pathlib import Path

from gpubox.preflight import driver_replacement as dr

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "apt"
# apt 2.6.2's real `apt-get -s install` over Ubuntu's 580 desktop stack (tests/fixtures/SOURCES.md)
RECORDED = (FIXTURES / "apt-get-s_install-pinned-570_over-ubuntu-580-desktop.txt").read_text()
UBUNTU_580 = "580.178.04-0ubuntu0.24.04.1"
BUILD_580 = [
    "libnvidia-cfg1-580",
    "libnvidia-common-580",
    "libnvidia-compute-580",
    "libnvidia-decode-580",
    "libnvidia-encode-580",
    "libnvidia-extra-580",
    "libnvidia-fbc1-580",
    "libnvidia-gl-580",
    "nvidia-compute-utils-580",
    "nvidia-dkms-580",
    "nvidia-driver-580",
    "nvidia-kernel-common-580",
    "nvidia-kernel-source-580",
    "nvidia-utils-580",
    "xserver-xorg-video-nvidia-580",
]


def test_the_recorded_simulation_lists_every_removal_with_its_version():
    sim = dr.parse_simulation(RECORDED.splitlines())
    assert sim.error is None
    assert sorted(sim.removed) == sorted((n, UBUNTU_580) for n in BUILD_580)
    # "Remv libnvidia-compute-580 [version] [libnvidia-decode-580:amd64 ]": the version only
    assert ("libnvidia-compute-580", UBUNTU_580) in sim.removed
    assert ("nvidia-dkms-570", "570.211.01-0ubuntu1") in sim.installed
    assert len(sim.installed) == 8
    # the summary's package lists are not actions
    assert not any(name == "nvidia-driver-570" for name, _ in sim.installed)


def test_apts_error_lines_are_the_error():
    lines = [
        "Reading package lists...",
        "E: Version '570.211.01-0ubuntu1' for 'nvidia-dkms-570' was not found",
        "E: apt-get -s exited with status 100",
    ]
    sim = dr.parse_simulation(lines)
    assert sim.removed == [] and sim.installed == []
    assert sim.error == (
        "Version '570.211.01-0ubuntu1' for 'nvidia-dkms-570' was not found "
        "apt-get -s exited with status 100"
    )


def test_an_upgrade_line_keeps_the_new_version():
    sim = dr.parse_simulation(
        ["Inst nvidia-utils-570 [570.195.03-0ubuntu1] (570.211.01-0ubuntu1 NVIDIA:/ [amd64])"]
    )
    assert sim.installed == [("nvidia-utils-570", "570.211.01-0ubuntu1")]


INSTALLED = {
    **{n: (UBUNTU_580, "nvidia-graphics-drivers-580") for n in BUILD_580},
    "nvidia-firmware-580-580.178.04": (UBUNTU_580, "nvidia-graphics-drivers-580"),
}


def test_ubuntus_driver_is_a_distribution_driver():
    assert dr.installed_distro_driver(INSTALLED, "570.211.01-0ubuntu1") == sorted(BUILD_580)


def test_nvidias_build_at_the_pinned_version_is_not():
    pinned = "570.211.01-0ubuntu1"
    converged = {
        "nvidia-dkms-570": (pinned, "nvidia-graphics-drivers-570"),
        "nvidia-utils-570": (pinned, "nvidia-graphics-drivers-570"),
        # a replaced build's firmware, left for autoremove: no simulation for it
        "nvidia-firmware-580-580.178.04": (UBUNTU_580, "nvidia-graphics-drivers-580"),
    }
    assert dr.installed_distro_driver(converged, pinned) == []
    assert dr.installed_distro_driver({}, pinned) == []


def test_the_installed_fact_reads_dpkg_querys_columns():
    lines = [
        "ii \tnvidia-driver-580\t580.178.04-0ubuntu0.24.04.1\tnvidia-graphics-drivers-580",
        "ii \tlinux-modules-nvidia-580-generic\t6.8.0-90.91\tlinux-restricted-modules",
        "garbage",
    ]
    assert dr.parse_installed(lines) == {
        "nvidia-driver-580": (UBUNTU_580, "nvidia-graphics-drivers-580"),
        "linux-modules-nvidia-580-generic": ("6.8.0-90.91", "linux-restricted-modules"),
    }
    # only installed packages of a driver source
    assert (
        "$1 ~ /^.i/" in dr.INSTALLED_COMMAND and "nvidia-graphics-drivers" in dr.INSTALLED_COMMAND
    )


def test_the_report_groups_the_build_and_says_why():
    sim = dr.parse_simulation(RECORDED.splitlines())
    lines = dr.report("desk", sim, INSTALLED)
    assert lines[0] == (
        "desk: installing the pinned driver removes 15 packages of the driver installed now:"
    )
    assert lines[1] == f"  nvidia-graphics-drivers-580 {UBUNTU_580}: " + ", ".join(BUILD_580)
    assert lines[-1].startswith("desk: the deploy removes them only because installing the")
    assert "nothing has changed yet" in lines[-1]
    assert len(lines) == 3


def test_the_report_names_a_package_of_no_known_build_with_its_version():
    sim = dr.Simulation(removed=[("nvidia-settings", "510.47.03-0ubuntu4")])
    lines = dr.report("desk", sim, {})
    assert "  not a driver build: nvidia-settings 510.47.03-0ubuntu4" in lines


def test_nothing_removed_prints_nothing_and_a_failure_names_its_cause():
    assert dr.report("desk", dr.Simulation()) == []
    (line,) = dr.report("desk", dr.Simulation(error="no index of NVIDIA's repository"))
    assert "apt's simulation failed: no index of NVIDIA's repository" in line
    assert "the deploy goes on" in line


def test_the_script_writes_only_its_private_root():
    script = dr.simulate_command(
        "deb [signed-by=/usr/share/keyrings/k.gpg] https://example.org/repo/ /\n",
        "Package: x\nPin: version 1\nPin-Priority: 1001\n",
        ["nvidia-dkms-570=570.211.01-0ubuntu1"],
        "/var/cache/gpubox/apt-query",
        skip_source="/etc/apt/sources.list.d/gpubox-nvidia-cuda.list",
    )
    assert script.startswith(dr.MARK)
    words = shlex.split(script.replace("\n", " ; "))
    options = [w for w in words if "::" in w]
    assert "Dir::State::status=/var/lib/dpkg/status" in options
    assert "Dir::Etc::preferences=/dev/null" in options
    for option in options:
        name, _, value = option.partition("=")
        if name.startswith(("Dir::Etc::source", "Dir::Etc::preferencesparts", "Dir::State::L")):
            assert value.startswith("/var/cache/gpubox/apt-query/driver-replacement/"), option
    assert "[trusted=yes] https://example.org/repo/ /" in script
    assert "signed-by" not in script.split("printf")[1]
    assert " -s " in script and "apt-get update" not in script
    assert "nvidia-dkms-570=570.211.01-0ubuntu1" in script
    # the host's lists are linked or copied from, never written
    assert 'ln -f "$f" "$d/lists/"' in script
