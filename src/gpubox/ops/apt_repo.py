"""Third-party apt repositories (NVIDIA's CUDA and container toolkit repositories, Docker's):
a signed-by keyring whose fingerprint the catalog pins (never apt-key), one source file, and
`apt update` only when the source, the key or a pin changed. Each repository is handled once
per host and run, whichever stage needs it first. The line itself is gpubox.rules.apt_sources'."""

from __future__ import annotations

import weakref
from typing import Any

from pyinfra import host
from pyinfra.operations.util import any_changed

from gpubox.config import HostConfig, Target
from gpubox.infra import operations
from gpubox.infra.operations import ManagedFiles
from gpubox.preflight import dpkg_ready
from gpubox.rules.apt_sources import placeholders, source_line

_done: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def apt_repo(
    config: HostConfig,
    name: str,
    target: Target,
    label: str,
    also_changed: list[Any] | None = None,
) -> None:
    """Ensure the catalog's repository ``name`` (repos.<name>) on the current host."""
    done = _done.setdefault(host.state, set())
    if f"{host.name}:{name}" in done:
        return
    done.add(f"{host.name}:{name}")
    repo = config.catalog["repos"][name]
    changed = list(also_changed or [])
    if name == "nvidia_cuda" and target.family == "debian":
        # NVIDIA's Debian driver packages need contrib.
        changed.append(
            operations.apt_enable_component(
                name="Enable Debian's contrib archive area", component="contrib"
            )
        )
    changed.append(
        operations.apt_keyring(
            name=f"{label} key (fingerprint pinned)",
            url=repo["key_url"].format(**placeholders(target)),
            dest=repo["keyring"],
            fingerprint=repo["key_fingerprint"],
        )
    )
    managed = ManagedFiles({repo["source_file"]: source_line(config, name, target)})
    changed.append(managed.put(f"{label} repository", repo["source_file"]))
    dpkg_ready.apt_update(
        name=f"apt update ({label}: source, key or pin changed)",
        lock_timeout=config.apt_lock_timeout,
        _if=any_changed(*changed),
    )


def nvidia_repo(config: HostConfig, target: Target, also_changed: list[Any] | None = None) -> None:
    """NVIDIA's CUDA apt repository (the driver, the toolkit and DCGM all come from it)."""
    apt_repo(config, "nvidia_cuda", target, f"NVIDIA CUDA ({target.distro})", also_changed)


def cuda_source_line(config: HostConfig, target: Target) -> str:
    return source_line(config, "nvidia_cuda", target)
