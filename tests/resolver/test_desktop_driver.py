"""An Ubuntu 24.04 desktop under gpubox's driver pin, answered by apt's real resolver.

(B) The pin refuses Ubuntu's driver builds by source package, so a desktop's NVIDIA-named
packages that are not driver builds (egl-wayland, egl-gbm, egl-x11, nvidia-settings,
nvidia-prime) keep their updates; refused by name (the pin before), they froze.
(E) A box running Ubuntu's own driver (nvidia-driver-580's desktop stack, nvidia-driver-470):
installing the pinned roots removes exactly Ubuntu's driver build, and the product's own
simulation (gpubox.preflight.driver_replacement.simulate_command) lists those removals.

The recorded noble stanzas, plus the written ones of ubuntu-noble-desktop-extra.Packages
(tests/fixtures/apt/README.md says which fields are guesses).
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import aptmodels as models
import pytest
from aptmodels import World, build_world, host_config
from aptsim import Stanza

from gpubox.config import HostConfig
from gpubox.plans import driver as driver_plan
from gpubox.preflight import driver_replacement


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world("ubuntu", tmp_path_factory.mktemp("apt-desktop"))


@pytest.fixture
def desktop(world: World) -> World:
    """A desktop: the base, and its NVIDIA-named non-driver packages at their release
    versions; no pin."""
    world.root.set_status(models.desktop_status())
    world.root.set_pin(None)
    return world


# The pin's Ubuntu refusal before: by name.
OLD_UBUNTU_REFUSAL = [
    "nvidia-*",
    "libnvidia-*",
    "libcuda*",
    "xserver-xorg-video-nvidia*",
    "linux-modules-nvidia-*",
    "linux-objects-nvidia-*",
    "linux-signatures-nvidia-*",
]
UPDATES = {  # noble-updates' newer builds (egl-gbm/egl-x11: written stanzas, versions guessed)
    "libnvidia-egl-wayland1": "1:1.1.13-1ubuntu0.1",
    "nvidia-settings": "510.47.03-0ubuntu4.24.04.1",
    "libnvidia-egl-gbm1": "1.1.2.1-1ubuntu0.24.04.1",
    "libnvidia-egl-xcb1": "1.0.1-1ubuntu0.24.04.1",
    "libnvidia-egl-xlib1": "1.0.1-1ubuntu0.24.04.1",
}
NO_NVIDIA_REPO = "Package: *\nPin: release o=NVIDIA\nPin-Priority: -1\n"


def with_refusal(config: HostConfig, patterns: list[str]) -> HostConfig:
    catalog = copy.deepcopy(config.catalog)
    catalog["driver"]["distro_refused"]["ubuntu"] = patterns
    return HostConfig(config.host, config.values, catalog)


def install_held(world: World, config: HostConfig) -> driver_plan.DriverPlan:
    """The driver stage's install under its pin, applied, the roots held (apt-mark hold)."""
    plan = world.plan(config)
    world.root.set_pin(plan.pin)
    result = world.install(plan)
    assert result.returncode == 0, result
    world.root.apply(result)
    world.root.set_status(
        s.replace(Status="hold ok installed") if s.package in plan.install else s
        for s in world.root.status()
    )
    return plan


def status_of(world: World) -> dict[str, Stanza]:
    return {s.package: s for s in world.root.status()}


# (B) ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("refusal", ["by-source", "by-name"])
def test_a_desktops_nvidia_named_packages_upgrade_under_the_pin(
    desktop: World, refusal: str
) -> None:
    config = host_config()
    if refusal == "by-name":
        config = with_refusal(config, OLD_UBUNTU_REFUSAL)
    plan = install_held(desktop, config)
    driver = {
        name: s.version
        for name, s in status_of(desktop).items()
        if s.version == plan.package_version
    }
    assert set(plan.install) <= set(driver)
    result = desktop.root.simulate("upgrade")
    assert result.returncode == 0, result
    desktop.root.apply(result)
    after = status_of(desktop)
    # the driver is left alone either way
    assert {n: after[n].version for n in driver} == driver, result
    assert not set(driver) & {a.package for a in result.actions}, result
    assert after["nvidia-prime"].version == "0.8.17.2"  # noble has no newer one
    if refusal == "by-source":  # gpubox's catalog: every update goes through
        assert {n: after[n].version for n in UPDATES} == UPDATES, result
    else:  # the pin before: all frozen at the release
        assert {n: after[n].version for n in UPDATES} == {
            n: models.DESKTOP_RELEASE[n] for n in UPDATES
        }, result


def test_the_source_refusal_still_refuses_every_ubuntu_driver_build(world: World) -> None:
    plan = world.plan(host_config())
    assert plan.distro_refused[:2] == [
        "src:nvidia-graphics-drivers-*",
        "src:linux-restricted-modules*",
    ]
    world.root.set_pin(plan.pin)
    policy = world.root.policy(
        "libnvidia-compute-570",
        "nvidia-driver-580",
        "nvidia-driver-470",
        "linux-modules-nvidia-580-generic",
        "linux-signatures-nvidia-6.8.0-90-generic",
        "libnvidia-egl-wayland1",
        "nvidia-settings",
    )
    assert policy["libnvidia-compute-570"]["570.211.01-0ubuntu1.24.04.1"] == -1  # the stub
    assert policy["libnvidia-compute-570"]["570.211.01-0ubuntu1"] == 1001  # NVIDIA's
    assert policy["nvidia-driver-580"]["580.178.04-0ubuntu0.24.04.1"] == -1
    assert set(policy["nvidia-driver-470"].values()) == {-1}
    assert set(policy["linux-modules-nvidia-580-generic"].values()) == {-1}
    assert set(policy["linux-signatures-nvidia-6.8.0-90-generic"].values()) == {-1}
    assert set(policy["libnvidia-egl-wayland1"].values()) == {500}
    assert set(policy["nvidia-settings"].values()) == {500}


