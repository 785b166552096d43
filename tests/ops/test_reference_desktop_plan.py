"""The reference desktop as a whole: Ubuntu 24.04 Desktop on the HWE kernel, Secure Boot on
with DKMS's key enrolled, gdm and a logged-in wayland session, the GT 710 on nouveau, Ubuntu's
nvidia-driver-580 from Additional Drivers, 2x V100. What the deploy says before its first
change, and what it then plans (the facts are the other plan tests': test_desktop_plan,
test_driver_replacement_plan, test_secure_boot_plan)."""

from __future__ import annotations

import logging

from conftest import REFERENCE, fake_host, headers_answer, headers_query, make_plan
from test_desktop_plan import hwe_desktop
from test_driver_replacement_plan import DPKG_580, INSTALLED, RECORDED, SIMULATION
from test_secure_boot_plan import MOK, ubuntu_state

from gpubox.preflight import dpkg_ready
from gpubox.stages import driver as driver_stage
from gpubox.stages import run_stages


def reference_desktop(**overrides: object) -> dict[object, object]:
    return hwe_desktop(
        **{
            "mokutil --sb-state": "SecureBoot enabled",
            MOK: ubuntu_state("is already enrolled"),
            INSTALLED: DPKG_580,
            SIMULATION: RECORDED.splitlines(),
            **overrides,
        }
    )


def said_before_the_first_change(
    answers: dict[object, object] | None = None,
) -> tuple[list[str], list[str]]:
    """(the warnings logged before the driver stage's first operation of its own, the names
    of every operation planned)."""
    lines: list[str] = []
    with fake_host(REFERENCE, answers or reference_desktop()) as fake:

        class Before(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                names = [" ".join(fake.state.op_meta[h].names) for h in fake.state.get_op_order()]
                if all(dpkg_ready.CONF_FILE in n or "DPkg" in n or "dpkg" in n for n in names):
                    lines.append(record.getMessage())

        handler = Before(logging.WARNING)
        logging.getLogger("pyinfra").addHandler(handler)
        try:
            run_stages(driver_stage.driver)
        finally:
            logging.getLogger("pyinfra").removeHandler(handler)
        names = [", ".join(sorted(fake.state.op_meta[h].names)) for h in fake.state.get_op_order()]
    return lines, names


def test_the_reference_desktop_hears_everything_before_the_first_change():
    lines, names = said_before_the_first_change()
    text = "\n".join(lines)
    print(text)  # the closing note quotes it (pytest -s)
    assert "GeForce GT 710 (Kepler) is not supported by driver branch 570" in text
    assert "display: this box is a desktop" in text and "owner (wayland on seat0" in text
    assert "display: nouveau drives 0000:01:00.0 GeForce GT 710" in text
    assert "runs on the firmware framebuffer" in text
    assert "stops before the reboot (allow_desktop_reboot is false)" in text
    assert "installing the pinned driver removes 15 packages" in text
    assert "nvidia-driver-580" in text
    # issue 30 B: the move, the old build kept first, the reboot as the desktop's consent rules
    # decide it, and under Secure Boot (enrolled) the key that signs the new modules
    assert (
        "@fake/box: the driver moves from 580.178.04 (580.178.04-0ubuntu0.24.04.1) to "
        "570.211.01 (570.211.01-0ubuntu1)" in text
    )
    assert "driver 580.178.04's installed packages are kept in /var/lib/gpubox/driver-kept/" in (
        text
    )
    assert (
        "a reboot follows the install, to load driver 570.211.01: owner (wayland on seat0, "
        "active) is logged in to the display and allow_desktop_reboot is false, so the deploy "
        "stops after the install" in text
    )
    assert (
        "Secure Boot is on: DKMS signs driver 570.211.01's modules, for every installed kernel, "
        "with the enrolled key /var/lib/shim-signed/mok/MOK.priv (certificate "
        "/var/lib/shim-signed/mok/MOK.der)" in text
    )
    # the key is enrolled: nothing stops for it
    assert "Stop: enroll" not in " ".join(names) and "mokutil --import" not in text
    # then: the HWE headers, the driver, and the stop before the reboot, no reboot
    assert any("Install NVIDIA driver" in n for n in names)
    assert "Stop before the reboot" in names[-1]
    assert not any("Reboot to load the driver" in n for n in names)


# Issue 29 D12: the running kernel's headers are asked of the box's apt before they are asked
# for. The same desktop, not rebooted since a kernel update: 6.14.0-36 runs, the update
# installed 6.14.0-37 and moved the HWE meta to it, and the archive's index no longer lists
# linux-headers-6.14.0-36-generic (apt-cache policy prints nothing for it, as Debian's apt
# does for the dropped 6.1.0-26 headers: tests/fixtures/apt/
# apt-cache-policy_linux-headers_debian12_local.txt).
UPDATED = {
    "for f in /boot/vmlinuz-*": [
        "R 6.14.0-36-generic",
        "K 6.14.0-36-generic",
        "K 6.14.0-37-generic",
    ],
    "'linux-image-*'": [
        "linux-image-6.14.0-36-generic\t6.14.0-36.36~24.04.1\tii ",
        "linux-image-6.14.0-37-generic\t6.14.0-37.37~24.04.1\tii ",
        "linux-image-generic-hwe-24.04\t6.14.0-37.37~24.04.1\tii ",
    ],
}


def test_the_reference_desktop_asks_apt_for_its_kernels_headers_then_installs_them(commands):
    plan = make_plan(lambda: run_stages(driver_stage.driver), REFERENCE, reference_desktop())
    asked = [c for c in commands if "apt-cache policy linux-headers-6.14.0-36-generic" in c]
    assert len(asked) == 1
    installs = plan.installs()
    assert "linux-headers-6.14.0-36-generic" in installs
    assert "linux-headers-generic-hwe-24.04" in installs


def test_headers_gone_from_the_archive_are_skipped_and_the_owner_told_to_reboot():
    answers = reference_desktop(
        **UPDATED, **{headers_query("6.14.0-36-generic"): headers_answer("", offered=False)}
    )
    lines, names = said_before_the_first_change(answers)
    (warning,) = [line for line in lines if "kernel headers:" in line]
    assert warning == (
        "@fake/box: kernel headers: linux-headers-6.14.0-36-generic is in none of the box's apt "
        "repositories (gone from the archive: the box runs 6.14.0-36-generic and was not "
        "rebooted since a kernel update?); skipped: DKMS cannot build the NVIDIA module for "
        "6.14.0-36-generic. Reboot into the newest kernel (6.14.0-37-generic, installed), whose "
        "headers linux-headers-generic-hwe-24.04 brings: DKMS builds the module for it"
    )
    plan = make_plan(lambda: run_stages(driver_stage.driver), REFERENCE, answers)
    installs = plan.installs()
    assert "linux-headers-generic-hwe-24.04" in installs
    assert "6.14.0-36" not in " ".join(plan.commands)  # neither installed nor built
    (build,) = plan.op("Build the NVIDIA module for every bootable kernel \\(6.14.0-37-generic\\)")
    assert "linux-headers-6.14.0-37-generic" in build
    # the rest of the plan as before: the driver, and the stop before the reboot
    assert any("Install NVIDIA driver" in n for n in names)
    assert "Stop before the reboot" in names[-1]
