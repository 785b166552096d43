"""The driver stage's preflight on a box that runs Ubuntu's own driver: what installing the
pinned driver removes is logged before the stage adds any operation, from apt's simulation
(facts: the installed driver builds, and the recorded real `apt-get -s` output); a fresh box
runs no simulation at all."""

from __future__ import annotations

import logging
from pathlib import Path

from conftest import REFERENCE, fake_host, fresh_box

from gpubox.preflight import driver_replacement
from gpubox.stages import driver as driver_stage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "apt"
RECORDED = (FIXTURES / "apt-get-s_install-pinned-570_over-ubuntu-580-desktop.txt").read_text()
UBUNTU_580 = "580.178.04-0ubuntu0.24.04.1"
# Ubuntu 24.04 Desktop after Additional Drivers installed nvidia-driver-580: dpkg-query's
# columns (status, package, version, source) for its driver build, as dpkg prints them.
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
    "nvidia-firmware-580-580.178.04",
    "nvidia-kernel-common-580",
    "nvidia-kernel-source-580",
    "nvidia-utils-580",
    "xserver-xorg-video-nvidia-580",
]
DPKG_580 = [f"ii \t{n}\t{UBUNTU_580}\tnvidia-graphics-drivers-580" for n in BUILD_580]
INSTALLED = "source:Package"  # a substring of driver_replacement.INSTALLED_COMMAND
SIMULATION = "gpubox-driver-replacement"  # driver_replacement.MARK


class _Recorder(logging.Handler):
    """Each warning with the number of operations the run had when it was logged."""

    def __init__(self, state) -> None:
        super().__init__(logging.WARNING)
        self.state = state
        self.seen: list[tuple[str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.getMessage(), len(self.state.get_op_order())))


def run_stage(answers: dict[object, object]) -> tuple[list[tuple[str, int]], list[str], list[str]]:
    """(warnings with the op count at each, the commands run, the stage's operations' names)."""
    assert INSTALLED in driver_replacement.INSTALLED_COMMAND
    with fake_host(REFERENCE, answers) as fake:
        recorder = _Recorder(fake.state)
        logger = logging.getLogger("pyinfra")
        logger.addHandler(recorder)
        try:
            driver_stage.driver()
        finally:
            logger.removeHandler(recorder)
        names = [", ".join(sorted(fake.state.op_meta[h].names)) for h in fake.state.get_op_order()]
        return recorder.seen, fake.host.connector.executed_commands, names


def test_a_desktop_running_ubuntus_580_is_told_what_goes_before_any_operation():
    answers = fresh_box("ubuntu2404", **{INSTALLED: DPKG_580, SIMULATION: RECORDED.splitlines()})
    seen, commands, ops = run_stage(answers)
    lines = [(m, n) for m, n in seen if m.startswith("preflight: ")]
    expected = [
        "preflight: @fake/box: the driver moves from 580.178.04 (580.178.04-0ubuntu0.24.04.1) to "
        "570.211.01 (570.211.01-0ubuntu1)",
        "preflight: @fake/box: installing the pinned driver removes 15 packages of the driver "
        "installed now:",
        f"preflight:   nvidia-graphics-drivers-580 {UBUNTU_580}: "
        + ", ".join(n for n in BUILD_580 if not n.startswith("nvidia-firmware-")),
        "preflight: @fake/box: the deploy removes them only because installing the pinned "
        "driver must (its packages conflict with them; apt's own simulation, nothing has "
        "changed yet); nothing beyond this list is removed",
        "preflight: @fake/box: first, before anything is removed, driver 580.178.04's installed "
        "packages are kept in /var/lib/gpubox/driver-kept/580.178.04 (from apt's cache, or "
        "downloaded while the repository offers them; with their sha256): a way back needs no "
        "repository",
        "preflight: @fake/box: a reboot follows the install, to load driver 570.211.01: the "
        "deploy reboots the box once",
    ]
    assert [m for m, _ in lines] == expected
    # before the stage's first change: only preflight's wait for dpkg's lock comes earlier
    assert {n for _, n in lines} == {1}
    assert ops[0].endswith("apt-get waits up to 900 s for dpkg's lock")
    assert len(ops) > 1
    (simulation,) = [c for c in commands if SIMULATION in c]
    # the product's script: gpubox's pin, NVIDIA's repository and the pinned roots
    assert "Pin: version 570.211.01-0ubuntu1" in simulation
    assert "[trusted=yes] https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/" in (
        simulation
    )
    assert "nvidia-dkms-570=570.211.01-0ubuntu1" in simulation


def test_a_failed_simulation_is_a_warning_naming_why_and_the_deploy_goes_on():
    answers = fresh_box(
        "ubuntu2404",
        **{
            INSTALLED: DPKG_580,
            SIMULATION: ["E: no index of NVIDIA's repository in /var/cache/gpubox/x/lists"],
        },
    )
    seen, _, ops = run_stage(answers)
    (line,) = [m for m, _ in seen if "apt's simulation failed" in m]
    assert "apt's simulation failed: no index of NVIDIA's repository" in line
    assert len(ops) > 1 and any("Install NVIDIA driver" in n for n in ops)  # not refused


def test_a_fresh_box_runs_no_simulation():
    seen, commands, _ = run_stage(fresh_box("ubuntu2404"))
    assert any(INSTALLED in c for c in commands)  # the one cheap dpkg-query
    assert not any(SIMULATION in c for c in commands)
    assert not [m for m, _ in seen if "installing the pinned driver" in m]


def test_a_converged_box_runs_no_simulation():
    pinned = "570.211.01-0ubuntu1"
    dpkg = [
        f"ii \t{n}\t{pinned}\tnvidia-graphics-drivers-570"
        for n in ("nvidia-dkms-570", "nvidia-utils-570", "libnvidia-compute-570")
    ]
    _, commands, _ = run_stage(fresh_box("ubuntu2404", **{INSTALLED: dpkg}))
    assert not any(SIMULATION in c for c in commands)
