"""Layer 6, checks: the checks on a box (facts, judges, fixes): verify, doctor, deploy.

One set of checks on a box, used by ``pytest tests/host``, ``gpubox doctor`` and the end of
``deploy/full.py``.

- ``core``: Fact, Check, Finding, Verdict, the lazily read ``Facts`` of a host, ``judge``.
- ``facts``: every command a check or doctor reads on a host, and its parser (a read the
  deploy's pyinfra facts make too is gpubox.knowledge.reads', ``Fact.of``).
- ``driver``, ``secure_boot``, ``cuda``, ``docker``, ``dcgm``, ``tools``, ``backend``,
  ``watchdog``, ``monitoring``, ``panel``: the checks, by stage.

A check's id is "area.what" (``driver.held``); ``ALL`` lists them in stage order."""

from __future__ import annotations

from collections.abc import Iterable

from gpubox.checks import facts as _facts  # noqa: F401  (registers the facts)
from gpubox.checks.backend import CHECKS as _BACKEND
from gpubox.checks.core import (
    FACTS,
    Check,
    Facts,
    Output,
    Recorded,
    Runner,
    Verdict,
    judge,
)
from gpubox.checks.cuda import CHECKS as _CUDA
from gpubox.checks.dcgm import CHECKS as _DCGM
from gpubox.checks.docker import CHECKS as _DOCKER
from gpubox.checks.driver import CHECKS as _DRIVER
from gpubox.checks.monitoring import CHECKS as _MONITORING
from gpubox.checks.panel import CHECKS as _PANEL
from gpubox.checks.secure_boot import CHECKS as _SECURE_BOOT
from gpubox.checks.tools import CHECKS as _TOOLS
from gpubox.checks.watchdog import CHECKS as _WATCHDOG
from gpubox.config import HostConfig

ALL: list[Check] = [
    *_DRIVER,
    *_SECURE_BOOT,
    *_CUDA,
    *_DOCKER,
    *_DCGM,
    *_TOOLS,
    *_BACKEND,
    *_WATCHDOG,
    *_MONITORING,
    *_PANEL,
]
BY_ID = {check.id: check for check in ALL}
assert len(BY_ID) == len(ALL), "two checks share an id"
assert all(name in FACTS for check in ALL for name in check.reads), "a check reads no fact"

__all__ = [
    "ALL",
    "BY_ID",
    "FACTS",
    "Check",
    "Facts",
    "Output",
    "Recorded",
    "Runner",
    "Verdict",
    "judge",
    "run",
    "select",
]


def select(markers: Iterable[str] | None = None, passive: bool = False) -> list[Check]:
    """The checks with one of ``markers`` (all when None); only those that read nothing
    active when ``passive`` (doctor's and the deploy's)."""
    wanted = set(markers) if markers is not None else None
    return [c for c in ALL if (wanted is None or c.marker in wanted) and not (passive and c.active)]


def run(
    checks: Iterable[Check],
    host: str,
    config: HostConfig,
    facts: Facts | Recorded,
    inventory: str = "INVENTORY",
) -> list[Verdict]:
    """Every check's verdict on one host."""
    return [judge(c, host, config, facts, inventory) for c in checks]
