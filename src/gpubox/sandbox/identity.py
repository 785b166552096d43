"""Which sandbox box: the ``Box`` value (its number, name, network namespace, SSH port and
state directory) and the one place that says which box this process works on.

Up to MAX_BOXES boxes run at once (gpubox sandbox up --boxes N). Box 1 is "gpubox-sandbox";
box k is "gpubox-sandbox-k", with its own network namespace, state directory, root
filesystem copy, SSH port, stand-in GPU state and hostname; the caches are shared. The parts
of the sandbox take a ``Box``; the entry points (``box.up``, ``box.down``, ``box_info``,
``ssh``, the faults) default to ``current()``: box 1, or $GPUBOX_SANDBOX_BOX in our child
processes, or what ``use_box(k)`` chose (``gpubox sandbox ... --box K``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpubox.sandbox.common import SandboxError

BOX_ENV = "GPUBOX_SANDBOX_BOX"
MAX_BOXES = 4
BASE_NAME = "gpubox-sandbox"
BASE_SSH_PORT = 2222
SSH_USER = "root"
SSH_HOST = "127.0.0.1"


def box_name(k: int) -> str:
    return BASE_NAME if k == 1 else f"{BASE_NAME}-{k}"


@dataclass(frozen=True)
class Box:
    """One box of the sandbox: ``Box.of(k)``."""

    number: int
    name: str  # machine name, network namespace, ssh host alias, hostname
    netns_path: Path
    ssh_port: int

    @classmethod
    def of(cls, k: int) -> Box:
        if not 1 <= k <= MAX_BOXES:
            raise SandboxError(f"box {k}: the sandbox has boxes 1 to {MAX_BOXES}")
        name = box_name(k)
        return cls(k, name, Path("/run/netns") / name, BASE_SSH_PORT + k - 1)

    def state_dir(self) -> Path:
        """$GPUBOX_STATE_DIR or ~/.local/state/gpubox/sandbox for box 1; the same with "-k"
        for box k (read when asked: tests point it elsewhere)."""
        env = os.environ.get("GPUBOX_STATE_DIR")
        base = Path(env) if env else Path.home() / ".local" / "state" / "gpubox" / "sandbox"
        return base if self.number == 1 else base.with_name(f"{base.name}-{self.number}")


def _box_from_env() -> int:
    value = os.environ.get(BOX_ENV, "1")
    return int(value) if value.isdigit() else 1


_current = Box.of(_box_from_env())


def current() -> Box:
    """The box this process works on."""
    return _current


def use_box(k: int) -> Box:
    """Make box ``k`` (1..MAX_BOXES) the one this process works on; returns it."""
    global _current
    _current = Box.of(k)
    return _current


def state_dir(k: int | None = None) -> Path:
    """Box ``k``'s state directory (the current box's by default)."""
    return (current() if k is None else Box.of(k)).state_dir()


def netns_argv(argv: Sequence[str], netns: str | None = None) -> list[str]:
    """``argv`` run inside a box's network namespace (the current box's by default)."""
    return ["ip", "netns", "exec", netns or current().name, *argv]
