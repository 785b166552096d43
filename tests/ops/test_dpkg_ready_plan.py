"""dpkg ready in a stage's plan: apt's lock timeout is the first operation, the recovery of an
interrupted dpkg comes before any apt operation (and only then), a held lock refuses the run."""

from __future__ import annotations

import pytest
from conftest import REFERENCE, fresh_box

from gpubox.base.errors import DeployRefused
from gpubox.preflight import dpkg_ready
from gpubox.stages import driver as driver_stage

LOCK_CONF = "apt-get waits up to"
RECOVERY = "Finish dpkg's interrupted run"
INTERRUPTED = {
    "dpkg-query -W": [
        "journal\t0007",
        "status\tiU \tnvidia-kernel-dkms",
        "status\tiHR\tlibcuda1",
    ]
}


def apt_positions(plan) -> list[int]:
    return [
        i
        for i, (_, commands) in enumerate(plan.ops)
        if any("apt-get" in c or "apt-mark" in c for c in commands)
        and not any("dpkg --configure -a" in c for c in commands)
    ]


@pytest.mark.parametrize("os_name", ["ubuntu2404", "debian12"])
def test_the_first_operation_makes_apt_get_wait_for_dpkgs_lock(plan_of, os_name):
    plan = plan_of(driver_stage.driver, REFERENCE, fresh_box(os_name))
    first_name, first = plan.ops[0]
    assert first_name == f"NVIDIA driver | {LOCK_CONF} 900 s for dpkg's lock"
    assert dpkg_ready.CONF_FILE in " ".join(first)
    assert not [name for name in plan.names if RECOVERY in name]


def test_the_timeout_follows_apt_lock_timeout(plan_of):
    plan = plan_of(
        driver_stage.driver, {**REFERENCE, "apt_lock_timeout": 120}, fresh_box("debian12")
    )
    assert plan.names[0] == f"NVIDIA driver | {LOCK_CONF} 120 s for dpkg's lock"


def test_an_interrupted_dpkg_is_finished_before_any_apt_operation(plan_of):
    plan = plan_of(driver_stage.driver, REFERENCE, fresh_box("ubuntu2404", **INTERRUPTED))
    (index,) = [i for i, name in enumerate(plan.names) if RECOVERY in name]
    assert index == 1  # right after apt's lock timeout
    assert "nvidia-kernel-dkms (unpacked, not configured)" in plan.names[index]
    commands = plan.ops[index][1]
    assert any(c.startswith("DEBIAN_FRONTEND=noninteractive dpkg --configure -a") for c in commands)
    assert commands[-1].endswith(" -f install")
    assert apt_positions(plan) and min(apt_positions(plan)) > index


def test_a_lock_held_past_apt_lock_timeout_refuses_before_any_operation(plan_of):
    # A fake host answers the same every time: the lock stays held for apt_lock_timeout (1 s).
    held = {
        "/proc/locks": [
            "held\t/var/lib/dpkg/lock-frontend\t1432\tunattended-upgr\t/usr/bin/python3 "
            "/usr/bin/unattended-upgrade"
        ]
    }
    with pytest.raises(DeployRefused) as refused:
        plan_of(
            driver_stage.driver, {**REFERENCE, "apt_lock_timeout": 1}, fresh_box("debian12", **held)
        )
    message = str(refused.value)
    assert "box: apt_lock_timeout: dpkg is still busy after 1 s" in message
    assert "/var/lib/dpkg/lock-frontend held by PID 1432 (unattended-upgr: " in message
