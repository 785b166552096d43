"""Layer 3, configuration: every inventory key, its rules, and the typed HostConfig.

Every host data key gpubox reads: name, type, default and a one-line doc, declared once.

Inventory host data -> ``validate`` (all problems at once) -> ``HostConfig`` (typed, defaults
and catalog values resolved). The stages and the host checks both read a ``HostConfig``, so
deploy and verify can never disagree about what the box should be.

- ``keys``: the key table (``KEYS``, ``KEYS_BY_NAME``, ``Key``) and the defaults derived from
  other keys;
- ``validation``: ``validate`` (each key's type, choices and range, catalog overrides, the
  driver/CUDA/GPU rules) and ``load_host_config``;
- ``backend_rules``: the model and backend rules (vLLM, llama.cpp, whether the model fits);
- ``attributes``: ``KeyValue`` (a key's typed attribute) and ``fields_source``, the text of
  ``fields.py`` (``KeyFields``: one typed attribute per key, generated from the table), which
  ``HostConfig`` inherits;
- ``host``: ``HostConfig``, ``DriverPackages``, ``Problem``, ``ConfigError``, ``Target`` and
  ``target_for``.

Every public name is re-exported here: ``from gpubox.config import HostConfig``.
"""

from __future__ import annotations

from gpubox.config.attributes import KeyValue, fields_source
from gpubox.config.fields import KeyFields
from gpubox.config.host import (
    ConfigError,
    DriverPackages,
    HostConfig,
    Problem,
    Target,
    target_for,
)
from gpubox.config.keys import KEYS, KEYS_BY_NAME, LLAMA_SPLIT_MODES, MODEL_REPO, Key
from gpubox.config.monitoring_rules import fleet_problems
from gpubox.config.validation import load_host_config, validate

__all__ = [
    "fleet_problems",
    "KEYS",
    "KEYS_BY_NAME",
    "LLAMA_SPLIT_MODES",
    "MODEL_REPO",
    "ConfigError",
    "DriverPackages",
    "HostConfig",
    "Key",
    "KeyFields",
    "KeyValue",
    "Problem",
    "Target",
    "fields_source",
    "load_host_config",
    "target_for",
    "validate",
]
