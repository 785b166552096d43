"""What a no-op run reads: a fact the stages read more than once while they plan runs its
command once per run (gpubox.infra.host_facts.read_once)."""

from __future__ import annotations

from conftest import REFERENCE, fake_host, fresh_box, spy_commands

from gpubox.infra.host_facts import (
    CommandOutput,
    DockerEngine,
    KernelModuleLoaded,
    LoadedDriver,
    OsRelease,
    UserId,
    prefetch,
    read_once,
)
from gpubox.infra.readahead import MARK


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
    alone = [c for c in commands if MARK not in c]  # the fake answers no batch
    for fact in (DockerEngine(), LoadedDriver()):
        command = fact.command()
        assert sum(command in c for c in alone) == 1, type(fact).__name__


def test_prefetched_facts_are_read_in_one_round_trip_as_get_fact_reads_them(monkeypatch):
    """On this machine (pyinfra's @local connector: read-only commands)."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.connectors.local import LocalConnector
    from pyinfra.context import ctx_host, ctx_inventory, ctx_state

    sent = spy_commands(monkeypatch, LocalConnector)
    specs = [
        (OsRelease, {}),
        (UserId, {}),
        (KernelModuleLoaded, {"module": "gpubox-no-such-module"}),
        (CommandOutput, {"command": "printf 'a  b\\n\\nc'"}),
    ]
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    (local,) = list(inventory)
    with ctx_state.use(state), ctx_inventory.use(inventory), ctx_host.use(local):
        prefetch(*specs)
        assert len(sent) == 1 and MARK in sent[0]
        got = [read_once(cls, **kwargs) for cls, kwargs in specs]
        assert len(sent) == 1  # every answer came from the one round trip
        want = [local.get_fact(cls, **kwargs) for cls, kwargs in specs]
    assert got == want
    assert got[2] is False and got[3] == "a  b\n\nc"
