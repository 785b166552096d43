"""The burn-in record (gpubox burnin): present, passed on every GPU, recent enough."""

from __future__ import annotations

import datetime
import json

import pytest

RECORD = "/var/lib/gpubox/burnin.json"


@pytest.mark.quick
def test_burnin_record_passes_and_is_recent(box):
    if not box.config.burnin_required:
        pytest.skip("burnin_required is false in the inventory")
    result = box.run(f"cat {RECORD}")
    assert result.rc == 0, f"{box.name}: no burn-in record ({RECORD}): run gpubox burnin"
    record = json.loads(result.stdout)
    assert record["passed"], f"{box.name}: the last burn-in failed: {record.get('problems')}"
    ok = [g for g, s in record["gpu_burn"]["gpus"].items() if s == "OK"]
    assert len(ok) == box.config.gpu_count, (
        f"{box.name}: the burn-in passed {len(ok)} GPU(s), gpu_count is {box.config.gpu_count}"
    )
    age = datetime.datetime.now(datetime.UTC) - datetime.datetime.fromisoformat(record["date"])
    assert age.days <= box.config.burnin_max_age_days, (
        f"{box.name}: the last burn-in is {age.days} days old "
        f"(burnin_max_age_days {box.config.burnin_max_age_days})"
    )
