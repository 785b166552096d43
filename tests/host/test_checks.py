"""Each check of gpubox.checks on each host of the inventory (see conftest.py)."""

from __future__ import annotations

import pytest

from gpubox import checks


def test_check(box, check: checks.Check) -> None:
    verdict = checks.judge(check, box.name, box.config, box.facts, box.inventory)
    if verdict.status == "skip":
        pytest.skip(verdict.message)
    if verdict.failed:
        # pytrace=False: the message names the host and the part; no traceback, no locals
        pytest.fail(f"{verdict.message}\nfix: {verdict.fix}", pytrace=False)
