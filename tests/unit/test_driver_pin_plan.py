"""driver_plan: the driver's roots, pinned set, pin file and refusals, from the catalog and what
NVIDIA's repository offers (pure; apt's own answer to the pin is tests/resolver)."""

from __future__ import annotations

import re

import pytest
from helpers import REFERENCE

from gpubox.config import load_host_config, target_for
from gpubox.parsers import parse_stanzas
from gpubox.plans import driver as driver_plan

UBUNTU = {"ID": "ubuntu", "VERSION_ID": "24.04"}
DEBIAN = {"ID": "debian", "VERSION_ID": "12"}

INDEX = """\
# a recording's header: not a stanza
Package: nvidia-driver-cuda
Version: 580.126.09-1
Depends: nvidia-smi (= 580.126.09-1),
 libcuda1 (= 580.126.09-1)

Package: nvidia-driver-cuda
Version: 570.211.01-1

Package: nvidia-smi
Version: 570.211.01-1

Package: nvidia-smi
Version: 580.126.09-1

Package: nvidia-kernel-dkms
Version: 570.211.01-1

Package: nvidia-kernel-open-dkms
Version: 570.211.01-1

Package: cuda-drivers-570
Version: 570.211.01-1

Package: dkms
Version: 3.1.8-1

Package: cuda-toolkit-12-8
Version: 12.8.1-1
"""


def config(**data):
    return load_host_config("gpu1", {**REFERENCE, **data})


def target(config, os_release):
    found = target_for(os_release, config.catalog)
    assert found is not None
    return found


def debian_plan(**data):
    c = config(**data)
    version = driver_plan.package_version(c, "debian")
    install, _ = driver_plan.roots(c, "debian")
    offered = driver_plan.offered_from_stanzas(INDEX, version, install)
    return driver_plan.plan(c, target(c, DEBIAN), offered)


def blocks(pin):
    """The pin's stanzas as (Package names, Pin, Pin-Priority)."""
    return [(s["Package"].split(), s["Pin"], s["Pin-Priority"]) for s in parse_stanzas(pin)]


def test_package_version_is_the_catalogs_for_the_branch_and_family():
    c = config()
    assert driver_plan.package_version(c, "ubuntu") == "570.211.01-0ubuntu1"
    assert driver_plan.package_version(c, "debian") == "570.211.01-1"
    assert driver_plan.package_version(config(driver_branch="580"), "debian") == "580.105.08-1"


def test_an_explicit_driver_version_keeps_the_catalogs_revision():
    c = config(driver_version="570.195.03")
    assert driver_plan.package_version(c, "ubuntu") == "570.195.03-0ubuntu1"
    assert driver_plan.package_version(c, "debian") == "570.195.03-1"


def test_roots_per_family_and_flavour():
    assert driver_plan.roots(config(), "debian") == (
        ["nvidia-driver-cuda", "nvidia-kernel-dkms"],
        ["nvidia-kernel-open-dkms"],
    )
    install, refused = driver_plan.roots(config(gpu_model="NVIDIA A100-SXM4-80GB"), "ubuntu")
    assert "nvidia-dkms-570-open" in install and "nvidia-firmware-570-570.211.01" in install
    assert refused == ["nvidia-dkms-570", "nvidia-kernel-source-570"]


def test_offered_is_every_name_at_the_version_and_the_roots_with_all_their_versions():
    offered = driver_plan.offered_from_stanzas(
        INDEX, "570.211.01-1", ["nvidia-driver-cuda", "nvidia-kernel-dkms", "absent-root"]
    )
    assert offered == {
        "cuda-drivers-570": ["570.211.01-1"],
        "nvidia-driver-cuda": ["580.126.09-1", "570.211.01-1"],
        "nvidia-kernel-dkms": ["570.211.01-1"],
        "nvidia-kernel-open-dkms": ["570.211.01-1"],
        "nvidia-smi": ["570.211.01-1", "580.126.09-1"],
    }
    # a root at another version only is still listed, with what the repository has
    assert driver_plan.offered_from_stanzas(INDEX, "570.1-1", ["nvidia-driver-cuda"]) == {
        "nvidia-driver-cuda": ["580.126.09-1", "570.211.01-1"]
    }


