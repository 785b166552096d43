"""Stand-ins for what the sandbox box cannot have: its GPUs and firmware. Never shipped to a
real box.

``nvidia-smi``, ``lspci``, ``mokutil``, ``dcgmi``, ``nv-hostengine`` and ``boot-modules`` here
are standalone python3 scripts (standard library only) that run inside the box and print real
output formats for the hardware and firmware in the box's state file; ``gpu-burn/`` is a
stand-in gpu-burn source tree (Makefile and a python gpu_burn template) that the sandbox serves
as gpu-burn's tarball. ``state`` writes the state file and plants faults in it. STATE.md
documents the files they read and their contracts.
"""

from __future__ import annotations

from pathlib import Path

from gpubox.sandbox.standin.state import (
    BURN_TICK_ENV,
    HOSTENGINE_FILE,
    LOADED_DRIVER_FILE,
    PERSISTENCE_FILE,
    PERSISTENCED_FILE,
    PROFILING_MODULE,
    PROFILING_MODULE_ENV,
    RUN_DIR,
    RUN_ENV,
    STATE_ENV,
    STATE_PATH,
)

HERE = Path(__file__).parent
NVIDIA_SMI = HERE / "nvidia-smi"
LSPCI = HERE / "lspci"
MOKUTIL = HERE / "mokutil"
BOOT_MODULES = HERE / "boot-modules"
DCGMI = HERE / "dcgmi"
NV_HOSTENGINE = HERE / "nv-hostengine"
GPU_BURN_TREE = HERE / "gpu-burn"
STATE_DOC = HERE / "STATE.md"
# The placeholder the packager replaces with the driver version in the nvidia-smi script.
DRIVER_VERSION_PLACEHOLDER = "@DRIVER_VERSION@"
# The placeholder the packager replaces with the DCGM version (e.g. 4.4.1) in dcgmi and
# nv-hostengine.
DCGM_VERSION_PLACEHOLDER = "@DCGM_VERSION@"
# The files of the stand-in gpu-burn source tree, as the tarball must hold them (relative to
# its top directory); make bakes COMPUTE into gpu_burn.in's @GPUBURN_COMPUTE@ on the box.
GPU_BURN_FILES = ("Makefile", "README.md", "compare.cu", "gpu_burn.in", "nvcc-fatbin")

__all__ = [
    "BURN_TICK_ENV",
    "DCGMI",
    "DCGM_VERSION_PLACEHOLDER",
    "DRIVER_VERSION_PLACEHOLDER",
    "GPU_BURN_FILES",
    "GPU_BURN_TREE",
    "HOSTENGINE_FILE",
    "LOADED_DRIVER_FILE",
    "LSPCI",
    "MOKUTIL",
    "BOOT_MODULES",
    "NVIDIA_SMI",
    "NV_HOSTENGINE",
    "PERSISTENCE_FILE",
    "PERSISTENCED_FILE",
    "PROFILING_MODULE",
    "PROFILING_MODULE_ENV",
    "RUN_DIR",
    "RUN_ENV",
    "STATE_DOC",
    "STATE_ENV",
    "STATE_PATH",
    "dcgm_source",
    "nvidia_smi_source",
]


def nvidia_smi_source(driver_version: str) -> str:
    """The stand-in nvidia-smi script for one driver version, as the package installs it."""
    text = NVIDIA_SMI.read_text(encoding="utf-8")
    if text.count(DRIVER_VERSION_PLACEHOLDER) != 1:
        raise RuntimeError(f"{NVIDIA_SMI} must hold {DRIVER_VERSION_PLACEHOLDER} exactly once")
    return text.replace(DRIVER_VERSION_PLACEHOLDER, driver_version)


def dcgm_source(script: Path, dcgm_version: str) -> str:
    """The stand-in dcgmi or nv-hostengine (``script``) for one DCGM version (e.g. "4.4.1"),
    as the package installs it."""
    text = script.read_text(encoding="utf-8")
    if text.count(DCGM_VERSION_PLACEHOLDER) != 1:
        raise RuntimeError(f"{script} must hold {DCGM_VERSION_PLACEHOLDER} exactly once")
    return text.replace(DCGM_VERSION_PLACEHOLDER, dcgm_version)
