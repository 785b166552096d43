"""Secure Boot: the NVIDIA modules are signed by DKMS's enrolled key and verified by the
kernel (deploy/driver.py signs them; gpubox.knowledge.secure_boot holds the rules)."""

from __future__ import annotations

from gpubox.checks.core import Check, Reading, Skip
from gpubox.config import HostConfig
from gpubox.knowledge import secure_boot


def modules_signed(c: HostConfig, r: Reading) -> list[str]:
    if not r.get("sb_state"):
        raise Skip("Secure Boot is off (or the box has no EFI)")
    return secure_boot.module_problems(r.get("mok"))


CHECKS = [
    Check(
        "driver.secure-boot",
        "with Secure Boot on, every NVIDIA module is signed by the enrolled key and verified",
        "quick",
        ("sb_state", "mok"),
        modules_signed,
        fix="sudo mokutil --test-key CERT (enrolled?); {deploy} (stops with the enrollment "
        "steps when the key is not enrolled, refuses a module signed by another key)",
        stage="driver",
    ),
]
