"""gpubox.infra.outcome: gpubox deploy exits 4 when every failed host stopped on purpose (waiting
for its owner), 1 when any failed otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_state

from gpubox.infra import outcome
from gpubox.remote import reach


def written(path: Path, stopped: list[str], failed: list[str]) -> str:
    path.write_text(json.dumps({"stopped": stopped, "failed": failed}))
    return str(path)


@pytest.mark.parametrize(
    ("stopped", "failed", "rc", "want"),
    [
        (["a"], ["a"], 1, reach.WAITING),
        (["a", "b"], ["a"], 1, reach.WAITING),
        (["a"], ["a", "b"], 1, reach.DEVIATES),  # b failed for another reason
        ([], ["a"], 1, reach.DEVIATES),
        ([], [], 0, reach.OK),
        ([], [], 2, reach.BAD_INPUT),
    ],
)
def test_the_exit_code(tmp_path: Path, stopped, failed, rc, want) -> None:
    assert outcome.exit_code(written(tmp_path / "o.json", stopped, failed), rc) == want


def test_without_the_file_a_failure_is_1(tmp_path: Path) -> None:
    assert outcome.exit_code(str(tmp_path / "none.json"), 1) == reach.DEVIATES
    (tmp_path / "bad.json").write_text("{")
    assert outcome.exit_code(str(tmp_path / "bad.json"), 1) == reach.DEVIATES


def test_the_run_writes_its_stopped_and_failed_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "o.json"
    monkeypatch.setenv(outcome.ENV, str(path))
    monkeypatch.setattr(outcome, "_stopped", set())
    monkeypatch.setattr(outcome, "_registered", True)  # no atexit hook from a test
    outcome.stopped("gpu1")
    state = SimpleNamespace(failed_hosts=[SimpleNamespace(name="gpu1")])
    with ctx_state.use(state):
        outcome.write()
    assert json.loads(path.read_text()) == {"stopped": ["gpu1"], "failed": ["gpu1"]}
    assert outcome.exit_code(str(path), 1) == reach.WAITING


def test_a_plain_pyinfra_run_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(outcome.ENV, raising=False)
    outcome.write()
    assert list(tmp_path.iterdir()) == []


def test_a_real_pyinfra_run_that_stops_on_purpose_gives_4(tmp_path: Path) -> None:
    """pyinfra on @local (the stop's command only prints and exits 1): the deploy records the
    host as stopped and failed, and the code is 4."""
    import os
    import subprocess
    import sys

    deploy = tmp_path / "stop.py"
    deploy.write_text(
        "from gpubox.infra import operations\n"
        "from gpubox.base.errors import HostStopped\n"
        "from gpubox.stages import run_stages\n\n\n"
        "def stage():\n"
        '    operations.fail(name="Waiting for the owner", message="enroll the key")\n'
        '    raise HostStopped("stopped")\n\n\n'
        "run_stages(stage)\n"
    )
    path = tmp_path / "o.json"
    env = {**os.environ, outcome.ENV: str(path), "GPUBOX_READAHEAD": "0"}
    pyinfra = Path(sys.executable).with_name("pyinfra")
    run = subprocess.run(
        [str(pyinfra), "-y", "@local", str(deploy)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1, run.stderr[-2000:]
    assert json.loads(path.read_text()) == {"stopped": ["@local"], "failed": ["@local"]}
    assert outcome.exit_code(str(path), run.returncode) == reach.WAITING
