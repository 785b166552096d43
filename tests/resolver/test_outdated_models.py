"""gpubox outdated on NVIDIA's repositories as the resolver tier models them (Ubuntu 24.04's and
Debian 12's real driver stanzas re-versioned to NVIDIA's builds 570.195.03, 570.211.01,
580.105.08 and 580.126.09, and cuda-toolkit-12-8 12.8.1-1: tests/resolver/aptmodels.py), asked
with the deploy's own query (gpubox.rules.offers.query_command) run by this machine's apt in a
private root, as a box's apt runs it."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

import aptmodels as models
import pytest
from aptsim import AptRoot

from gpubox.config import HostConfig, Target, target_for
from gpubox.rules import offers, outdated
from gpubox.rules.apt_sources import source_line

TODAY = datetime.date(2026, 12, 4)


def rows_for(tmp: Path, family: str, **data: object) -> list[outdated.Row]:
    """The rows of NVIDIA's repository (the driver, CUDA, DCGM) for a box converged at its pins."""
    root = AptRoot(tmp / "world")
    repo = models.nvidia_ubuntu2404() if family == "ubuntu" else models.nvidia_debian12()
    root.add_repo(repo)
    url = f"file:{root.path / 'repos' / repo.name}/"
    config: HostConfig = models.host_config(
        catalog_overrides={"repos.nvidia_cuda.url": url}, docker_source="distro", **data
    )
    target: Target | None = target_for(models.OS_RELEASE[family], config.catalog)
    assert target is not None
    found = outdated.components(config, target)
    names = outdated.asked(found)["nvidia_cuda"]
    query = offers.query_command(
        "nvidia_cuda", source_line(config, "nvidia_cuda", target), names, "", base=str(tmp / "q")
    )
    done = subprocess.run(["bash", "-c", query], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    index = offers.parse_query(done.stdout.splitlines())
    assert index.error is None, index.error
    driver = config.driver_packages(target.family)
    installed = dict.fromkeys(driver.installed, driver.package_version)
    installed[config.cuda["package"]] = config.cuda["package_version"]
    return [
        outdated.judge("box", config, c, index, installed, TODAY)
        for c in found
        if c.repo == "nvidia_cuda"
    ]


@pytest.mark.parametrize(
    "family, branch, newest, status",
    [
        ("ubuntu", "570", "570.211.01-0ubuntu1", "current"),
        ("ubuntu", "580", "580.126.09-1ubuntu1", "behind"),
        ("debian", "570", "570.211.01-1", "current"),
        ("debian", "580", "580.126.09-1", "behind"),
    ],
)
def test_the_driver_is_judged_within_its_branch(
    tmp_path: Path, family: str, branch: str, newest: str, status: str
) -> None:
    driver, cuda, dcgm = rows_for(tmp_path, family, driver_branch=branch)
    assert (driver.line, driver.newest, driver.status) == (f"{branch}.x", newest, status)
    assert (cuda.line, cuda.newest, cuda.status) == ("12.8.x", "12.8.1-1", "current")
    # the models carry no DCGM: its line is not offered, which is stale (exit 1)
    assert (dcgm.status, dcgm.newest) == ("not offered", None) and dcgm.stale
