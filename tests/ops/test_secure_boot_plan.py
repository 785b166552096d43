"""The driver stage on a Secure Boot box (Ubuntu 24.04 Desktop and Debian 12 facts): the key
enrolled goes on; not enrolled, pending or missing stops before the driver (the key made as
dkms would, nothing else); a pinned module signed by another key is refused. The MokKey answers
are the recorded state (tests/fixtures/secureboot) with mokutil 0.6.0's answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REFERENCE, fresh_box

from gpubox.base.errors import DeployRefused
from gpubox.stages import cuda as cuda_stage
from gpubox.stages import driver as driver_stage
from gpubox.stages import run_stages

FIXTURES = Path(__file__).parents[1] / "fixtures" / "secureboot"
MOK = "( kernelver=$(cat /proc/sys/kernel/osrelease); mok_signing_key="
STOP = r"^Stop: enroll DKMS's signing key"


def ubuntu_state(test_key: str | None, exists: bool = True, usp: bool = True) -> list[str]:
    """The MokKey fact on Ubuntu 24.04 Desktop: shim-signed's default key paths, mokutil
    installed (shim-signed depends on it), update-secureboot-policy there."""
    lines = ["KEY /var/lib/shim-signed/mok/MOK.priv", "CERT /var/lib/shim-signed/mok/MOK.der"]
    if exists:
        lines += ["KEY-EXISTS", "CERT-EXISTS"]
    lines += ["USP"] if usp else []
    lines += ["MOKUTIL"]
    if exists and test_key:
        lines += [f"TEST /var/lib/shim-signed/mok/MOK.der {test_key}"]
        recorded = (FIXTURES / "openssl-x509-serial-subject_local.txt").read_text()
        lines += [f"X509 {line}" for line in recorded.splitlines()]
    return lines


def secure_box(os_name: str, mok: list[str]) -> dict[object, object]:
    return fresh_box(os_name, **{"mokutil --sb-state": "SecureBoot enabled", MOK: mok})


def whole(plan_of, answers):
    return plan_of(lambda: run_stages(driver_stage.driver, cuda_stage.cuda), REFERENCE, answers)


def nothing_of_nvidia_installed(plan) -> None:
    assert not [p for p in plan.installs() if "nvidia" in p or "cuda" in p], plan.installs()
    assert not any("Pin the NVIDIA driver" in n or "CUDA" in n for n in plan.names), plan.names


def test_not_enrolled_stops_before_the_driver_naming_mokutil_import(plan_of):
    plan = whole(plan_of, secure_box("ubuntu2404", ubuntu_state("is not enrolled")))
    nothing_of_nvidia_installed(plan)
    assert "Stop: enroll DKMS's signing key" in plan.names[-1]
    assert not any("signing key (as" in n for n in plan.names)  # the key exists: not made


def test_a_missing_key_is_made_by_update_secureboot_policy_then_the_deploy_stops(plan_of):
    plan = whole(plan_of, secure_box("ubuntu2404", ubuntu_state(None, exists=False)))
    nothing_of_nvidia_installed(plan)
    assert plan.op("Install openssl") and plan.op("Create DKMS's module signing key") == [
        "rm -f /var/lib/shim-signed/mok/MOK.der && "
        "SHIM_NOTRIGGER=y update-secureboot-policy --new-key"
    ]
    assert "Stop: enroll" in plan.names[-1]


def test_a_pending_enrollment_stops_too(plan_of):
    plan = whole(
        plan_of, secure_box("ubuntu2404", ubuntu_state("is already in the enrollment request"))
    )
    nothing_of_nvidia_installed(plan)
    assert "Stop: enroll" in plan.names[-1]


def test_an_enrolled_key_goes_on_to_the_driver_and_cuda(plan_of):
    plan = whole(plan_of, secure_box("ubuntu2404", ubuntu_state("is already enrolled")))
    assert not any("Stop:" in n for n in plan.names)
    assert any("Install NVIDIA driver" in n for n in plan.names)
    assert any("CUDA" in n for n in plan.names)


def test_the_debian_key_is_made_with_dkms_own_command(plan_of):
    mok = ["KEY /var/lib/dkms/mok.key", "CERT /var/lib/dkms/mok.pub", "MOKUTIL"]
    plan = whole(plan_of, secure_box("debian12", mok))
    (command,) = plan.op("Create DKMS's module signing key")
    assert "-subj '/CN=DKMS module signing key'" in command
    assert "-keyout /var/lib/dkms/mok.key -outform DER -out /var/lib/dkms/mok.pub" in command
    nothing_of_nvidia_installed(plan)


def test_a_pinned_module_signed_by_another_key_is_refused(plan_of):
    mok = ubuntu_state("is already enrolled") + [
        "MOD /lib/modules/6.8.0-88-generic/updates/dkms/nvidia.ko.zst\tname=nvidia\t"
        "version=570.211.01\tsigner=oldbox Secure Boot Module Signature key\t"
        "sig_key=61:E0:9A:71"
    ]
    with pytest.raises(DeployRefused) as err:
        whole(plan_of, secure_box("ubuntu2404", mok))
    text = str(err.value)
    assert "nothing was changed" in text and "secure_boot:" in text
    assert "signed by 'oldbox Secure Boot Module Signature key' (61E09A71)" in text


def test_secure_boot_off_reads_no_key(plan_of):
    plan = whole(plan_of, fresh_box("ubuntu2404"))
    assert not any("Stop:" in n for n in plan.names)
