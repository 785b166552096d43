"""NVIDIA's CUDA apt repository (driver and toolkit both come from it): a signed-by keyring
whose fingerprint the catalog pins, one source file, and apt update only when they changed."""

from __future__ import annotations

import weakref
from typing import Any

from pyinfra import host
from pyinfra.operations import apt
from pyinfra.operations.util import any_changed

from gpubox import operations
from gpubox.config import HostConfig
from gpubox.stages import ManagedFiles, Target

# Hosts whose repository was already handled in this run (driver and cuda both need it).
_done: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def source_line(config: HostConfig, target: Target) -> str:
    repo = config.catalog["repos"]["nvidia_cuda"]
    url = repo["url"].format(distro=target.distro)
    return f"deb [signed-by={repo['keyring']}] {url} {repo['suite']}\n"


def nvidia_repo(config: HostConfig, target: Target, also_changed: list[Any] | None = None) -> None:
    done = _done.setdefault(host.state, set())
    if host.name in done:
        return
    done.add(host.name)
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
    managed = ManagedFiles({repo["source_file"]: source_line(config, target)})
    changed.append(managed.put(f"NVIDIA CUDA repository ({target.distro})", repo["source_file"]))
    apt.update(name="apt update (sources, keys or pins changed)", _if=any_changed(*changed))
