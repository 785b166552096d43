"""Layer 1, leaves: every pinned version, URL, checksum and key fingerprint.

The catalog: every pinned version, URL, checksum and key fingerprint (catalog.yml).

A host may override any leaf of the catalog with the ``catalog_overrides`` host data key,
which maps a dotted path to a new value (mirrors: ``{"repos.nvidia_cuda.url": "..."}``).
"""

from __future__ import annotations

import copy
import functools
from importlib import resources
from typing import Any

import yaml


class CatalogError(ValueError):
    def __init__(self, path: str, why: str = "does not exist"):
        self.path = path
        super().__init__(f"catalog entry {path!r} {why}")


@functools.cache
def _load() -> dict[str, Any]:
    text = resources.files("gpubox").joinpath("catalog.yml").read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise TypeError("catalog.yml must be a mapping")
    return data


def load(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The catalog with a host's overrides applied (a fresh copy each call)."""
    data = copy.deepcopy(_load())
    for path, value in (overrides or {}).items():
        set_path(data, path, value)
    return data


def leaf_paths(data: dict[str, Any] | None = None, prefix: str = "") -> list[str]:
    """Every dotted path to a scalar leaf (the keys ``catalog_overrides`` accepts)."""
    data = _load() if data is None else data
    paths: list[str] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            paths.extend(leaf_paths(value, path + "."))
        else:
            paths.append(path)
    return paths


def _walk(data: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The mapping holding the leaf at ``path`` and the leaf's key. Keys may hold dots
    themselves ("12.8", "ubuntu-24.04"): the longest key that matches wins."""
    parts = path.split(".")
    node: Any = data
    i = 0
    while True:
        if not isinstance(node, dict):
            raise CatalogError(path)
        for j in range(len(parts), i, -1):
            key = ".".join(parts[i:j])
            if key in node:
                if j == len(parts):
                    return node, key
                node, i = node[key], j
                break
        else:
            raise CatalogError(path)


def get_path(data: dict[str, Any], path: str) -> Any:
    node, key = _walk(data, path)
    return node[key]


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    node, key = _walk(data, path)
    if isinstance(node[key], dict):
        raise CatalogError(path, "is a section, not a value")
    node[key] = value