# (E) ----------------------------------------------------------------------------------------

UBUNTU_DRIVERS = {  # what Additional Drivers installs, and the source of its build
    "nvidia-driver-580": "nvidia-graphics-drivers-580",
    "nvidia-driver-470": "nvidia-graphics-drivers-470",
}
DESKTOP_KEPT = ("libnvidia-egl-wayland1", "nvidia-settings", "nvidia-prime")


def ubuntus_driver(world: World, meta: str) -> set[str]:
    """Install Ubuntu's driver meta (before NVIDIA's repository existed); its build's
    packages."""
    world.root.set_pin(NO_NVIDIA_REPO)
    result = world.root.simulate("install", "--no-install-recommends", meta)
    assert result.returncode == 0, result
    world.root.apply(result)
    return {s.package for s in world.root.status() if s.source == UBUNTU_DRIVERS[meta]}


@pytest.mark.parametrize("meta", UBUNTU_DRIVERS)
def test_the_pinned_install_removes_exactly_ubuntus_driver_build(desktop: World, meta: str) -> None:
    build = ubuntus_driver(desktop, meta)
    assert meta in build and len(build) > 10
    plan = desktop.plan(host_config())
    desktop.root.set_pin(plan.pin)
    result = desktop.install(plan)
    assert result.returncode == 0, result
    removed = desktop.root and {a.package for a in result.actions if a.kind == "Remv"}
    # Ubuntu's build goes, save a firmware file package nothing needs (autoremove's)
    assert removed == {n for n in build if not n.startswith("nvidia-firmware-")}, result
    assert not set(DESKTOP_KEPT) & removed
    installed = result.installs
    assert all(installed[n] == plan.package_version for n in plan.install)


def _host_tree(world: World, where: Path) -> dict[str, str]:
    """A host's apt state for simulate_command, from the world: Ubuntu's sources and lists
    only (no NVIDIA repository yet), the NVIDIA lists where preflight's repository query keeps
    them, the world's dpkg status."""
    lists = world.root.path / "lists"
    state, etc, base = where / "var-lib-apt", where / "etc-apt", where / "apt-query"
    (state / "lists").mkdir(parents=True)
    (etc / "sources.list.d").mkdir(parents=True)
    (base / "nvidia_cuda" / "lists").mkdir(parents=True)
    nvidia = "nvidia-ubuntu2404"
    for f in lists.iterdir():
        if f.is_file():
            target = base / "nvidia_cuda" / "lists" if nvidia in f.name else state / "lists"
            os.link(f, target / f.name)
    sources = (world.root.path / "sources.list").read_text().splitlines()
    (etc / "sources.list").write_text("\n".join(s for s in sources if nvidia not in s) + "\n")
    (etc / "sources.list.d" / "cuda.list").write_text("deb [signed-by=/x.gpg] file:/gone/ ./\n")
    line = next(s for s in sources if nvidia in s)
    return {
        "source_line": line.replace("[trusted=yes]", "[signed-by=/usr/share/keyrings/k.gpg]"),
        "base": str(base),
        "state": str(state),
        "etc": str(etc),
        "status": str(world.root.status_file),
        "skip_source": str(etc / "sources.list.d" / "cuda.list"),
    }


@pytest.mark.parametrize("meta", UBUNTU_DRIVERS)
def test_the_products_simulation_lists_those_removals(
    desktop: World, meta: str, tmp_path: Path
) -> None:
    build = ubuntus_driver(desktop, meta)
    desktop.root.set_pin(None)
    plan = desktop.plan(host_config())
    tree = _host_tree(desktop, tmp_path)
    script = driver_replacement.simulate_command(
        tree.pop("source_line"),
        plan.pin,
        [f"{n}={plan.package_version}" for n in plan.install],
        tree.pop("base"),
        **tree,
    )
    env = {**os.environ, "APT_CONFIG": str(desktop.root.path / "apt.conf")}
    done = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0
    simulation = driver_replacement.parse_simulation(done.stdout.splitlines())
    assert simulation.error is None, done.stdout
    removed = {name for name, _ in simulation.removed}
    assert removed == {n for n in build if not n.startswith("nvidia-firmware-")}, done.stdout
    assert not set(DESKTOP_KEPT) & removed
    # the host's own apt state is untouched: its status and lists as they were
    assert not list(Path(tree["state"]).glob("lists/*Packages*")) or all(
        "nvidia-ubuntu2404" not in p.name for p in Path(tree["state"]).glob("lists/*")
    )
    installed = {s.package: s.version for s in desktop.root.status()}
    assert installed[meta].startswith(("580.", "470."))
