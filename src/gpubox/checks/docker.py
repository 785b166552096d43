"""Checks of Docker and the NVIDIA Container Toolkit (deploy/docker.py and
deploy/container_toolkit.py fix them)."""

from __future__ import annotations

import json

from gpubox.base import layout
from gpubox.checks.core import Check, Finding, Reading, Skip
from gpubox.checks.driver import service_up
from gpubox.checks.facts import DAEMON_RELOAD_CONTAINER
from gpubox.config import HostConfig
from gpubox.parsers import ParseError, parse_smi_list

RUNTIME = "nvidia-container-runtime"


def runtime(c: HostConfig, r: Reading) -> str | None:
    info = r.get("docker_info")
    runtimes = sorted(info.get("Runtimes") or {})
    if "nvidia" not in runtimes:
        return f"Docker has no nvidia runtime (runtimes: {', '.join(runtimes)})"
    default = info.get("DefaultRuntime")
    if c.docker_default_runtime_nvidia and default != "nvidia":
        return f"Docker's default runtime is {default}, not nvidia"
    return None


def daemon_json(c: HostConfig, r: Reading) -> list[str]:
    try:
        data = json.loads(r.get("daemon_json"))
    except json.JSONDecodeError as exc:
        return [f"{layout.DAEMON_JSON} is not valid JSON: {exc}"]
    problems = []
    nvidia = (data.get("runtimes") or {}).get("nvidia") or {}
    if nvidia.get("path") != RUNTIME:
        problems.append(f"{layout.DAEMON_JSON} has no nvidia runtime: {data.get('runtimes')}")
    for key, value in c.docker_daemon_options.items():
        if data.get(key) != value:
            problems.append(f"{layout.DAEMON_JSON} {key} is {data.get(key)!r}, not {value!r}")
    mirrors = c.docker_registry_mirrors
    if mirrors and data.get("registry-mirrors") != mirrors:
        problems.append(
            f"{layout.DAEMON_JSON} registry-mirrors is {data.get('registry-mirrors')!r}"
        )
    return problems


def docker_users(c: HostConfig, r: Reading) -> list[str | Finding]:
    """Each user of docker_users is in the docker group."""
    groups = r.get("docker_users")
    problems: list[str | Finding] = []
    for user in c.docker_users:
        if groups.get(user) is None:
            problems.append(
                Finding(
                    f"no user {user!r} on the box (docker_users)",
                    f"sudo adduser {user} (or take {user} out of docker_users); {{deploy}}",
                )
            )
        elif layout.DOCKER_GROUP not in groups[user]:
            problems.append(
                f"{user} is not in the {layout.DOCKER_GROUP} group (groups: "
                f"{' '.join(groups[user])})"
            )
    return problems


def _has_docker_users(c: HostConfig) -> str | None:
    return None if c.docker_users else "docker_users is empty in the inventory"


def pinned_and_held(what: str, catalog_key: str):
    """A judge: the catalog's packages installed at its version, and held."""

    def judge(c: HostConfig, r: Reading) -> list[str]:
        entry = c.catalog[catalog_key]
        packages, version = entry["packages"], entry["version"]
        dpkg, held = r.get("dpkg"), r.get("holds")
        wrong = {
            n: dpkg[n].version if n in dpkg else "not installed"
            for n in packages
            if n not in dpkg or dpkg[n].version != version
        }
        problems = [f"{what} not at {version}: {wrong}"] if wrong else []
        unheld = sorted(set(packages) - held)
        if unheld:
            problems.append(f"{what} not held: {', '.join(unheld)}")
        return problems

    return judge


def _sees_every_gpu(fact: str, what: str):
    def judge(c: HostConfig, r: Reading) -> str | None:
        gpus = r.get(fact)
        if len(gpus) != c.gpu_count:
            return f"{what} sees {len(gpus)} GPU(s), expected {c.gpu_count}"
        return None

    return judge


