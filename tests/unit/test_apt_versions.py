"""Debian version order and version-pattern pins (gpubox.knowledge.apt_versions): the order checked
against dpkg's own `dpkg --compare-versions` where dpkg is installed, on NCCL's real version
strings (as NVIDIA's CUDA repository names its builds) and dpkg's edge cases."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpubox.knowledge import apt_versions

PAIRS = [
    ("2.26.2-1+cuda12.8", "2.25.1-1+cuda12.8"),
    ("2.26.2-1+cuda12.8", "2.9.9-1+cuda12.8"),
    ("2.32.3-1+cuda12.9", "2.26.2-1+cuda12.8"),
    ("2.26.2-1+cuda12.9", "2.26.2-1+cuda12.8"),
    ("2.26.2-2+cuda12.8", "2.26.2-1+cuda12.8"),
    ("1.0", "1.0~rc1"),
    ("1.0~rc1", "1.0~~"),
    ("1:0.9", "2.0"),
    ("1.0a", "1.0"),
    ("1.0+b1", "1.0a"),
    ("1.0-1", "1.0"),
    ("570.211.01-0ubuntu1", "570.211.01-0ubuntu0"),
    ("1.010", "1.9"),
    ("1.0", "1.0"),
]


@pytest.mark.parametrize("a, b", PAIRS)
def test_the_order_is_dpkgs(a, b):
    assert (apt_versions.compare(a, b) > 0) == (a != b)
    assert (apt_versions.compare(b, a) < 0) == (a != b)
    if shutil.which("dpkg"):
        for x, y in ((a, b), (b, a)):
            for op, ours in (
                ("gt", apt_versions.compare(x, y) > 0),
                ("eq", apt_versions.compare(x, y) == 0),
            ):
                theirs = subprocess.run(["dpkg", "--compare-versions", x, op, y]).returncode == 0
                assert ours == theirs, (x, op, y)


def test_a_pattern_matches_the_builds_of_one_cuda_only():
    offered = ["2.25.1-1+cuda12.8", "2.26.2-1+cuda12.8", "2.32.3-1+cuda12.9"]
    assert apt_versions.is_pattern("*+cuda12.8") and not apt_versions.is_pattern("2.26.2-1")
    assert apt_versions.satisfies("*+cuda12.8", offered)
    assert not apt_versions.satisfies("*+cuda12.8", ["2.32.3-1+cuda12.9", "2.26.2-1+cuda12.80"])
    assert apt_versions.satisfies("2.26.2-1+cuda12.8", offered)
    assert not apt_versions.satisfies("2.26.2-1+cuda12", offered)  # exact is exact


def test_resolve_keeps_a_matching_install_else_takes_the_newest_both_packages_offer():
    names = ("libnccl2", "libnccl-dev")
    offered = {
        "libnccl2": ["2.25.1-1+cuda12.8", "2.26.2-1+cuda12.8", "2.27.3-1+cuda12.8"],
        # the -dev package lacks the newest build: both must be installable at one version
        "libnccl-dev": ["2.25.1-1+cuda12.8", "2.26.2-1+cuda12.8", "2.32.3-1+cuda12.9"],
    }
    assert apt_versions.resolve("*+cuda12.8", offered, {}, names) == "2.26.2-1+cuda12.8"
    installed = {"libnccl2": ["2.25.1-1+cuda12.8"], "libnccl-dev": ["2.25.1-1+cuda12.8"]}
    assert apt_versions.resolve("*+cuda12.8", offered, installed, names) == "2.25.1-1+cuda12.8"
    # only one of them installed, or installed from another CUDA's build: the repository decides
    half = {"libnccl2": ["2.25.1-1+cuda12.8"]}
    assert apt_versions.resolve("*+cuda12.8", offered, half, names) == "2.26.2-1+cuda12.8"
    other = {n: ["2.32.3-1+cuda12.9"] for n in names}
    assert apt_versions.resolve("*+cuda12.8", offered, other, names) == "2.26.2-1+cuda12.8"
    assert apt_versions.resolve("*+cuda12.6", offered, {}, names) is None
    # an exact pin is itself, whatever is offered
    assert apt_versions.resolve("2.25.1-1+cuda12.8", {}, {}, names) == "2.25.1-1+cuda12.8"
