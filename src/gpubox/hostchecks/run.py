"""Each check of gpubox.checks on each host of the inventory (see plugin.py)."""

from __future__ import annotations

import pytest

from gpubox import checks


def test_check(box, check: checks.Check | None) -> None:
    if check is None:  # the host cannot be reached: box is the line that says why
        pytest.fail(box, pytrace=False)
    verdict = checks.judge(check, box.name, box.config, box.facts, box.inventory)
    if verdict.status == "skip":
        pytest.skip(verdict.message)
    if verdict.failed:
        # pytrace=False: the message names the host and the part; no traceback, no locals
        pytest.fail(f"{verdict.message}\nfix: {verdict.fix}", pytrace=False)
