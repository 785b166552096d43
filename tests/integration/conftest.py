"""The sandbox integration tier: a fresh box per test module, stopped after it."""

from __future__ import annotations

import json

import pytest

from gpubox import demo, sandbox
from gpubox.sandbox.standin import state as standin_state

STATE_PATH = "/var/lib/gpubox-standin/state.json"


def box_sh(command: str, stdin: str | None = None, check: bool = True, box: int = 1) -> str:
    """Run a shell command in the box (box ``box`` of a fleet); return its stdout."""
    info = sandbox.box_info(sandbox.box.state_dir(box))
    proc = sandbox.ssh(command, check=False, input=stdin, info=info)
    if check and proc.returncode != 0:
        raise AssertionError(f"in the box: {command!r} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


def plant(change, box: int = 1) -> None:
    """Edit the stand-in GPUs' state in the box (box ``box``): change(state) -> None."""
    state = json.loads(box_sh(f"cat {STATE_PATH}", box=box))
    change(state)
    box_sh(
        f"cat > {STATE_PATH}.new && mv {STATE_PATH}.new {STATE_PATH}",
        stdin=standin_state.dumps_state(state),
        box=box,
    )


@pytest.fixture(scope="module")
def sandbox_box():
    demo.sandbox("down", check=False)
    demo.sandbox("up")
    yield
    demo.sandbox("down", check=False)
