"""issue 30 C: the driver stage checks a move after its reboot and plans the way back to the
kept driver (key driver_rollback), from facts read before any change: only on a move, with the
rollback only where the old driver's kept packages are complete and the key is on."""

from __future__ import annotations

import logging

import pytest
from conftest import REFERENCE, fake_host, fresh_box, make_plan
from test_driver_move_plan import BUILD, INSTALLED, KEPT, PV570, SIMULATION, dpkg, kept_answer

from gpubox.base import layout
from gpubox.config import load_host_config, target_for
from gpubox.plans import driver as driver_plan
from gpubox.plans import driver_move
from gpubox.plans import driver_rollback as rollback_plan
from gpubox.rules import driver_rollback as judge
from gpubox.stages import driver as driver_stage

MOVE = {**REFERENCE, "driver_branch": "580"}
CHECK = "Check driver 580.105.08 after the reboot"
QUERY = [
    f"{i}, Tesla V100-SXM2-32GB, GPU-{i}, 00000000:0{5 + i}:00.0, 570.211.01, Enabled, 0, "
    "32768, 35, 41.25, 300.00"
    for i in range(2)
]
NVLINK = [
    line
    for i in range(2)
    for line in [f"GPU {i}: Tesla V100-SXM2-32GB (UUID: GPU-{i})"]
    + [f"\t Link {n}: 25.781 GB/s" for n in range(2)]
    + [f"\t Link {n}: <inactive>" for n in range(2, 6)]
]
KEPT_PIN = f"cat {layout.DRIVER_KEPT_DIR}/570.211.01/apt-preferences"
PIN_NOW = f"cat {layout.DRIVER_PIN}"


def pin_570(os_name: str) -> str:
    """The 570 pin file a deploy wrote (the kept directory's apt-preferences is a copy)."""
    from test_driver_plan import plan_for

    return plan_for(os_name).pin


def moving_box(os_name: str = "debian12", kept: str | None = "now", **more: object) -> dict:
    """A box converged at 570 (loaded), its GPUs and links read by the stage. ``kept``: "now"
    (the installed 570 build is kept by this run first: gpubox.plans.driver_move), "already"
    (complete from an earlier move), None (not kept, and no other build installed to keep)."""
    answers: dict[object, object] = {
        "cat /sys/module/nvidia/version": "570.211.01",
        "nvidia-smi --query-gpu=index,name": QUERY,
        "nvidia-smi nvlink -s": NVLINK,
        KEPT_PIN: pin_570(os_name).splitlines(),
        PIN_NOW: pin_570(os_name).splitlines(),
        "apt-mark showhold": ["nvidia-driver-cuda", "nvidia-kernel-dkms"],
        "apt-mark showauto": ["libcuda1", "zlib1g"],
    }
    if kept:
        answers.update({INSTALLED: dpkg(PV570), SIMULATION: []})
    if kept == "already":
        answers[KEPT] = kept_answer("570.211.01")
    answers.update(more)
    return fresh_box(os_name, **answers)


def check_op(plan) -> tuple[str, list[str]]:
    (found,) = [(n, c) for n, c in plan.ops if CHECK in n]
    return found


@pytest.mark.parametrize(("os_name", "kept"), [("debian12", "now"), ("ubuntu2404", "already")])
def test_a_move_checks_the_new_driver_right_after_its_reboot_and_can_go_back(
    os_name: str, kept: str
):
    plan = make_plan(driver_stage.driver, MOVE, moving_box(os_name, kept))
    name, commands = check_op(plan)
    assert name.endswith(f"{CHECK}, back to 570.211.01 if it fails (driver_rollback)")
    reboot = next(i for i, n in enumerate(plan.names) if "Reboot to load the driver" in n)
    assert plan.names[reboot + 1] == name
    # the check, the rollback (what failed said to it first), the reboot, the check of 570
    assert commands[0].startswith("FunctionCommand(_check,")
    script = commands[1]
    assert script.startswith("why=")
    config = load_host_config("box", MOVE)
    family = "debian" if os_name == "debian12" else "ubuntu"
    new_pv = config.driver_packages(family).package_version
    assert f"awk -v v={new_pv} " in script
    assert f"d={layout.DRIVER_KEPT_DIR}/570.211.01\n" in script
    assert driver_move.repo_command("570.211.01") in script
    # the holds and auto marks before the move, for the kept packages among them
    assert "for n in nvidia-driver-cuda nvidia-kernel-dkms; do " in script
    assert "for n in libcuda1 zlib1g; do " in script
    assert rollback_plan.blacklist_for_pin(pin_570(os_name)) in script
    assert commands[2].startswith("FunctionCommand(_boot_id,")
    assert "systemctl reboot" in commands[3]
    assert commands[4].startswith("FunctionCommand(_wait,")
    assert commands[5].startswith("FunctionCommand(_check_old,")
    assert commands[6].startswith("FunctionCommand(_rolled_back,")


