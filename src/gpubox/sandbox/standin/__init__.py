"""Stand-ins for what the sandbox box cannot have: its GPUs. Never shipped to a real box.

``nvidia-smi`` and ``lspci`` here are standalone python3 scripts (standard library only) that
run inside the box and print real output formats for the hardware in the box's state file;
``state`` writes that file and plants faults in it. STATE.md documents the files they read.
"""

from __future__ import annotations

from pathlib import Path

from gpubox.sandbox.standin.state import (
    LOADED_DRIVER_FILE,
    PERSISTENCE_FILE,
    RUN_DIR,
    RUN_ENV,
    STATE_ENV,
    STATE_PATH,
)

HERE = Path(__file__).parent
NVIDIA_SMI = HERE / "nvidia-smi"
LSPCI = HERE / "lspci"
STATE_DOC = HERE / "STATE.md"
# The placeholder the packager replaces with the driver version in the nvidia-smi script.
DRIVER_VERSION_PLACEHOLDER = "@DRIVER_VERSION@"

__all__ = [
    "DRIVER_VERSION_PLACEHOLDER",
    "LOADED_DRIVER_FILE",
    "LSPCI",
    "NVIDIA_SMI",
    "PERSISTENCE_FILE",
    "RUN_DIR",
    "RUN_ENV",
    "STATE_DOC",
    "STATE_ENV",
    "STATE_PATH",
    "nvidia_smi_source",
]


def nvidia_smi_source(driver_version: str) -> str:
    """The stand-in nvidia-smi script for one driver version, as the package installs it."""
    text = NVIDIA_SMI.read_text(encoding="utf-8")
    if text.count(DRIVER_VERSION_PLACEHOLDER) != 1:
        raise RuntimeError(f"{NVIDIA_SMI} must hold {DRIVER_VERSION_PLACEHOLDER} exactly once")
    return text.replace(DRIVER_VERSION_PLACEHOLDER, driver_version)
