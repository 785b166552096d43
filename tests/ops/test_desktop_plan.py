"""The driver stage on the reference desktop: Ubuntu 24.04 Desktop on the HWE kernel (6.14),
gdm, a user logged in to a wayland session, the GT 710 display card on nouveau, 2x V100.

Fact answers (each file's sources: tests/ops/facts/README.md):
- the desktop: tests/ops/facts/desktop-state-ubuntu2404-desktop (graphical.target, gdm.service
  as display-manager.service, a wayland session of class user on seat0 and gdm's greeter);
- the kernel: running 6.14.0-36-generic, /boot holding 6.14.0-35 and 6.14.0-36, the image meta
  linux-image-generic-hwe-24.04 at 6.14.0-36.36~24.04.1 (Ubuntu's HWE metas carry the series
  in their version: packages.ubuntu.com/noble/linux-generic-hwe-24.04 lists 6.17.0-35.35~24.04.1
  for the 6.17 series; the 6.14 one is written the same way);
- nouveau loaded (/sys/module/nouveau), no NVIDIA module yet.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import REFERENCE, fresh_box

from gpubox.stages import driver as driver_stage
from gpubox.stages import run_stages

FACTS = Path(__file__).parent / "facts"
DESKTOP = (FACTS / "desktop-state-ubuntu2404-desktop").read_text().splitlines()
HWE_META = "linux-image-generic-hwe-24.04\t6.14.0-36.36~24.04.1\tii "
HWE_BOOT = ["R 6.14.0-36-generic", "K 6.14.0-35-generic", "K 6.14.0-36-generic"]


def hwe_desktop(**overrides: object) -> dict[object, object]:
    answers: dict[object, object] = {
        "uname -r": "6.14.0-36-generic",
        "for f in /boot/vmlinuz-*": HWE_BOOT,
        "'linux-image-*'": ["linux-image-6.14.0-36-generic\t6.14.0-36.36~24.04.1\tii ", HWE_META],
        "echo '## default-target'": DESKTOP,
        "test -d /sys/module/nouveau": "yes",
    }
    answers.update(overrides)
    return fresh_box("ubuntu2404", **answers)


def at_the_login_screen() -> list[str]:
    """The same desktop with nobody logged in: only gdm's greeter session, active."""
    lines, skip = [], False
    for line in DESKTOP:
        if line.startswith("## "):
            skip = line == "## session 2"
        if not skip:
            lines.append(line.replace("State=online", "State=active"))
    return lines


def driver_plan(plan_of, data, answers):
    """The driver stage as a deploy file runs it (run_stages: a stage may stop its host)."""
    return plan_of(lambda: run_stages(driver_stage.driver), data, answers)


def display_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    prefix = "@fake/box: display: "
    return [r.getMessage()[len(prefix) :] for r in caplog.records if prefix in r.getMessage()]


# C. The headers meta follows the series the box boots.


def test_hwe_desktop_gets_the_hwe_headers_meta_never_the_ga_one(plan_of):
    installs = driver_plan(plan_of, REFERENCE, hwe_desktop()).installs()
    assert "linux-headers-6.14.0-36-generic" in installs
    assert "linux-headers-generic-hwe-24.04" in installs
    assert "linux-headers-generic" not in installs


def test_ga_server_keeps_linux_headers_generic(plan_of):
    installs = driver_plan(plan_of, REFERENCE, fresh_box("ubuntu2404")).installs()
    headers = [p for p in installs if p.startswith("linux-headers")]
    assert headers == ["linux-headers-6.8.0-88-generic", "linux-headers-generic"]


def test_debian_keeps_linux_headers_amd64(plan_of):
    answers = fresh_box(
        "debian12",
        **{
            "uname -r": "6.1.0-26-amd64",
            "for f in /boot/vmlinuz-*": ["R 6.1.0-26-amd64", "K 6.1.0-26-amd64"],
            # Debian 12's linux-image-amd64 meta carries the upstream version of its kernel
            "'linux-image-*'": [
                "linux-image-6.1.0-26-amd64\t6.1.112-1\tii ",
                "linux-image-amd64\t6.1.112-1\tii ",
            ],
        },
    )
    headers = [p for p in driver_plan(plan_of, REFERENCE, answers).installs() if "headers" in p]
    assert headers == ["linux-headers-6.1.0-26-amd64", "linux-headers-amd64"]


def test_ga_and_hwe_metas_but_only_hwe_kernels_in_boot_get_only_the_hwe_meta(plan_of):
    answers = hwe_desktop(
        **{"'linux-image-*'": ["linux-image-generic\t6.8.0-88.89\tii ", HWE_META]}
    )
    installs = driver_plan(plan_of, REFERENCE, answers).installs()
    assert "linux-headers-generic-hwe-24.04" in installs
    assert "linux-headers-generic" not in installs
    # and with a 6.8 kernel in /boot too, both series are followed
    both = hwe_desktop(
        **{
            "'linux-image-*'": ["linux-image-generic\t6.8.0-88.89\tii ", HWE_META],
            "for f in /boot/vmlinuz-*": [*HWE_BOOT, "K 6.8.0-88-generic"],
        }
    )
    installs = driver_plan(plan_of, REFERENCE, both).installs()
    assert {"linux-headers-generic", "linux-headers-generic-hwe-24.04"} <= set(installs)


