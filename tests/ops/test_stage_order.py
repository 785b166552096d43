"""Operations of different stages never share pyinfra's name for them. pyinfra names an
operation by the line numbers of its call stack, not its files: without the stage's position
(run_stages), two stages adding an operation at the same line of their modules got one name,
and a fresh box deployed beside converged ones (the fleet) ordered them in a cycle
("Cycle detected in operation ordering DAG")."""

from __future__ import annotations

import pyinfra
import pytest
from conftest import REFERENCE, fake_host, fresh_box
from pyinfra.api.state import StateStage
from pyinfra.operations import server

from gpubox.stages import run_stages


@pytest.fixture(autouse=True)
def as_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pyinfra command line names operations by their call stack (the API numbers them)."""
    monkeypatch.setattr(pyinfra, "is_cli", True)


def stage_at_line_5(name: str):
    """A stage whose one operation is added at line 5 of its own module (file name ``name``)."""
    code = compile("\n" * 4 + f"server.shell(name={name!r}, commands=['true'])\n", name, "exec")
    return lambda: exec(code, {"server": server})


def test_two_stages_at_the_same_line_get_two_names():
    with fake_host(REFERENCE, fresh_box("debian12")) as fake:
        fake.state.set_stage(StateStage.Prepare)
        run_stages(stage_at_line_5("stages/a.py"), stage_at_line_5("stages/b.py"))
        order = fake.state.get_op_order()
        names = [sorted(fake.state.op_meta[h].names) for h in order]
    assert names == [["stages/a.py"], ["stages/b.py"]]
    assert not any("-" in h for h in order), order  # no duplicate-name suffix: distinct names


def test_the_stage_position_is_dropped_after_the_stages():
    with fake_host(REFERENCE, fresh_box("debian12")) as fake:
        fake.state.set_stage(StateStage.Prepare)
        run_stages(stage_at_line_5("stages/a.py"))
        assert fake.host.loop_position == []
