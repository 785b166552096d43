"""The sandbox's firmware and desktop faults (issue 16), each planted on a box and read through
the box's SSH with the real tools where the box has them: mokutil (stand-in) and the MOK screen
across a real reboot; Debian's real dkms signing the stand-in module with the real sign-file,
read back by the real modinfo; the kernel's signature check and taint (stand-in) in
/sys/module; a real graphical target, display manager unit and logind session; nouveau on the
GT 710 (stand-in) until a boot finds it blacklisted. The tests run in file order on one box."""

from __future__ import annotations

import time

import pytest
from conftest import box_sh

from gpubox import sandbox
from gpubox.commands import demo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sandbox_box")]

CERT = "/var/lib/dkms/mok.pub"
NO_EFI = "EFI variables are not supported on this system\n"


def run(command: str, stdin: str | None = None):
    return sandbox.ssh(command, check=False, input=stdin)


def reboot() -> float:
    """systemctl reboot in the box, back to running; the seconds it took."""
    boot_id = box_sh("cat /proc/sys/kernel/random/boot_id").strip()
    started = time.monotonic()
    run("systemctl reboot")  # the connection may drop: 255
    assert sandbox.wait_ready(since_boot_id=boot_id) in ("running", "degraded")
    return time.monotonic() - started


def test_a_fresh_box_has_no_efi_and_its_own_empty_sys_module():
    result = run("mokutil --sb-state")
    assert (result.returncode, result.stderr) == (1, NO_EFI)
    assert box_sh("ls -A /sys/module") == ""  # not the host's modules
    assert box_sh("touch /sys/module/x && rm /sys/module/x && echo writable") == "writable\n"
    # Debian's real sign-file, where Debian's dkms looks for it after linux-kbuild-<series>
    assert box_sh("test -x /lib/modules/$(uname -r)/build/scripts/sign-file && echo ok") == "ok\n"


