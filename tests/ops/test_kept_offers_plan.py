"""gpubox.preflight.answers: a repository is asked what it offers only when something from it would
be
installed or changed, or its kept answer cannot stand for a new one; otherwise the answer the
first deploy kept on the box is used, and a converged box's run asks no repository."""

from __future__ import annotations

import json

import pytest
from conftest import REFERENCE, fake_host, fresh_box, installed_pins, kept_offers, repo_answers

from gpubox.base.errors import DeployRefused
from gpubox.stages import run_stages
from gpubox.stages.container_toolkit import container_toolkit
from gpubox.stages.cuda import cuda
from gpubox.stages.dcgm import dcgm
from gpubox.stages.docker import docker
from gpubox.stages.driver import driver

KEEP = "Keep the repositories' answers"
ALL = ["docker", "nvidia_container_toolkit", "nvidia_cuda"]


def queried(sent: list[str]) -> list[str]:
    """The repositories the run asked (gpubox.rules.offers' query command)."""
    return sorted(
        {c.split("# gpubox-apt-query ", 1)[1].split()[0] for c in sent if "gpubox-apt-query" in c}
    )


def converged(os_name: str, **overrides: object) -> dict[object, object]:
    return fresh_box(
        os_name,
        **{
            "gpubox-kept-offers": kept_offers(os_name),
            "dpkg -l": installed_pins(os_name),
            **overrides,
        },
    )


def stages() -> None:
    run_stages(driver, cuda, docker, container_toolkit, dcgm)


@pytest.mark.parametrize("os_name", ["ubuntu2404", "debian12"])
def test_a_converged_box_asks_no_repository(plan_of, commands, os_name):
    plan = plan_of(stages, REFERENCE, converged(os_name))
    assert any("gpubox-kept-offers" in c for c in commands)  # the kept answers were read
    assert queried(commands) == []
    assert not [n for n in plan.names if KEEP in n]
    # nothing pinned to install: the kept answers changed nothing (the headers are Debian's)
    assert [p for p in plan.installs() if "=" in p] == []


@pytest.mark.parametrize("os_name", ["ubuntu2404", "debian12"])
def test_a_fresh_box_asks_every_repository_and_keeps_the_answers(plan_of, commands, os_name):
    plan = plan_of(driver, REFERENCE, fresh_box(os_name))
    assert queried(commands) == ALL
    assert len([n for n in plan.names if KEEP in n]) == 1


def test_a_box_missing_a_package_asks_only_its_repository(plan_of, commands):
    dpkg = [line for line in installed_pins("ubuntu2404") if " cuda-toolkit-12-8 " not in line]
    plan = plan_of(stages, REFERENCE, converged("ubuntu2404", **{"dpkg -l": dpkg}))
    assert queried(commands) == ["nvidia_cuda"]
    # the same answer again: the kept file stays as it is
    assert not [n for n in plan.names if KEEP in n]
    assert "cuda-toolkit-12-8=12.8.1-1" in plan.installs()


def test_a_package_at_another_version_asks_its_repository(plan_of, commands):
    dpkg = [
        line.replace("1.17.8-1", "1.17.7-1") if "libnvidia-container1 " in line else line
        for line in installed_pins("ubuntu2404")
    ]
    plan_of(stages, REFERENCE, converged("ubuntu2404", **{"dpkg -l": dpkg}))
    assert queried(commands) == ["nvidia_container_toolkit"]


@pytest.mark.parametrize("repo", ["nvidia_cuda", "nvidia_container_toolkit", "docker"])
def test_a_changed_mirror_url_asks_again(plan_of, commands, repo):
    data = {**REFERENCE, "catalog_overrides": {f"repos.{repo}.url": "http://mirror.example/x"}}
    answers = converged("ubuntu2404")
    plan = plan_of(stages, data, answers)
    assert queried(commands) == [repo]
    assert len([n for n in plan.names if KEEP in n]) == 1  # filed under the new question


def test_a_pin_file_that_differs_asks_nvidia_again(plan_of, commands):
    other = {"/etc/apt/preferences.d/90-gpubox-nvidia-driver": "Package: *\n"}
    kept = kept_offers("ubuntu2404", files=other)
    plan_of(driver, REFERENCE, converged("ubuntu2404", **{"gpubox-kept-offers": kept}))
    assert queried(commands) == ["nvidia_cuda"]


@pytest.mark.parametrize(
    "body",
    [
        '{"format": 1, "repos": {"nvidia_cuda": ',  # cut short
        json.dumps({"format": 99, "repos": {}}),  # another layout
        json.dumps({"format": 1, "repos": {"nvidia_cuda": {"key": "k", "offers": "x"}}}),
    ],
)
def test_an_unreadable_kept_file_asks_every_repository(plan_of, commands, body):
    kept = [line for line in kept_offers("ubuntu2404") if line.startswith("D ")] + ["K", body]
    plan = plan_of(driver, REFERENCE, converged("ubuntu2404", **{"gpubox-kept-offers": kept}))
    assert queried(commands) == ALL
    assert len([n for n in plan.names if KEEP in n]) == 1


def test_a_refused_run_keeps_nothing(commands):
    """The repository asked (a package to install) no longer offers the pin: refused, and the
    kept file is not rewritten (its operation is never added)."""
    dpkg = [line for line in installed_pins("ubuntu2404") if " cuda-toolkit-12-8 " not in line]
    cuda_repo = [
        line
        for line in repo_answers("ubuntu2404")["gpubox-apt-query nvidia_cuda"]
        if not line.startswith("P cuda-toolkit-12-8 ")
    ]
    answers = converged(
        "ubuntu2404",
        **{"dpkg -l": dpkg, "gpubox-apt-query nvidia_cuda": cuda_repo},
    )
    with fake_host(REFERENCE, answers) as fake:
        with pytest.raises(DeployRefused, match="does not offer cuda-toolkit-12-8=12.8.1-1"):
            driver()
        names = [n for meta in fake.state.op_meta.values() for n in meta.names]
    assert queried(commands) == ["nvidia_cuda"]
    assert not [n for n in names if KEEP in n]
