"""The reference desktop as a whole: Ubuntu 24.04 Desktop on the HWE kernel, Secure Boot on
with DKMS's key enrolled, gdm and a logged-in wayland session, the GT 710 on nouveau, Ubuntu's
nvidia-driver-580 from Additional Drivers, 2x V100. What the deploy says before its first
change, and what it then plans (the facts are the other plan tests': test_desktop_plan,
test_driver_replacement_plan, test_secure_boot_plan)."""

from __future__ import annotations

import logging

from conftest import REFERENCE, fake_host
from test_desktop_plan import hwe_desktop
from test_driver_replacement_plan import DPKG_580, INSTALLED, RECORDED, SIMULATION
from test_secure_boot_plan import MOK, ubuntu_state

from gpubox.preflight import dpkg_ready
from gpubox.stages import driver as driver_stage
from gpubox.stages import run_stages


def reference_desktop() -> dict[object, object]:
    return hwe_desktop(
        **{
            "mokutil --sb-state": "SecureBoot enabled",
            MOK: ubuntu_state("is already enrolled"),
            INSTALLED: DPKG_580,
            SIMULATION: RECORDED.splitlines(),
        }
    )


def said_before_the_first_change() -> tuple[list[str], list[str]]:
    """(the warnings logged before the driver stage's first operation of its own, the names
    of every operation planned)."""
    lines: list[str] = []
    with fake_host(REFERENCE, reference_desktop()) as fake:

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
    # Secure Boot with the key enrolled says nothing and stops nothing
    assert "Secure Boot" not in text
    # then: the HWE headers, the driver, and the stop before the reboot, no reboot
    assert any("Install NVIDIA driver" in n for n in names)
    assert "Stop before the reboot" in names[-1]
    assert not any("Reboot to load the driver" in n for n in names)