def test_import_then_enroll_at_the_mok_screen_across_a_reboot():
    sandbox.plant_fault("secure-boot")
    assert box_sh("mokutil --sb-state") == "SecureBoot enabled\n"
    # Debian's own mokutil, installed as the deploy may install it, does not take its place
    box_sh(
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mokutil"
        " >/dev/null"
    )
    assert box_sh("test -x /usr/bin/mokutil.distrib && mokutil --sb-state") == (
        "SecureBoot enabled\n"
    )
    assert run(f"test -e {CERT}").returncode != 0  # dkms has built nothing yet
    # the key pair as Debian's dkms makes it, as the deploy will
    box_sh(
        "mkdir -p /var/lib/dkms && cd /var/lib/dkms && openssl req -new -x509 -nodes -days 36500"
        ' -subj "/CN=DKMS module signing key" -newkey rsa:2048 -keyout mok.key -outform DER'
        " -out mok.pub 2>/dev/null"
    )
    result = run(f"mokutil --test-key {CERT}")
    assert (result.returncode, result.stdout) == (0, f"{CERT} is not enrolled\n")
    result = run(f"mokutil --import {CERT}", stdin="owner-pw\nowner-pw\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "input password: \ninput password again: \n"
    result = run(f"mokutil --test-key {CERT}")
    assert (result.returncode, result.stdout) == (
        1,
        f"{CERT} is already in the enrollment request\n",
    )
    assert box_sh("mokutil --list-new").startswith("[key 1]\nSHA1 Fingerprint: ")

    sandbox.mok_screen("enroll", "owner-pw")
    assert run(f"mokutil --test-key {CERT}").stdout.endswith("enrollment request\n")  # not yet
    print(f"\n[sandbox timing] reboot: {reboot():.1f} s")
    result = run(f"mokutil --test-key {CERT}")
    assert (result.returncode, result.stdout) == (1, f"{CERT} is already enrolled\n")
    assert box_sh("mokutil --list-new") == ""
    assert "Subject: CN=DKMS module signing key" in box_sh("mokutil --list-enrolled")


def test_an_unanswered_mok_screen_discards_the_request():
    box_sh(
        "cd /root && openssl req -new -x509 -nodes -days 1 -subj /CN=other -newkey rsa:2048"
        " -keyout other.key -outform DER -out other.der 2>/dev/null"
    )
    assert run("mokutil --import /root/other.der", stdin="pw\npw\n").returncode == 0
    reboot()  # nobody at the console: MokManager times out
    assert box_sh("mokutil --test-key /root/other.der") == "/root/other.der is not enrolled\n"
    sandbox.clear_faults()
    assert run("mokutil --sb-state").stderr == NO_EFI


def test_the_desktop_fault_is_a_real_session_and_nouveau_until_blacklisted():
    # Debian's systemd links default.target to graphical.target already: a server without a
    # display manager just reaches multi-user.target's units
    before = box_sh("systemctl get-default").strip()
    assert run("systemctl is-active display-manager.service").stdout.strip() != "active"
    sandbox.plant_fault("desktop")

    def desktop() -> tuple[str, str, str, str]:
        sessions = box_sh("loginctl list-sessions --no-legend")
        session = next(line.split()[0] for line in sessions.splitlines() if " owner " in line)
        props = box_sh(f"loginctl show-session {session} -p Type -p Class -p Seat -p Active")
        return (
            box_sh("systemctl get-default").strip(),
            box_sh("systemctl is-active display-manager.service").strip(),
            props,
            box_sh("lspci -Dnnk -d 10de:128b"),
        )

    target, dm, props, lspci = desktop()
    assert (target, dm) == ("graphical.target", "active")
    assert props == "Seat=seat0\nType=wayland\nClass=user\nActive=yes\n"
    assert "\tKernel driver in use: nouveau\n\tKernel modules: nvidiafb, nouveau\n" in lspci
    reboot()
    assert desktop()[:3] == (target, dm, props)  # survives the reboot
    assert box_sh("test -d /sys/module/nouveau && echo loaded") == "loaded\n"

    box_sh("echo 'blacklist nouveau' > /etc/modprobe.d/test-blacklist-nouveau.conf")
    reboot()
    assert run("test -d /sys/module/nouveau").returncode == 1
    assert "Kernel driver in use" not in box_sh("lspci -Dnnk -d 10de:128b")  # firmware fb
    box_sh("rm /etc/modprobe.d/test-blacklist-nouveau.conf")

    sandbox.clear_faults()
    assert box_sh("systemctl get-default").strip() == before
    assert run("systemctl is-active display-manager.service").stdout.strip() != "active"
    assert " owner " not in box_sh("loginctl list-sessions --no-legend || true")


def test_dkms_signs_the_module_and_the_kernel_check_follows_the_enrolled_keys():
    run_ = demo.deploy("deploy/driver.py")
    assert run_.rc == 0 and not run_.failed_hosts, run_.output[-3000:]
    module = box_sh("modinfo -F filename nvidia-current").strip()
    assert module.endswith("/updates/dkms/nvidia-current.ko")
    # real dkms with the real sign-file, read by the real modinfo
    assert box_sh(f"modinfo -F signer {module}") == "DKMS module signing key\n"
    sig_key = box_sh(f"modinfo -F sig_key {module}").strip()
    serial = box_sh(f"openssl x509 -inform DER -in {CERT} -noout -serial").strip()
    assert sig_key.replace(":", "").lstrip("0") == serial.split("=")[1].lstrip("0")

    reboot()  # no EFI: nothing enrolled, the module loads unverified
    assert box_sh("cat /sys/module/nvidia/taint") == "POE\n"
    # /etc/modules-load.d names nvidia-drm: its install rule loads nvidia-modeset first
    assert box_sh("ls /sys/module").split() == ["nvidia", "nvidia_drm", "nvidia_modeset"]
    assert box_sh("cat /sys/module/nvidia/version") == "570.211.01\n"

    sandbox.plant_fault("secure-boot")  # on, and the DKMS key not enrolled: refused
    reboot()
    assert run("test -d /sys/module/nvidia").returncode == 1
    journal = box_sh("journalctl -b -u gpubox-standin-nvidia-current.service --no-pager")
    assert "Loading of module with unavailable key is rejected" in journal
    assert "could not insert 'nvidia_current': Key was rejected by service" in journal
    assert run("nvidia-smi").returncode != 0

    sandbox.plant_fault("secure-boot-enrolled")  # the same key, enrolled long ago
    reboot()
    assert box_sh("cat /sys/module/nvidia/taint") == "PO\n"
    assert box_sh("nvidia-smi -L").count("Tesla V100-SXM2-32GB") == 2
    # the product on this box: the deploy goes on (the key is enrolled), the check passes
    again = demo.deploy("deploy/driver.py")
    assert again.rc == 0 and not again.failed_hosts, again.output[-3000:]
    secure = demo.checks(extra=("-k", "secure-boot"))
    assert (secure.rc, secure.passed, secure.skipped) == (0, 1, 0), secure.output[-2000:]
    sandbox.clear_faults()


def test_the_runfile_driver_fault():
    sandbox.plant_fault("runfile-driver")
    assert box_sh("test -x /usr/bin/nvidia-uninstall && echo yes") == "yes\n"
