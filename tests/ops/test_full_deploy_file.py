"""The full deploy as pyinfra runs it: deploy/full.py of a checkout runs the packaged
src/gpubox/deploy/full.py, and $GPUBOX_STAGES (gpubox deploy --stage) plans only the stages it
names, the same operations as those stages alone."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest
from conftest import REFERENCE, fresh_box

from gpubox.commands import deploying
from gpubox.stages import dcgm as dcgm_stage
from gpubox.stages import run_stages
from gpubox.stages import tools as tools_stage

CHECKOUT = Path(__file__).resolve().parents[2] / "deploy" / "full.py"
QUIET = {**REFERENCE, "verify_after_deploy": False}  # the closing checks read the box


def commands(plan) -> list[str]:
    """The plan's commands, an upload's in-memory file without its address."""
    return [re.sub(r" at 0x[0-9a-f]+", "", c) for c in plan.commands]


def test_the_checkout_file_plans_the_stages_named(plan_of, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(deploying.STAGES_ENV, "tools,dcgm")
    through_file = plan_of(
        lambda: runpy.run_path(str(CHECKOUT)), REFERENCE, fresh_box("ubuntu2404")
    )
    alone = plan_of(
        lambda: run_stages(dcgm_stage.dcgm, tools_stage.tools), REFERENCE, fresh_box("ubuntu2404")
    )
    assert commands(through_file) == commands(alone)
    assert any("datacenter-gpu-manager" in c for c in through_file.commands)


def test_without_a_selection_every_stage_is_planned(plan_of, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(deploying.STAGES_ENV, raising=False)
    some = plan_of(lambda: run_stages(dcgm_stage.dcgm), REFERENCE, fresh_box("ubuntu2404"))
    monkeypatch.setenv(deploying.STAGES_ENV, "dcgm")
    only = plan_of(lambda: runpy.run_path(str(CHECKOUT)), REFERENCE, fresh_box("ubuntu2404"))
    monkeypatch.delenv(deploying.STAGES_ENV)
    full = plan_of(lambda: runpy.run_path(str(CHECKOUT)), QUIET, fresh_box("ubuntu2404"))
    assert commands(only) == commands(some)
    assert len(full.names) > len(only.names)
    assert any("gpubox-model-download" in c for c in full.commands)  # the first stage
    assert any("datacenter-gpu-manager" in c for c in full.commands)
