"""Third-party apt repositories (NVIDIA's CUDA and container toolkit repositories, Docker's):
a signed-by keyring whose fingerprint the catalog pins (never apt-key), one source file, and
`apt update` only when the source, the key or a pin changed. Each repository is handled once
per host and run, whichever stage needs it first."""

from __future__ import annotations

import weakref
from typing import Any

from pyinfra import host
from pyinfra.operations.util import any_changed

from gpubox import dpkg_ready, operations
from gpubox.config import HostConfig, Target
from gpubox.stages import ManagedFiles

_done: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def placeholders(target: Target, os_release: dict[str, str] | None = None) -> dict[str, str]:
    codename = (os_release or {}).get("VERSION_CODENAME") or {
        "ubuntu-24.04": "noble",
        "debian-12": "bookworm",
    }.get(f"{target.os_id}-{target.version_id}", "")
    return {
        "distro": target.distro,
        "os_id": target.os_id,
        "version_id": target.version_id,
        "codename": codename,
    }


def source_line(config: HostConfig, name: str, target: Target) -> str:
    repo = config.catalog["repos"][name]
    values = placeholders(target)
    url = repo["url"].replace("$(ARCH)", "\0").format(**values).replace("\0", "$(ARCH)")
    suite = repo["suite"].format(**values)
    component = f" {repo['component']}" if repo.get("component") else ""
    return f"deb [signed-by={repo['keyring']}] {url} {suite}{component}\n"


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
