"""run_stages, what every deploy file does: a host refused among several (HostRefused) skips
its remaining stages without stopping the run; any other refusal stops the run as before."""

from __future__ import annotations

import pytest

from gpubox.base.errors import DeployRefused, HostRefused, HostStopped
from gpubox.stages import run_stages


@pytest.fixture(autouse=True)
def _no_readahead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUBOX_READAHEAD", "0")  # no pyinfra host here to read ahead on


def test_a_host_refused_among_others_skips_its_remaining_stages():
    ran = []

    def refused() -> None:
        ran.append("driver")
        raise HostRefused("box3: preflight failed")

    run_stages(refused, lambda: ran.append("cuda"))
    assert ran == ["driver"]


def test_a_lone_refusal_still_stops_the_run():
    def refused() -> None:
        raise DeployRefused("preflight failed, nothing was changed")

    with pytest.raises(DeployRefused, match="nothing was changed"):
        run_stages(refused)


def test_every_stage_runs_in_order():
    ran: list[str] = []
    run_stages(lambda: ran.append("a"), lambda: ran.append("b"))
    assert ran == ["a", "b"]


def test_a_host_stopped_on_purpose_plans_no_further_stage():
    ran = []

    def stopped() -> None:
        ran.append("driver")
        raise HostStopped("box: enroll the signing key first")

    run_stages(stopped, lambda: ran.append("cuda"))
    assert ran == ["driver"]
