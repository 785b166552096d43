"""NVIDIA's CUDA apt repository (the driver, the toolkit and DCGM all come from it)."""

from __future__ import annotations

from typing import Any

from gpubox.config import HostConfig, Target
from gpubox.stages.apt_repo import apt_repo, source_line


def nvidia_repo(config: HostConfig, target: Target, also_changed: list[Any] | None = None) -> None:
    apt_repo(config, "nvidia_cuda", target, f"NVIDIA CUDA ({target.distro})", also_changed)


def cuda_source_line(config: HostConfig, target: Target) -> str:
    return source_line(config, "nvidia_cuda", target)