def test_the_state_before_is_read_from_facts_before_any_change(monkeypatch):
    seen: list[dict] = []
    monkeypatch.setattr(
        driver_stage.driver_rollback, "verify_driver_move", lambda **kw: seen.append(kw)
    )
    with fake_host(MOVE, moving_box()) as fake:
        driver_stage.driver()
        assert not fake.host.connector.executed_commands or all(
            "apt-get install" not in c for c in fake.host.connector.executed_commands
        )
    (args,) = seen
    assert args["old"] == "570.211.01" and args["new"] == "580.105.08"
    assert args["before"] == judge.DriverState(
        "570.211.01", 2, None, frozenset({(0, 0), (0, 1), (1, 0), (1, 1)})
    )
    assert args["timeout"] == 900


def test_no_check_on_a_converged_redeploy_or_a_first_install(plan_of):
    at_570 = plan_of(driver_stage.driver, REFERENCE, moving_box())
    at_580 = plan_of(
        driver_stage.driver, MOVE, moving_box(**{"cat /sys/module/nvidia/version": "580.105.08"})
    )
    first = plan_of(driver_stage.driver, MOVE, fresh_box("debian12"))
    for plan in (at_570, at_580, first):
        assert not [n for n in plan.names if "Check driver" in n], plan.names
    assert [n for n in first.names if "Reboot to load the driver" in n]
    assert not [n for n in at_570.names + at_580.names if "Reboot" in n]


def test_without_kept_packages_the_check_has_no_rollback_and_the_warning_says_so(plan_of, caplog):
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        plan = plan_of(driver_stage.driver, MOVE, moving_box(kept=None))
    name, commands = check_op(plan)
    assert name.endswith(CHECK)
    assert [c.split("(")[0] for c in commands] == ["FunctionCommand", "FunctionCommand"]
    assert commands[1].startswith("FunctionCommand(_fail,")
    assert not [c for c in commands if "apt-get" in c or "systemctl reboot" in c]
    assert (
        "@fake/box: the driver moves from 570.211.01 to 580.105.08, and 570.211.01 is not kept "
        f"({layout.DRIVER_KEPT_DIR}/570.211.01): no automatic rollback is possible if 580.105.08 "
        "fails its checks after the reboot"
    ) in caplog.text


def test_with_driver_rollback_false_the_check_fails_the_host_and_does_not_go_back(plan_of):
    plan = plan_of(driver_stage.driver, {**MOVE, "driver_rollback": False}, moving_box())
    name, commands = check_op(plan)
    assert name.endswith(CHECK)
    assert not [c for c in commands if "apt-get" in c or "systemctl reboot" in c]
    assert commands[1].startswith("FunctionCommand(_fail,")


def test_no_check_where_the_moves_reboot_is_not_allowed(plan_of):
    from gpubox.stages import run_stages

    plan = plan_of(
        lambda: run_stages(driver_stage.driver), {**MOVE, "allow_reboot": False}, moving_box()
    )
    assert not [n for n in plan.names if "Check driver" in n or "Reboot" in n]


def test_the_kept_pin_gives_the_blacklist_a_later_deploy_at_570_writes():
    config = load_host_config("box", REFERENCE)
    for os_id, version_id, os_name in [
        ("debian", "12", "debian12"),
        ("ubuntu", "24.04", "ubuntu2404"),
    ]:
        target = target_for({"ID": os_id, "VERSION_ID": version_id}, config.catalog)
        assert target is not None
        from test_driver_plan import offered

        plan = driver_plan.plan(config, target, offered(os_name))
        assert rollback_plan.blacklist_for_pin(plan.pin) == plan.unattended


def test_with_driver_rollback_false_the_failure_names_the_kept_packages_and_the_key(monkeypatch):
    seen: list[dict] = []
    monkeypatch.setattr(
        driver_stage.driver_rollback, "verify_driver_move", lambda **kw: seen.append(kw)
    )
    with fake_host({**MOVE, "driver_rollback": False}, moving_box()):
        driver_stage.driver()
    (args,) = seen
    assert args["rollback"] is None
    assert args["no_rollback"] == (
        "driver_rollback is false: the box stays on 580.105.08, failing; 570.211.01, the driver "
        f"before, is kept in {layout.DRIVER_KEPT_DIR}/570.211.01. To go back, set "
        '"driver_branch" to 570 (or "driver_version" to "570.211.01") in the inventory and '
        "deploy again"
    )


def test_the_box_a_rollback_leaves_changes_nothing_on_a_deploy_at_570():
    """After the rollback: 570 installed and kept, served from the kept repository. The
    driver builds' fact does not list a root of another source (the sandbox's
    nvidia-driver-cuda, found by the fleet test); dpkg's list has it at the pin, so the kept
    packages are not checked and served again (a second deploy changes nothing)."""
    builds = [line for line in dpkg(PV570) if "nvidia-driver-cuda" not in line]
    box = fresh_box(
        "debian12",
        **{
            INSTALLED: builds,
            "dpkg -l": [f"hi  {n}  {PV570}  amd64  driver" for n in BUILD],
            KEPT: kept_answer("570.211.01", repo="570.211.01", source=True),
            "cat /sys/module/nvidia/version": "570.211.01",
        },
    )
    plan = make_plan(driver_stage.driver, REFERENCE, box)
    assert not [n for n in plan.names if "kept" in n.lower()], plan.names
