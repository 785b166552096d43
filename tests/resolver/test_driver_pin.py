"""The driver stage's pin and install command, answered by apt's real resolver.

Ubuntu 24.04 and Debian 12 archives as recorded, NVIDIA's repository modelled on them (570 and
580 builds, the cuda-drivers metas, cuda-toolkit-12-8), the pin rendered by driver_plan.plan()
from a real HostConfig. Each claim is checked with the pin and, where it matters, shown false
without it.
"""

from __future__ import annotations

import copy
import re
import time

import aptmodels as models
import pytest
from aptmodels import World, build_world, host_config

from gpubox.config import HostConfig
from gpubox.plans import driver as driver_plan

# No conftest.py here: the ops and host tiers import theirs by the name "conftest".


class _WallTime:
    """Prints the tier's wall time in pytest's summary."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.write_line(
            f"resolver tier: {time.monotonic() - self.started:.1f}s wall time "
            "(apt's real resolver in two private apt roots)"
        )


@pytest.fixture(scope="session")
def worlds(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> dict[str, World]:
    """Both private apt roots, built once."""
    request.config.pluginmanager.register(_WallTime(), "resolver-wall-time")
    return {f: build_world(f, tmp_path_factory.mktemp(f"apt-{f}")) for f in ("ubuntu", "debian")}


@pytest.fixture
def ubuntu(worlds: dict[str, World]) -> World:
    worlds["ubuntu"].reset()
    return worlds["ubuntu"]


@pytest.fixture
def debian(worlds: dict[str, World]) -> World:
    worlds["debian"].reset()
    return worlds["debian"]


@pytest.fixture(params=["ubuntu", "debian"])
def world(request: pytest.FixtureRequest, worlds: dict[str, World]) -> World:
    chosen: World = worlds[request.param]
    chosen.reset()
    return chosen


# Package names of NVIDIA driver builds (both distributions' naming).
DRIVER = re.compile(r"^(lib)?nvidia-|^libcuda|^firmware-nvidia|^xserver-xorg-video-nvidia")
# Debian's support packages: sources of their own, from Debian, at their own versions.
DEBIAN_SUPPORT_SOURCES = {"nvidia-support", "glx-alternatives"}
DEBIAN_SUPPORT = {
    "nvidia-support",
    "nvidia-kernel-common",
    "nvidia-installer-cleanup",
    "glx-alternative-nvidia",
    "glx-alternative-mesa",
    "glx-diversions",
    "update-glx",
}

VARIANTS = {
    "570-proprietary": {},
    "570-open": {"gpu_model": "NVIDIA A100-SXM4-80GB"},  # open modules by default
    "580-proprietary": {"driver_branch": "580"},
    "570.195.03-explicit": {"driver_version": "570.195.03"},
}
AFTERWARDS = [
    ["upgrade"],
    ["dist-upgrade"],
    ["upgrade", "--with-new-pkgs"],
    ["install", "nvtop"],
    ["install", "cuda-toolkit-12-8"],
]


def installed_driver(world: World) -> dict[str, str]:
    """Driver packages in the private dpkg status (name: version); the base system's
    libnvidia-egl-wayland1 (Ubuntu's egl-wayland, not a driver build) aside."""
    base = {s.package for s in models.base_status(world.family)}
    return {
        s.package: s.version
        for s in world.root.status()
        if DRIVER.match(s.package) and s.package not in base
    }


def desktop_update(world: World, action: models.Action) -> bool:
    """An NVIDIA-named package of Ubuntu's that is not a driver build (egl-wayland's update):
    the pin lets it through (tests/resolver/test_desktop_driver.py)."""
    return world.family == "ubuntu" and world.source(action) in models.DESKTOP_SOURCES


def pinned_install(world: World, config: HostConfig) -> driver_plan.DriverPlan:
    plan = world.plan(config)
    world.root.set_pin(plan.pin)
    result = world.install(plan)
    assert result.returncode == 0, result
    world.root.apply(result)
    return plan


# (a) The pin and the install command install exactly the pinned driver.


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_install_takes_exactly_the_pinned_driver(world: World, variant: str) -> None:
    config = host_config(**VARIANTS[variant])
    plan = world.plan(config)
    world.root.set_pin(plan.pin)
    result = world.install(plan)
    assert result.returncode == 0, result
    assert not result.removes, result
    installs = result.installs
    for root in plan.install:
        assert installs.get(root) == plan.package_version, (root, result)
    assert not set(plan.refused) & set(installs), result
    branch = config.values["driver_branch"]
    for action in result.actions:
        origin, source = world.origin(action), world.source(action)
        if source in DEBIAN_SUPPORT_SOURCES:
            assert origin == "Debian", action
        elif DRIVER.match(action.package) or origin == models.NVIDIA_ORIGIN:
            # NVIDIA's build at the pinned version: no stub, no other branch, no distro build
            assert (origin, action.version) == (models.NVIDIA_ORIGIN, plan.package_version), (
                action,
                origin,
            )
            assert action.package in plan.pinned
            suffix = re.search(r"-(\d{3})(?:-|$)", action.package)  # Ubuntu's branch suffix
            assert suffix is None or suffix[1] == branch, action
    if world.family == "debian":
        support = {a.package for a in result.actions if a.package in DEBIAN_SUPPORT}
        assert {"nvidia-support", "nvidia-kernel-common", "nvidia-installer-cleanup"} <= support
        for name in ("libcuda1", "nvidia-smi", "nvidia-persistenced", "nvidia-modprobe"):
            assert installs[name] == plan.package_version, name


DISTRO_DRIVER = {  # what a box may run before gpubox: the distribution's own driver
    "ubuntu": ["nvidia-headless-no-dkms-580", "nvidia-dkms-580", "nvidia-utils-580"],
    "debian": ["nvidia-smi", "libcuda1", "nvidia-kernel-dkms", "nvidia-persistenced"],
}
NO_NVIDIA_REPO = "Package: *\nPin: release o=NVIDIA\nPin-Priority: -1\n"


def test_a_box_running_the_distributions_driver_moves_to_the_pinned_one(world: World) -> None:
    world.root.set_pin(NO_NVIDIA_REPO)  # installed before NVIDIA's repository was added
    before = world.root.simulate("install", "--no-install-recommends", *DISTRO_DRIVER[world.family])
    assert before.returncode == 0, before
    assert {world.origin(a) for a in before.actions if DRIVER.match(a.package)} == {
        "Ubuntu" if world.family == "ubuntu" else "Debian"
    }
    world.root.apply(before)
    plan = world.plan(host_config())
    world.root.set_pin(plan.pin)
    result = world.install(plan)
    assert result.returncode == 0, result
    world.root.apply(result)
    left = {
        name: version
        for name, version in installed_driver(world).items()
        if version != plan.package_version and name not in DEBIAN_SUPPORT
    }
    # only the removed build's firmware files, which nothing needs any more (autoremove's)
    assert all(name.startswith("nvidia-firmware-580-") for name in left), (left, result)
    # afterwards only the base's egl-wayland update (Ubuntu's, not a driver build) is left
    upgrade = world.root.simulate("dist-upgrade")
    assert [a for a in upgrade.actions if not desktop_update(world, a)] == [], upgrade


# (b) Once installed, upgrades and other installs leave the driver alone (the pin alone: no
# apt-mark hold in this status).


@pytest.mark.parametrize("command", AFTERWARDS, ids=" ".join)
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_pin_holds_through_upgrades_and_other_installs(
    world: World, variant: str, command: list[str]
) -> None:
    pinned_install(world, host_config(**VARIANTS[variant]))
    before = installed_driver(world)
    result = world.root.simulate(*command)
    assert result.returncode == 0, result
    touched = [
        a
        for a in result.actions
        if (DRIVER.match(a.package) and not desktop_update(world, a)) or a.package in before
    ]
    assert touched == [], result
    world.root.apply(result)
    assert installed_driver(world) == before


@pytest.mark.parametrize(
    "family,command",
    [
        ("ubuntu", ["dist-upgrade"]),
        ("ubuntu", ["upgrade", "--with-new-pkgs"]),
        ("debian", ["upgrade"]),
        ("debian", ["dist-upgrade"]),
        ("debian", ["upgrade", "--with-new-pkgs"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_without_the_pin_the_same_upgrades_move_the_driver(
    worlds: dict[str, World], family: str, command: list[str]
) -> None:
    world = worlds[family]
    world.reset()
    plan = pinned_install(world, host_config())
    world.root.set_pin(None)
    result = world.root.simulate(*command)
    assert result.returncode == 0, result
    moved = {a.package: a.version for a in result.actions if DRIVER.match(a.package)}
    assert moved, result
    assert any(v != plan.package_version for v in moved.values())
    # Ubuntu: to its 570 stubs, which bring 580; Debian: to NVIDIA's newest 580
    assert any(v.startswith("580.") for v in moved.values()), result


def test_with_the_pin_cuda_drivers_cannot_replace_the_installed_driver(world: World) -> None:
    pinned_install(world, host_config())
    before = installed_driver(world)
    result = world.root.simulate("install", "cuda-drivers")
    assert result.returncode != 0, result
    assert installed_driver(world) == before


# (c) Without the pin the trap is real.


def test_without_the_pin_cuda_drivers_installs_the_newest_driver(world: World) -> None:
    result = world.root.simulate("install", "--no-install-recommends", "cuda-drivers")
    assert result.returncode == 0, result
    driver = {n: v for n, v in result.installs.items() if DRIVER.match(n)}
    driver = {n: v for n, v in driver.items() if n not in DEBIAN_SUPPORT}
    assert driver and all(v.startswith("580.") for v in driver.values()), result


def test_without_the_pin_ubuntus_bare_names_install_its_stubs_and_580(ubuntu: World) -> None:
    install, _ = driver_plan.roots(host_config(), "ubuntu")
    result = ubuntu.root.simulate("install", "--no-install-recommends", *install)
    assert result.returncode == 0, result
    installs = result.installs
    # Ubuntu's stub sorts above NVIDIA's 570.211.01-0ubuntu1 ...
    assert installs["libnvidia-compute-570"] == "570.211.01-0ubuntu1.24.04.1"
    stub = next(a for a in result.actions if a.package == "libnvidia-compute-570")
    assert ubuntu.origin(stub) == "Ubuntu"
    # ... and depends on 580
    assert installs["libnvidia-compute-580"].startswith("580.")
    assert installs["nvidia-dkms-580"].startswith("580.")


def test_without_the_pin_debians_bare_names_take_the_newest_build(debian: World) -> None:
    result = debian.root.simulate(
        "install", "--no-install-recommends", "nvidia-driver-cuda", "nvidia-kernel-dkms"
    )
    assert result.returncode == 0, result
    driver = {n: v for n, v in result.installs.items() if DRIVER.match(n)}
    assert driver["nvidia-driver-cuda"] == models.DEBIAN_NEWEST
    assert driver["libcuda1"] == models.DEBIAN_NEWEST


def test_without_the_pin_debians_exact_roots_do_not_install(debian: World) -> None:
    """name=version on the roots alone is not enough: their dependencies follow the newest
    build, and apt gives up."""
    plan = debian.plan(host_config())
    result = debian.install(plan)
    assert result.returncode != 0, result
    assert "580.126.09-1 is to be installed" in result.output


def test_without_the_pin_debian_offers_its_535_build(debian: World) -> None:
    """NVIDIA's repository aside, Debian's own driver is 535 (what the src: refusal
    removes)."""
    policy = debian.root.policy("nvidia-smi")["nvidia-smi"]
    assert {"535.261.03-1", "535.309.01-0+deb12u1"} <= set(policy)
    assert policy["535.309.01-0+deb12u1"] == 500


# (d) Debian: the refusal is by source package; refusing nvidia-* of Debian breaks the install.

OLD_DEBIAN_REFUSAL = [
    "nvidia-*",
    "libnvidia-*",
    "libcuda*",
    "xserver-xorg-video-nvidia*",
    "linux-modules-nvidia-*",
    "linux-objects-nvidia-*",
    "linux-signatures-nvidia-*",
    "firmware-nvidia-gsp",
]


def test_refusing_debians_nvidia_names_fails_the_install(debian: World) -> None:
    config = host_config()
    catalog = copy.deepcopy(config.catalog)
    catalog["driver"]["distro_refused"]["debian"] = OLD_DEBIAN_REFUSAL
    plan = debian.plan(HostConfig(config.host, config.values, catalog))
    debian.root.set_pin(plan.pin)
    result = debian.install(plan)
    assert result.returncode != 0, result
    assert "nvidia-installer-cleanup but it is not installable" in result.output
    assert "nvidia-support but it is not installable" in result.output


def test_the_source_refusal_takes_debians_builds_and_leaves_its_support_packages(
    debian: World,
) -> None:
    """Pinned names aside (a plan offered the roots only), apt refuses every Debian version of
    libcuda1 through ``src:nvidia-graphics-drivers*`` and keeps nvidia-support."""
    config = host_config()
    version = driver_plan.package_version(config, "debian")
    install, refused = driver_plan.roots(config, "debian")
    plan = driver_plan.plan(config, debian.target, {n: [version] for n in install + refused})
    assert "libcuda1" not in plan.pinned
    debian.root.set_pin(plan.pin)
    policy = debian.root.policy("libcuda1", "nvidia-support", "nvidia-kernel-common")
    assert policy["libcuda1"]["535.261.03-1"] == -1
    assert policy["libcuda1"]["535.309.01-0+deb12u1"] == -1
    assert policy["libcuda1"]["570.211.01-1"] == 500  # NVIDIA's: not refused
    assert policy["nvidia-support"] == {"20220217+3~deb12u1": 500}
    assert policy["nvidia-kernel-common"] == {"20220217+3~deb12u1": 500}


def test_ubuntus_stubs_and_580_are_refused(ubuntu: World) -> None:
    plan = ubuntu.plan(host_config())
    ubuntu.root.set_pin(plan.pin)
    policy = ubuntu.root.policy("libnvidia-compute-570", "libnvidia-compute-580", "dkms")
    assert policy["libnvidia-compute-570"] == {
        "570.211.01-0ubuntu1.24.04.1": -1,  # Ubuntu's stub
        "570.211.01-0ubuntu1": 1001,
        "570.195.03-0ubuntu1": -1,
    }
    assert policy["libnvidia-compute-580"]["580.178.04-0ubuntu0.24.04.1"] == -1
    assert policy["dkms"] == {"3.0.11-1ubuntu13": 500}


# (e) A repository without a root at the version: one clear message, before anything.


def test_a_repository_without_the_root_at_the_version_is_refused(debian: World) -> None:
    lacking = models.nvidia_debian12(drop=[("nvidia-driver-cuda", "570.211.01-1")])
    with pytest.raises(driver_plan.DriverUnavailable) as err:
        debian.plan(host_config(), nvidia=lacking)
    message = str(err.value)
    assert message.startswith("resolver-box: ")
    assert "nvidia-driver-cuda (the repository has 570.195.03-1, 580.105.08-1, 580.126.09-1)" in (
        message
    )
    assert "nvidia-kernel-dkms" not in message  # offered: not named
    assert "driver_version" in message
    assert "driver.branches.570.package_version.debian" in message


def test_a_repository_without_the_root_at_all_is_refused(ubuntu: World) -> None:
    lacking = models.nvidia_ubuntu2404(
        drop=[("nvidia-dkms-570", v) for v in (*models.UBUNTU_DRIVERS, models.UBUNTU_NEWEST)]
    )
    with pytest.raises(driver_plan.DriverUnavailable) as err:
        ubuntu.plan(host_config(), nvidia=lacking)
    assert "nvidia-dkms-570 (not in the repository)" in str(err.value)