def cdi_spec(c: HostConfig, r: Reading) -> str | None:
    names = {
        line.strip()
        for line in r.get("cdi_list").splitlines()
        if line.strip().startswith("nvidia.com/gpu=")
    }
    indexes = {n for n in names if n.split("=", 1)[1].isdigit()}
    if len(indexes) != c.gpu_count or "nvidia.com/gpu=all" not in names:
        spec = c.catalog["container_toolkit"]["cdi_spec"]
        return f"the CDI spec ({spec}) names {sorted(names)}, expected {c.gpu_count} GPUs and all"
    return None


def cdi_container(c: HostConfig, r: Reading) -> str | None:
    version = r.get("docker_version")
    major = int(version.split(".")[0]) if version[:1].isdigit() else 0
    if major < 25:
        raise Skip(f"Docker {version} has no CDI device support (Docker 25 or newer)")
    return _sees_every_gpu("container_cdi", "a CDI container")(c, r)


def _listed(text: str) -> list:
    """The GPUs a container's `nvidia-smi -L` lists; none when it fails there (its message,
    "Failed to initialize NVML: Unknown Error" after the reload, is then the finding)."""
    try:
        return parse_smi_list(text)
    except ParseError:
        return []


def keeps_gpus_across_daemon_reload(c: HostConfig, r: Reading) -> str | None:
    """NVIDIA/nvidia-container-toolkit issue 48: containers lost their GPUs after
    `systemctl daemon-reload` with the systemd cgroup driver."""
    sections = r.get("daemon_reload")
    before = _listed(sections.get("before", ""))
    after = _listed(sections.get("after", ""))
    if not before:
        return (
            f"could not start a GPU container ({DAEMON_RELOAD_CONTAINER}): "
            + (sections.get("start", "") + sections.get("before", "")).strip()[-300:]
        )
    if len(before) == len(after) == c.gpu_count:
        return None
    return (
        f"the container saw {len(before)} GPU(s), then {len(after)} after systemctl "
        f"daemon-reload ({sections.get('after', '').strip()[-200:]})"
    )


TOOLKIT = "container_toolkit"

CHECKS = [
    Check(
        "docker.service",
        "Docker is active and enabled",
        "quick",
        ("services",),
        service_up(layout.DOCKER),
        fix="sudo systemctl start docker; {deploy}",
    ),
    Check(
        "docker.users",
        "every user of docker_users is in the docker group",
        "quick",
        ("docker_users",),
        docker_users,
        applies=_has_docker_users,
    ),
    Check(
        "docker.runtime",
        "Docker lists the nvidia runtime",
        "quick",
        ("docker_info",),
        runtime,
        stage=TOOLKIT,
    ),
    Check(
        "docker.daemon-json",
        f"{layout.DAEMON_JSON} holds gpubox's settings",
        "quick",
        ("daemon_json",),
        daemon_json,
        stage=TOOLKIT,
    ),
    Check(
        "toolkit.packages",
        "the container toolkit packages are pinned and held",
        "quick",
        ("dpkg", "holds"),
        pinned_and_held("container toolkit", TOOLKIT),
        stage=TOOLKIT,
    ),
    Check(
        "toolkit.cdi-spec",
        "the CDI spec names every GPU",
        "gpu",
        ("cdi_list",),
        cdi_spec,
        stage=TOOLKIT,
    ),
    Check(
        "docker.gpus-all",
        "a --gpus all container sees every GPU",
        "gpu",
        ("container_all",),
        _sees_every_gpu("container_all", "a --gpus all container"),
        stage=TOOLKIT,
    ),
    Check(
        "docker.cdi-container",
        "a CDI container sees every GPU",
        "gpu",
        ("docker_version", "container_cdi"),
        cdi_container,
        stage=TOOLKIT,
    ),
    Check(
        "docker.daemon-reload",
        "a running container keeps its GPUs across daemon-reload",
        "gpu",
        ("daemon_reload",),
        keeps_gpus_across_daemon_reload,
        stage=TOOLKIT,
    ),
]
