"""NVIDIA's CUDA apt repository (driver and toolkit both come from it): a signed-by keyring
whose fingerprint the catalog pins, one source file, and apt update only when they changed."""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.operations import apt, files
from pyinfra.operations.util import any_changed

from gpubox import operations
from gpubox.config import HostConfig
from gpubox.stages import Target, as_file

# Hosts whose repository was already handled in this run (driver and cuda both need it).
_done: set[str] = set()


def source_line(config: HostConfig, target: Target) -> str:
    repo = config.catalog["repos"]["nvidia_cuda"]
    url = repo["url"].format(distro=target.distro)
    return f"deb [signed-by={repo['keyring']}] {url} {repo['suite']}\n"


def nvidia_repo(config: HostConfig, target: Target, also_changed: list[Any] | None = None) -> None:
    key = f"{id(host.state)}:{host.name}"
    if key in _done:
        return
    _done.add(key)
    repo = config.catalog["repos"]["nvidia_cuda"]
    changed = list(also_changed or [])
    if target.family == "debian":
        changed.append(
            operations.apt_enable_component(
                name="Enable Debian's contrib archive area",
                component="contrib",
            )
        )
    changed.append(
        operations.apt_keyring(
            name="NVIDIA repository key (fingerprint pinned)",
            url=repo["key_url"].format(distro=target.distro),
            dest=repo["keyring"],
            fingerprint=repo["key_fingerprint"],
        )
    )
    changed.append(
        files.put(
            name=f"NVIDIA CUDA repository ({target.distro})",
            src=as_file(source_line(config, target)),
            dest=repo["source_file"],
            mode="0644",
        )
    )
    apt.update(name="apt update (sources, keys or pins changed)", _if=any_changed(*changed))