def test_debian_plan_pins_what_nvidia_builds_at_the_version_and_refuses_the_rest():
    plan = debian_plan()
    assert plan.package_version == "570.211.01-1"
    assert plan.install == ["nvidia-driver-cuda", "nvidia-kernel-dkms"]
    assert plan.refused == ["nvidia-kernel-open-dkms"]
    # neither the other flavour nor a driver meta is pinned to 1001
    assert plan.pinned == ["nvidia-driver-cuda", "nvidia-kernel-dkms", "nvidia-smi"]
    assert "cuda-drivers-570" in plan.forbidden and "cuda-drivers" in plan.forbidden
    assert plan.distro_refused == ["src:nvidia-graphics-drivers*"]
    assert blocks(plan.pin) == [
        (plan.pinned, "version 570.211.01-1", "1001"),
        (plan.pinned, "version *", "-1"),
        (["nvidia-kernel-open-dkms"], "version *", "-1"),
        (["src:nvidia-graphics-drivers*"], "release o=Debian", "-1"),
        # Debian's backports archive has an Origin of its own
        (["src:nvidia-graphics-drivers*"], "release o=Debian Backports", "-1"),
    ]
    patterns = re.findall(r'^\s+"(.*)";$', plan.unattended, re.M)
    for name in plan.pinned + plan.refused:
        assert any(re.fullmatch(p, name) for p in patterns), name
    assert not any(re.fullmatch(p, "dkms") for p in patterns)


def test_ubuntu_plan_refuses_ubuntus_driver_builds_by_source_package():
    c = config()
    version = driver_plan.package_version(c, "ubuntu")
    install, refused = driver_plan.roots(c, "ubuntu")
    offered = {name: [version, "570.211.01-0ubuntu1.24.04.1"] for name in install + refused}
    plan = driver_plan.plan(c, target(c, UBUNTU), offered)
    assert plan.pinned == sorted(install)
    *_, distro = blocks(plan.pin)
    assert distro[1:] == ("release o=Ubuntu", "-1")
    assert distro[0] == [
        "src:nvidia-graphics-drivers-*",
        "src:linux-restricted-modules*",
        "linux-modules-nvidia-*",
        "linux-objects-nvidia-*",
        "linux-signatures-nvidia-*",
    ]
    # never every NVIDIA name: a desktop's egl-wayland, nvidia-settings, ... are not refused
    assert not {"nvidia-*", "libnvidia-*"} & set(distro[0])


def test_the_distro_refusal_is_a_catalog_entry():
    overrides = {"catalog_overrides": {"driver.distro_refused.debian": ["src:other*"]}}
    plan = debian_plan(**overrides)
    assert blocks(plan.pin)[-2:] == [
        (["src:other*"], "release o=Debian", "-1"),
        (["src:other*"], "release o=Debian Backports", "-1"),
    ]


def test_a_root_not_offered_at_the_version_names_each_one_and_the_keys():
    c = config()
    offered = {"nvidia-driver-cuda": ["580.126.09-1", "570.195.03-1"]}
    with pytest.raises(driver_plan.DriverUnavailable) as err:
        driver_plan.plan(c, target(c, DEBIAN), offered)
    message = str(err.value)
    assert message.startswith("gpu1: NVIDIA's debian12 repository does not offer driver ")
    assert "570.211.01 as 570.211.01-1" in message
    assert "nvidia-driver-cuda (the repository has 580.126.09-1, 570.195.03-1)" in message
    assert "nvidia-kernel-dkms (not in the repository)" in message
    assert "driver_version" in message
    assert "catalog_overrides: driver.branches.570.package_version.debian" in message
    assert "driver.packages.debian" in message


def test_the_open_flavours_root_must_be_offered_too():
    c = config(gpu_model="NVIDIA A100-SXM4-80GB")
    offered = {"nvidia-driver-cuda": ["570.211.01-1"], "nvidia-kernel-dkms": ["570.211.01-1"]}
    with pytest.raises(driver_plan.DriverUnavailable, match="nvidia-kernel-open-dkms"):
        driver_plan.plan(c, target(c, DEBIAN), offered)
