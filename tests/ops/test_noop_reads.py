"""What a no-op run reads: a fact the stages read more than once while they plan runs its
command once per run (gpubox.facts.read_once)."""

from __future__ import annotations

import pytest
from conftest import REFERENCE, fake_host, fresh_box
from pyinfra.connectors.fake import FakeConnector

from gpubox.facts import DockerEngine, KernelModuleLoaded, LoadedDriver, read_once


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []
    real = FakeConnector.run_shell_command

    def spy(self, command, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(str(command))
        return real(self, command, *args, **kwargs)

    monkeypatch.setattr(FakeConnector, "run_shell_command", spy)
    return sent


def test_a_fact_read_twice_while_planning_runs_once_per_run(commands):
    answers = fresh_box("ubuntu2404", **{"test -d /sys/module/nouveau": "yes"})
    with fake_host(REFERENCE, answers):
        first = read_once(KernelModuleLoaded, module="nouveau")
        assert read_once(KernelModuleLoaded, module="nouveau") is first
        assert first is True
        nouveau = [c for c in commands if "/sys/module/nouveau" in c]
        assert len(nouveau) == 1
        read_once(KernelModuleLoaded, module="nvidia")  # other arguments: another command
        assert len([c for c in commands if "/sys/module/nvidia" in c]) >= 1
    # a new run reads again
    with fake_host(REFERENCE, answers):
        read_once(KernelModuleLoaded, module="nouveau")
    assert len([c for c in commands if "/sys/module/nouveau" in c]) == 2


def test_the_driver_and_docker_stages_read_the_shared_facts_once(commands):
    from gpubox.stages import run_stages
    from gpubox.stages.docker import docker
    from gpubox.stages.driver import driver

    with fake_host(REFERENCE, fresh_box("ubuntu2404")):
        run_stages(driver, docker)
    for fact in (DockerEngine(), LoadedDriver()):
        command = fact.command()
        assert sum(command in c for c in commands) == 1, type(fact).__name__
