"""Host preflight: read-only checks run before a stage changes anything.

``evaluate`` is pure (config and fact values in, problems out) so every rule is unit-tested;
``run`` gathers the facts with pyinfra and raises DeployRefused on any error.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, NoReturn

from pyinfra import host, logger

from gpubox.base import compat
from gpubox.base.errors import DeployRefused, HostRefused
from gpubox.config import HostConfig, Problem, Target, target_for
from gpubox.infra import readahead, runfile
from gpubox.infra.host_facts import (
    DesktopState,
    DockerEngine,
    KernelModuleLoaded,
    LoadedDriver,
    NvidiaPciDevices,
    OsRelease,
    SecureBoot,
    UserGroups,
    UserId,
    prefetch,
    read_once,
)
from gpubox.infra.runfile import RunfileDriver
from gpubox.plans import driver as driver_plan
from gpubox.preflight import answers, dpkg_ready
from gpubox.preflight.answers import KeptOffers
from gpubox.preflight.driver_kept import KeptDrivers
from gpubox.rules import desktop, offers

GPU_CLASSES = ("0300", "0302")  # VGA compatible controller, 3D controller

# Hosts that passed preflight in this run (every stage preflights; the first one checks).
_passed: weakref.WeakKeyDictionary[Any, dict[str, Target]] = weakref.WeakKeyDictionary()


def evaluate(
    config: HostConfig,
    os_release: Mapping[str, str],
    pci_devices: list[Any],
    uid: int,
    runfile_state: Any = None,  # gpubox.infra.runfile.RunfileState: a driver from NVIDIA's .run
    user_groups: Mapping[str, list[str] | None] | None = None,  # docker_users' (UserGroups)
) -> list[Problem]:
    """The host's problems (errors refuse the run, warnings are logged). Secure Boot is no
    refusal: the driver stage signs the module with DKMS's enrolled key
    (gpubox.knowledge.secure_boot)."""
    name = config.host
    problems: list[Problem] = []

    if uid != 0:
        problems.append(
            Problem(
                name,
                "privileges",
                f"commands run as uid {uid}: connect as root, or set _sudo=True in the host's data "
                "(with passwordless sudo, or _sudo_password)",
            )
        )

    if target_for(os_release, config.catalog) is None:
        supported = ", ".join(k.replace("-", " ") for k in config.catalog["os"])
        found = f"{os_release.get('ID', '?')} {os_release.get('VERSION_ID', '?')}"
        problems.append(
            Problem(name, "os", f"unsupported OS release {found}; supported: {supported}")
        )

    gpus = [d for d in pci_devices if d.vendor_id == "10de" and d.class_code in GPU_CLASSES]
    wanted = config.gpu
    matching = [d for d in gpus if f"{d.vendor_id}:{d.device_id}" in wanted.pci_ids]
    if len(matching) != config.gpu_count:
        found = ", ".join(f"{d.slot} {d.description}" for d in gpus) or "no NVIDIA GPU"
        problems.append(
            Problem(
                name,
                "gpu_count",
                f"lspci shows {len(matching)} {wanted.name} (gpu_count is {config.gpu_count}); "
                f"NVIDIA GPUs found: {found}",
            )
        )
    for device in gpus:
        if device in matching:
            continue
        pci_id = f"{device.vendor_id}:{device.device_id}"
        known = compat.pci_id_architecture(pci_id)
        if known is None:
            problems.append(
                Problem(
                    name,
                    "gpu_model",
                    f"{device.slot} {device.description} [{pci_id}] is not in gpubox's table; "
                    "it may or may not work with the pinned driver",
                    severity="warning",
                )
            )
        elif not compat.branch_supports(known[1], config.branch):
            problems.append(
                Problem(
                    name,
                    "gpu_model",
                    f"{device.slot} {known[0]} ({known[1]}) is not supported by driver branch "
                    f"{config.branch}: it will have no NVIDIA driver (fine for a display card on "
                    "the firmware framebuffer; nouveau is blacklisted)",
                    severity="warning",
                )
            )
        else:
            problems.append(
                Problem(
                    name,
                    "gpu_model",
                    f"{device.slot} {known[0]} is an NVIDIA GPU not declared in the inventory; "
                    "the driver will drive it too",
                    severity="warning",
                )
            )

    if runfile_state is not None:
        problems += runfile.problems(config, runfile_state)
    missing = [u for u in config.docker_users if (user_groups or {}).get(u) is None]
    if missing:
        them = "it" if len(missing) == 1 else "them"
        problems.append(
            Problem(
                name,
                "docker_users",
                f"no user {', '.join(map(repr, missing))} on the box: create {them} first ("
                + "; ".join(f"sudo adduser {u}" for u in missing)
                + f"), or take {them} out of docker_users",
            )
        )
    return problems


def run(config: HostConfig) -> Target:
    """Preflight the current host (once per run): log warnings, raise on errors, return its
    target."""
    passed = _passed.setdefault(host.state, {})
    if host.name in passed:
        return passed[host.name]
    dpkg_ready.prepare(config)  # first: wait for dpkg's locks, recover an interrupted dpkg
    readahead.fill()  # the fact commands of the last run, in one round trip
    users = {"users": tuple(config.docker_users)}
    # the facts preflight and the driver stage read while they plan, in one round trip
    prefetch(
        *((f, {}) for f in (OsRelease, NvidiaPciDevices, UserId, RunfileDriver, DockerEngine)),
        *((f, {}) for f in (KeptOffers, SecureBoot, DesktopState, LoadedDriver)),
        (KernelModuleLoaded, {"module": "nouveau"}),
        (KeptDrivers, {"version": config.driver_version}),
        *([(UserGroups, users)] if config.docker_users else []),
    )
    os_release = read_once(OsRelease)
    problems = evaluate(
        config,
        os_release,
        read_once(NvidiaPciDevices),
        read_once(UserId),
        read_once(RunfileDriver),
        read_once(UserGroups, **users) if config.docker_users else None,
    )
    for problem in problems:
        if problem.severity == "warning":
            logger.warning(f"preflight warning: {problem}")
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        lines = "\n".join(f"  - {p}" for p in errors)
        refuse(f"preflight failed, nothing was changed:\n{lines}")
    target = target_for(os_release, config.catalog)
    assert target is not None
    repository_problems(config, target)
    passed[host.name] = target
    return target


def desktop_report(config: HostConfig) -> Any:
    """Tell the owner, before the first change, what the driver stage will do to the display
    of a desktop (gpubox.rules.desktop.report): nothing is logged on a box that is not one. Returns
    the gpubox.rules.desktop.Desktop it read."""
    seen = read_once(DesktopState)
    lines = desktop.report(
        config,
        seen,
        read_once(LoadedDriver),
        read_once(KernelModuleLoaded, module="nouveau"),
    )
    for line in lines:
        logger.warning(f"{config.host}: display: {line}")
    return seen


def repository_problems(config: HostConfig, target: Target) -> None:
    """Ask the repositories what they offer (gpubox.rules.offers; each only when needed, else its
    kept answer); refuse, nothing changed, when a pinned version or a driver package is not
    there. The stages keep the answers on the box (answers.keep_answers)."""
    sets, indexes = answers.ask(config, target, read_once(DockerEngine))
    for repo, index in indexes.items():
        for warning in index.warnings:
            logger.warning(f"preflight warning: {config.host}: repos.{repo}: {warning}")
    problems = offers.missing(config, sets, indexes)
    cuda_repo = indexes["nvidia_cuda"]
    if cuda_repo.error is None:
        try:
            driver_plan.plan(config, target, cuda_repo.offers)
        except driver_plan.DriverUnavailable as exc:
            problems.append(Problem(config.host, "driver_version", str(exc)))
    elif not any(p.key == "repos.nvidia_cuda" for p in problems):
        problems.append(
            Problem(config.host, "repos.nvidia_cuda", f"cannot read it: {cuda_repo.error}")
        )
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        refuse(
            "preflight failed, nothing was changed: the repositories do not offer what the "
            f"catalog pins:\n{lines}"
        )


def refuse(message: str) -> NoReturn:
    """Refuse the current host. Alone (or the last one left), the run stops with ``message``
    (DeployRefused); among others, the host fails alone: the reason is logged with its name,
    pyinfra marks it failed (none of its operations runs) and HostRefused ends its deploy
    file, while the other hosts go on."""
    state = host.state
    me = {h for h in state.active_hosts if h.name == host.name}  # `host` is a context proxy
    if not me or not state.active_hosts - me:
        raise DeployRefused(message)
    logger.error(f"{host.name}: {message}\n(only {host.name} stops; the other hosts go on)")
    state.fail_hosts(me)
    raise HostRefused(f"{host.name}: {message}")