# D. A desktop is a desktop.

REFERENCE_DESKTOP_LINES = [
    "this box is a desktop: default target graphical.target; display manager gdm.service "
    "(active); logged in to a graphical session: owner (wayland on seat0, active); login "
    "screen: gdm (wayland on seat0, online)",
    "nouveau drives 0000:01:00.0 GeForce GT 710: the deploy blacklists nouveau "
    "(/etc/modprobe.d/gpubox-blacklist-nouveau.conf) and rebuilds the initramfs, so it no "
    "longer loads from the next boot",
    "0000:01:00.0 GeForce GT 710 (Kepler) is a display card that driver branch 570 does not "
    "drive (its last branch is 470): after the reboot it runs on the firmware framebuffer "
    "(firmware resolution, no acceleration). For an accelerated desktop, connect the monitor "
    "to the CPU's integrated graphics, or use a display card branch 570 drives (Maxwell or "
    "newer)",
    "a reboot at the end of the driver stage, after the driver is installed (nouveau is "
    "loaded): owner (wayland on seat0, active) is logged in, so the deploy installs the "
    "driver and stops before the reboot (allow_desktop_reboot is false): reboot when it "
    'suits them (sudo systemctl reboot), or set "allow_desktop_reboot": True; the next deploy '
    "continues",
]


def test_the_reference_desktop_is_told_what_happens_to_its_display(plan_of, caplog):
    with caplog.at_level(logging.INFO):
        plan = driver_plan(plan_of, REFERENCE, hwe_desktop())
    assert display_lines(caplog) == REFERENCE_DESKTOP_LINES
    assert plan.ops  # printed while planning: before the first operation runs


def test_a_logged_in_user_keeps_the_box_up_the_install_still_runs(plan_of):
    plan = driver_plan(plan_of, REFERENCE, hwe_desktop())
    assert not [n for n in plan.names if "Reboot" in n]
    assert plan.installs()  # headers, driver: everything before the reboot is planned
    assert [n for n in plan.names if "Install NVIDIA driver" in n]
    assert [n for n in plan.names if "Blacklist nouveau" in n]
    # the plan ends with the stop, where the reboot would have been
    assert "Stop before the reboot: a user is logged in to a graphical session" in plan.names[-1]
    assert not [n for n in plan.names if "a reboot is needed" in n]


def test_with_consent_the_desktop_reboots(plan_of, caplog):
    with caplog.at_level(logging.INFO):
        plan = driver_plan(plan_of, {**REFERENCE, "allow_desktop_reboot": True}, hwe_desktop())
    assert [n for n in plan.names if "Reboot to load the driver (nouveau is loaded)" in n]
    assert not [n for n in plan.names if "Stop" in n]
    assert display_lines(caplog)[-1] == (
        "a reboot at the end of the driver stage, after the driver is installed (nouveau is "
        "loaded): the deploy reboots the box; it ends the session of owner (wayland on seat0, "
        "active)"
    )


def test_at_the_login_screen_the_desktop_reboots_without_the_key(plan_of, caplog):
    answers = hwe_desktop(**{"echo '## default-target'": at_the_login_screen()})
    with caplog.at_level(logging.INFO):
        plan = driver_plan(plan_of, REFERENCE, answers)
    assert [n for n in plan.names if "Reboot to load the driver" in n]
    lines = display_lines(caplog)
    assert "login screen: gdm (wayland on seat0, active)" in lines[0]
    assert "logged in" not in lines[0]


def test_allow_reboot_false_still_stops_as_before_on_a_desktop(plan_of):
    plan = driver_plan(plan_of, {**REFERENCE, "allow_reboot": False}, hwe_desktop())
    assert [n for n in plan.names if "Stop: a reboot is needed" in n]
    assert not [n for n in plan.names if "Reboot" in n or "logged in" in n]


def test_a_server_prints_nothing_new_and_reboots_as_before(plan_of, caplog):
    with caplog.at_level(logging.INFO):
        plan = driver_plan(plan_of, REFERENCE, fresh_box("ubuntu2404"))
    assert display_lines(caplog) == []
    assert [n for n in plan.names if "Reboot to load the driver" in n]
    assert not [n for n in plan.names if "Stop" in n]


def test_a_desktop_with_the_driver_loaded_is_told_nothing_about_a_reboot(plan_of, caplog):
    answers = hwe_desktop(
        **{"cat /sys/module/nvidia/version": "570.211.01", "test -d /sys/module/nouveau": "no"}
    )
    with caplog.at_level(logging.INFO):
        plan = driver_plan(plan_of, REFERENCE, answers)
    assert not [line for line in display_lines(caplog) if "reboot at the end" in line]
    assert not [n for n in plan.names if "Reboot" in n or "Stop" in n]
