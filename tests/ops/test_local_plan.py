"""The driver stage when the deploy runs on the box itself (pyinfra's @local connector): a
reboot there would end the run that asked for it, so the stage installs the driver and stops
before the reboot (exit 4 from gpubox deploy), saying to reboot and run again.

The fake box stands in for @local: its host is given the local connector's class, which is
what the stage reads (pyinfra's Host.connector_cls; the commands still go to the fake
connector, so nothing runs on this machine)."""

from __future__ import annotations

import re

from conftest import REFERENCE, fresh_box
from pyinfra import host
from pyinfra.api import Inventory
from pyinfra.connectors.local import LocalConnector

from gpubox.infra import outcome
from gpubox.stages import driver as driver_stage
from gpubox.stages import run_stages

STOP = "Stop before the reboot: the deploy runs on this box (@local)"


def local_driver_plan(plan_of, data, answers):
    def as_local() -> None:
        host.connector_cls = LocalConnector
        run_stages(driver_stage.driver)

    return plan_of(as_local, data, answers)


def test_at_local_the_driver_installs_then_stops_where_the_reboot_was(plan_of, monkeypatch):
    stopped: list[str] = []
    monkeypatch.setattr(outcome, "stopped", stopped.append)
    plan = local_driver_plan(plan_of, REFERENCE, fresh_box("ubuntu2404"))
    assert [n for n in plan.names if "Install NVIDIA driver" in n]
    assert not [n for n in plan.names if "Reboot" in n]
    assert plan.names[-1].endswith(STOP)  # the last operation: no stage after it
    (command,) = plan.op(re.escape(STOP))
    assert "sudo systemctl reboot" in command and "run the deploy again" in command
    assert command.endswith("exit 1")
    assert stopped == ["@fake/box"]  # recorded: gpubox deploy exits 4 (infra/outcome.py)


def test_at_local_with_the_driver_loaded_nothing_stops(plan_of):
    answers = fresh_box(
        "ubuntu2404",
        **{"cat /sys/module/nvidia/version": "570.211.01", "test -d /sys/module/nouveau": "no"},
    )
    plan = local_driver_plan(plan_of, REFERENCE, answers)
    assert not [n for n in plan.names if "Stop" in n or "Reboot" in n]


def test_allow_reboot_false_stops_for_the_owner_at_local_as_on_any_box(plan_of, monkeypatch):
    """allow_reboot false is a stop for the owner too (exit 4): the driver is installed, the
    reboot is theirs."""
    stopped: list[str] = []
    monkeypatch.setattr(outcome, "stopped", stopped.append)
    for stage in (
        lambda data, answers: local_driver_plan(plan_of, data, answers),
        lambda data, answers: plan_of(lambda: run_stages(driver_stage.driver), data, answers),
    ):
        plan = stage({**REFERENCE, "allow_reboot": False}, fresh_box("ubuntu2404"))
        assert plan.names[-1].endswith("Stop: a reboot is needed")
        assert not [n for n in plan.names if STOP in n]
    assert stopped == ["@fake/box", "@fake/box"]


def test_an_ssh_box_still_reboots(plan_of):
    plan = plan_of(lambda: run_stages(driver_stage.driver), REFERENCE, fresh_box("ubuntu2404"))
    assert [n for n in plan.names if "Reboot to load the driver" in n]
    assert not [n for n in plan.names if STOP in n]


def test_pyinfra_gives_an_at_local_host_the_local_connector():
    """What the stage reads is what pyinfra sets for `pyinfra @local ...` (or an inventory
    whose host is "@local"), without connecting."""
    (local,) = list(Inventory((["@local"], {})))
    assert local.name == "@local"
    assert issubclass(local.connector_cls, LocalConnector)
    (ssh,) = list(Inventory((["192.0.2.10"], {})))
    assert not issubclass(ssh.connector_cls, LocalConnector)
