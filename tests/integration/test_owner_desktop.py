"""The owner's desktop on the sandbox box (issue 16): a runfile driver refused with the box
unchanged; Secure Boot on with no key yet: the deploy makes DKMS's key and stops before the
driver naming `mokutil --import`; the owner imports it and answers the MOK screen across a
reboot; a desktop in use gets its driver but no reboot; with consent it reboots and converges,
and the host checks pass, Secure Boot's included. The tests run in file order on one box."""

from __future__ import annotations

import time

import pytest
from conftest import box_sh

from gpubox import sandbox
from gpubox.commands import demo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sandbox_box")]

CERT = "/var/lib/dkms/mok.pub"
PASSWORD = "gpubox-enroll-1"
SNAPSHOT = (
    "set -o pipefail; dpkg -l | sha256sum; "
    "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum"
)
NVIDIA_OR_CUDA = (
    "dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' "
    "| grep -E '^(nvidia|libnvidia|libcuda|cuda)' | grep -E ' [ih]i' || true"
)


def key_answer() -> str:
    """mokutil --test-key's answer (its text: mokutil 0.6.0 exits 1 for "enrolled")."""
    return sandbox.ssh(f"mokutil --test-key {CERT}", check=False).stdout


def reboot() -> None:
    boot_id = box_sh("cat /proc/sys/kernel/random/boot_id").strip()
    sandbox.ssh("systemctl reboot", check=False)
    assert sandbox.wait_ready(since_boot_id=boot_id) in ("running", "degraded")


def test_a_runfile_driver_is_refused_naming_nvidia_uninstall_and_nothing_changes():
    sandbox.plant_fault("runfile-driver")
    before = box_sh(SNAPSHOT)
    run = demo.deploy()
    assert run.rc != 0
    assert "runfile_driver:" in run.output and "nvidia-uninstall" in run.output, run.output[-3000:]
    assert box_sh(SNAPSHOT) == before


def test_secure_boot_without_a_key_stops_before_the_driver_naming_mokutil_import():
    sandbox.plant_fault("secure-boot")
    sandbox.plant_fault("desktop")
    assert sandbox.ssh(f"test -e {CERT}", check=False).returncode != 0
    started = time.monotonic()
    run = demo.deploy(extra=("--data", "runfile_driver=uninstall"))
    print(f"secure boot stop: {time.monotonic() - started:.1f} s")
    assert run.rc != 0
    assert f"sudo mokutil --import {CERT}" in run.output, run.output[-3000:]
    assert "Shim UEFI key management" in run.output
    assert box_sh(NVIDIA_OR_CUDA) == ""  # no NVIDIA or CUDA package installed
    assert box_sh("test -x /usr/bin/nvidia-uninstall && echo kept") == "kept\n"  # not yet
    # the key, as Debian's dkms makes it
    subject = box_sh(f"openssl x509 -inform DER -in {CERT} -noout -subject")
    assert subject.strip() == "subject=CN = DKMS module signing key"
    assert key_answer() == f"{CERT} is not enrolled\n"
    # the next deploy says the same, and makes no second key
    again = demo.deploy(extra=("--data", "runfile_driver=uninstall"))
    assert again.rc != 0 and "is not enrolled" in again.output
    assert box_sh(f"openssl x509 -inform DER -in {CERT} -noout -subject") == subject


def test_the_owner_imports_the_key_and_enrolls_it_at_the_next_boot():
    box_sh(f"mokutil --import {CERT}", stdin=f"{PASSWORD}\n{PASSWORD}\n")
    assert key_answer() == f"{CERT} is already in the enrollment request\n"
    pending = demo.deploy(extra=("--data", "runfile_driver=uninstall"))
    assert pending.rc != 0 and "The import is already done" in pending.output
    sandbox.mok_screen("enroll", PASSWORD)
    reboot()
    assert key_answer() == f"{CERT} is already enrolled\n"


def test_a_desktop_in_use_gets_the_driver_but_no_reboot():
    run = demo.deploy(extra=("--data", "runfile_driver=uninstall"))
    assert run.rc != 0
    assert "display: this box is a desktop" in run.output, run.output[-4000:]
    assert "display: nouveau drives" in run.output
    assert "Stop before the reboot" in run.output
    assert "nvidia-uninstall --silent" in run.output
    assert sandbox.ssh("test -e /usr/bin/nvidia-uninstall", check=False).returncode != 0
    assert "nvidia-kernel-dkms" in box_sh(NVIDIA_OR_CUDA)  # installed, not yet loaded
    assert box_sh("test -d /sys/module/nouveau && echo loaded") == "loaded\n"
    # DKMS signed the module with the enrolled key (real sign-file, read by the real modinfo)
    signer = box_sh("modinfo -F signer /lib/modules/$(uname -r)/updates/dkms/nvidia-current.ko*")
    assert signer.strip() == "DKMS module signing key"


def test_with_consent_the_desktop_reboots_converges_and_every_check_passes():
    run = demo.deploy(extra=("--data", "allow_desktop_reboot=true"))
    assert run.rc == 0 and not run.failed_hosts, run.output[-4000:]
    assert "Reboot to load the driver" in run.output
    assert box_sh("cat /sys/module/nvidia/taint").strip() == "PO"
    assert sandbox.ssh("test -d /sys/module/nouveau", check=False).returncode != 0
    checks = demo.checks(extra=("-m", "quick"))
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]
    secure = demo.checks(extra=("-k", "secure-boot"))  # ran, and passed (not skipped)
    assert (secure.rc, secure.passed, secure.skipped) == (0, 1, 0), secure.output[-2000:]
