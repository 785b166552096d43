"""Inventory host data -> ``validate``: each key's type, choices and range, the catalog overrides,
the defaults derived from other keys and the driver/CUDA/GPU rules, every problem at once."""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Callable, Mapping
from typing import Any

from gpubox import catalog
from gpubox.base import compat
from gpubox.config.backend_rules import backend_problems
from gpubox.config.host import ConfigError, HostConfig, Problem
from gpubox.config.keys import KEYS, KEYS_BY_NAME, Key
from gpubox.config.monitoring_rules import monitoring_problems
from gpubox.knowledge import driver_lifecycle, modelscope


def _pyinfra_keys() -> set[str]:
    """Host data keys that belong to pyinfra itself (connectors, global arguments)."""
    from pyinfra.api.arguments import all_argument_meta  # config loads without pyinfra
    from pyinfra.api.connectors import get_all_connectors  # config loads without pyinfra

    keys = set(all_argument_meta)
    for connector in get_all_connectors().values():
        keys.update(getattr(connector, "data_meta", {}) or {})
    return keys


def _type_name(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def _check_type(key: Key, value: Any) -> bool:
    if isinstance(value, bool) and key.type is not bool:
        return False
    if key.type is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if key.type is str and isinstance(value, int | float) and not isinstance(value, bool):
        return False
    return isinstance(value, key.type)


def validate(host: str, data: Mapping[str, Any]) -> tuple[HostConfig | None, list[Problem]]:
    """Check one host's data; return its config (when valid) and every problem found."""
    problems: list[Problem] = []
    pyinfra_keys = _pyinfra_keys()
    values: dict[str, Any] = {}
    # Keys whose value was refused: they take their default below, and every rule that reads
    # one is skipped, so one wrong key is one problem, not a cascade built on a stand-in value.
    invalid: set[str] = set()

    for name, value in data.items():
        if name in pyinfra_keys or name.startswith("_"):
            continue
        key = KEYS_BY_NAME.get(name)
        if key is None:
            near = difflib.get_close_matches(name, list(KEYS_BY_NAME), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            problems.append(Problem(host, name, f"unknown key{hint}"))
            continue
        if value is None:
            continue
        if not _check_type(key, value):
            problems.append(
                Problem(
                    host,
                    name,
                    f"must be {_type_name(key.type)}, got {type(value).__name__} {value!r}",
                )
            )
            invalid.add(name)
            continue
        if key.choices and value not in key.choices:
            choices = ", ".join(repr(c) for c in key.choices)
            problems.append(Problem(host, name, f"must be one of {choices}, got {value!r}"))
            invalid.add(name)
            continue
        if isinstance(value, int | float) and not key.in_range(value):
            problems.append(Problem(host, name, f"must be {key.range_text()}, got {value!r}"))
            invalid.add(name)
            continue
        values[name] = key.normalize(value) if key.normalize else value

    for key in KEYS:
        if key.name not in values and key.derive is None:
            values[key.name] = copy.deepcopy(key.default)

    # The catalog, with this host's overrides (each refused one is reported and left out).
    host_catalog = catalog.load()
    for path, value in values["catalog_overrides"].items():
        message = _override_problem(host_catalog, path, value)
        if message:
            problems.append(Problem(host, "catalog_overrides", message))
            invalid.update(("catalog_overrides", f"catalog_overrides:{path}"))
        else:
            catalog.set_path(host_catalog, path, value)

    # catalog.yml's own lifecycle entries (an override's were screened above).
    for message in driver_lifecycle.problems(host_catalog["driver"]["branches"]):
        problems.append(Problem(host, "catalog", f"catalog.yml: {message}"))

    def valid(*names: str) -> bool:
        """Whether every key a rule reads holds the host's own, accepted value."""
        return invalid.isdisjoint(names)

    for key in KEYS:
        if key.name not in values and key.derive is not None:
            values[key.name] = key.derive(values, host_catalog)

    branches = host_catalog["driver"]["branches"]
    if values["driver_branch"] not in branches:
        if valid("driver_branch"):
            problems.append(
                Problem(
                    host,
                    "driver_branch",
                    f"no catalog entry for branch {values['driver_branch']!r}; "
                    f"known: {', '.join(branches)}",
                )
            )
    elif values["driver_version"] is None:
        values["driver_version"] = branches[values["driver_branch"]]["version"]
    if (
        valid("driver_branch", "driver_version")
        and values["driver_branch"] in branches
        and values["driver_version"]
        and not str(values["driver_version"]).startswith(values["driver_branch"] + ".")
    ):
        problems.append(
            Problem(
                host,
                "driver_version",
                f"{values['driver_version']!r} is not a release of branch "
                f"{values['driver_branch']}",
            )
        )
    if valid("cuda_version") and values["cuda_version"] not in host_catalog["cuda"]["versions"]:
        problems.append(
            Problem(
                host,
                "cuda_version",
                f"no catalog entry for CUDA {values['cuda_version']!r}; "
                f"known: {', '.join(host_catalog['cuda']['versions'])}",
            )
        )
    if valid("gpu_model") and values["gpu_model"] not in compat.GPU_MODELS:
        problems.append(Problem(host, "gpu_model", unknown_gpu_message(values["gpu_model"])))
        invalid.add("gpu_model")
    try:
        branch = int(values["driver_branch"])
    except ValueError:
        problems.append(
            Problem(
                host,
                "driver_branch",
                f"must be a branch number like '570', got {values['driver_branch']!r}",
            )
        )
    else:
        for name, message in compat.check(
            values["gpu_model"],
            branch,
            values["driver_kernel_modules"],
            values["cuda_version"],
            skip=invalid,
        ):
            if not any(p.key == name and p.message == message for p in problems):
                problems.append(Problem(host, name, message))

    problems += backend_problems(host, values, host_catalog, invalid)
    problems += _docker_users_problems(host, values, valid)
    problems += _panel_problems(host, data, values, valid)
    problems += monitoring_problems(host, values, valid)
    problems += _grafana_problems(host, values, valid)
    problems += _advice(host, data, values, valid)

    errors = [p for p in problems if p.severity == "error"]
    config = None if errors else HostConfig(host, values, host_catalog)
    return config, problems


def gpu_model_suggestions(name: str) -> list[str]:
    """The known GPU models a wrong ``gpu_model`` may have meant, nearest first: those that
    have each of its words ("V100", "a100 80gb", "RTX4090": a word matches one or more whole
    words of the model's name, or the start of one; the makers' words NVIDIA, Tesla and
    GeForce are left out), else difflib's nearest names."""

    def words(text: str) -> list[str]:
        found = [re.sub(r"[^a-z0-9]", "", w) for w in re.split(r"[\s_/-]+", text.lower())]
        return [w for w in found if w]

    def matches(word: str, model: list[str]) -> bool:
        for i in range(len(model)):
            if model[i].startswith(word):
                return True
            joined = ""
            for part in model[i:]:
                joined += part
                if joined == word:
                    return True
        return False

    wanted = [w for w in words(name) if w not in MAKERS] or words(name)
    found = [m for m in compat.GPU_MODELS if wanted and all(matches(w, words(m)) for w in wanted)]

    def nearness(model: str) -> float:
        return difflib.SequenceMatcher(None, name.lower(), model.lower()).ratio()

    if found:
        return sorted(found, key=nearness, reverse=True)
    lowered = {m.lower(): m for m in compat.GPU_MODELS}
    near = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.6)
    return [lowered[m] for m in near]


MAKERS = {"nvidia", "tesla", "geforce"}


def unknown_gpu_message(name: str) -> str:
    """gpu_model's problem when gpubox does not know the model: the nearest known ones, or
    every known one."""
    near = gpu_model_suggestions(name)
    if near:
        quoted = [repr(m) for m in near]
        options = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
        return (
            f"unknown GPU model {name!r}; did you mean {options}? (the name as "
            "`nvidia-smi --query-gpu=name --format=csv,noheader` prints it)"
        )
    return f"unknown GPU model {name!r}; known models: {', '.join(sorted(compat.GPU_MODELS))}"


# A user name as useradd accepts one without --badname: no leading digit, dash or dot.
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")


def _docker_users_problems(
    host: str, values: dict[str, Any], valid: Callable[..., bool]
) -> list[Problem]:
    """docker_users: user names (whether each exists is the box's to say, at preflight)."""
    if not valid("docker_users"):
        return []
    bad = [
        u for u in values["docker_users"] if not isinstance(u, str) or not USER_NAME.fullmatch(u)
    ]
    if bad:
        return [
            Problem(
                host,
                "docker_users",
                f"must be a list of user names (like 'alice'), got {', '.join(map(repr, bad))}",
            )
        ]
    twice = sorted({u for u in values["docker_users"] if values["docker_users"].count(u) > 1})
    if twice:
        return [
            Problem(host, "docker_users", f"lists {', '.join(twice)} twice", severity="warning")
        ]
    return []


# 1Panel's rule for the user and the entrance (1Panel-dev/installer install.sh at
# aa4a6bbf24ae0fd938b32294672f5086f940e483, Set_Entrance and Set_Username).
PANEL_NAME = re.compile(r"[a-zA-Z0-9_]{3,30}")
# nv-hostengine's port on the box (gpubox.base.layout.HOSTENGINE_PORT; a unit test keeps
# them equal): the panel must not take it.
HOSTENGINE_PORT = 5555


def _panel_problems(
    host: str, data: Mapping[str, Any], values: dict[str, Any], valid: Callable[..., bool]
) -> list[Problem]:
    """The panel's user, entrance and directory, and a port no other service of the box
    takes (checked only with a panel)."""
    if values["panel"] == "none":
        return []
    found: list[Problem] = []
    for name in ("panel_user", "panel_entrance"):
        value = values[name]
        if valid(name) and value is not None and not PANEL_NAME.fullmatch(value):
            found.append(
                Problem(host, name, f"must be 3 to 30 of a-z, A-Z, 0-9 and _, got {value!r}")
            )
    path = values["panel_dir"]
    if valid("panel_dir") and (
        not re.fullmatch(r"/[A-Za-z0-9._/-]*", path) or path.rstrip("/") == "" or ".." in path
    ):
        found.append(
            Problem(host, "panel_dir", f"must be an absolute directory like '/opt', got {path!r}")
        )
    if valid("panel_port"):
        port = values["panel_port"]
        taken = {
            "api_port": values["api_port"] if valid("api_port") else None,
            "ssh_port": int(data.get("ssh_port") or 22),
            "nv-hostengine (DCGM)": HOSTENGINE_PORT,
        }
        if values["dcgm_exporter"] and valid("dcgm_exporter_port"):
            taken["dcgm_exporter_port"] = values["dcgm_exporter_port"]
        for who, other in taken.items():
            if port == other:
                found.append(
                    Problem(
                        host,
                        "panel_port",
                        f"{port} is also {who}'s port: choose another for the panel",
                    )
                )
    return found


def _grafana_problems(
    host: str, values: dict[str, Any], valid: Callable[..., bool]
) -> list[Problem]:
    """Grafana runs on the fleet's monitor only, beside its Prometheus, on a port of its own."""
    if not values["grafana"]:
        return []
    if values["monitoring"] != "prometheus":
        return [
            Problem(
                host,
                "grafana",
                "Grafana runs on the fleet's monitor: set monitoring 'prometheus' on this host "
                f"too, or grafana False (monitoring is {values['monitoring']!r})",
            )
        ]
    found = []
    if valid("grafana_port"):
        for other in ("prometheus_port", "api_port"):
            if valid(other) and values[other] == values["grafana_port"]:
                found.append(
                    Problem(
                        host,
                        "grafana_port",
                        f"{values['grafana_port']} is also {other}: choose another for Grafana",
                    )
                )
    return found


BACKEND_NAMES = {"llamacpp": "llama.cpp", "vllm": "vLLM"}


def _advice(
    host: str, data: Mapping[str, Any], values: dict[str, Any], valid: Callable[..., bool]
) -> list[Problem]:
    """Warnings: settings that are valid but do nothing, or cannot be what the owner meant."""
    found: list[Problem] = []
    if valid("nvlink", "gpu_count") and values["nvlink"] and values["gpu_count"] == 1:
        said = "is true" if data.get("nvlink") is True else "defaults to true (the reference box)"
        found.append(
            Problem(
                host,
                "nvlink",
                f"{said} but gpu_count is 1: NVLink joins two or more GPUs, and the NVLink "
                'checks would look for links to a peer; set "nvlink": False',
                severity="warning",
            )
        )
    backend = values["backend"]
    if valid("backend") and backend in BACKEND_NAMES:
        for name, value in data.items():
            key = KEYS_BY_NAME.get(name)
            if key is None or value is None or not valid(name):
                continue
            if key.backend is not None and key.backend != backend:
                found.append(
                    Problem(
                        host,
                        name,
                        f"is ignored with backend {backend!r}: only "
                        f"{BACKEND_NAMES[key.backend]} reads it (backend {key.backend!r})",
                        severity="warning",
                    )
                )
    return found


def _override_problem(host_catalog: dict[str, Any], path: Any, value: Any) -> str | None:
    """Why one catalog_overrides entry is refused, or None. A number in the catalog (a model's
    context, weights_gib, sampling) stays a number of the same kind, and is never negative."""
    if not isinstance(path, str):
        return f"keys are dotted catalog paths, got {type(path).__name__} {path!r}"
    try:
        current = catalog.get_path(host_catalog, path)
    except catalog.CatalogError as exc:
        near = difflib.get_close_matches(exc.path, catalog.leaf_paths(), n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return f"{exc}{hint}"
    if isinstance(current, dict):
        return str(catalog.CatalogError(path, "is a section, not a value"))
    if path == "modelscope.endpoint":
        # the modelscope client takes a host and speaks HTTPS only (gpubox.knowledge.modelscope)
        try:
            modelscope.domain(str(value))
        except ValueError as exc:
            return str(exc)
    parts = path.split(".")
    if parts[:2] == ["driver", "branches"] and len(parts) == 5 and parts[3] == "lifecycle":
        # a branch's lifecycle stays well formed (gpubox.knowledge.driver_lifecycle)
        entry = {**host_catalog["driver"]["branches"][parts[2]]["lifecycle"], parts[4]: value}
        found = driver_lifecycle.entry_problems(parts[2], entry)
        if found:
            return "; ".join(found)
    if isinstance(current, int | float) and not isinstance(current, bool):
        whole = isinstance(current, int)
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
            kind = "int" if whole else "int or float"
            return f"{path!r} must be {kind}, got {type(value).__name__} {value!r}"
        if value < 0:
            return f"{path!r} must be at least 0, got {value!r}"
    return None


def load_host_config(host: str, data: Mapping[str, Any]) -> HostConfig:
    config, problems = validate(host, data)
    if config is None:
        raise ConfigError([p for p in problems if p.severity == "error"])
    return config
