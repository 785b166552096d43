"""The watchdog's textfile (issue 31 C2): with a monitor in the inventory, each of its runs
writes gpubox-watchdog.prom for the node exporter's textfile collector: the restarts and the
counted failed probes of its unit, from 0, only growing (kept in its state file), whole (a
temporary name, renamed). Whole runs of the program (``main``) with systemctl stood in, against
the same sockets as tests/unit/test_watchdog.py's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_watchdog import UNIT, Systemctl, frozen, one_run, server, settings_for

from gpubox.knowledge import metrics, watchdog

__all__ = ["frozen", "server"]  # the fixtures, from test_watchdog


def counters(restarts: int, failures: int, passing: int = 0, unit: str = UNIT) -> str:
    """The file as gpubox.knowledge.metrics writes the watchdog's file: its two counters and
    its gauge of the runs in a row that passed."""
    return metrics.exposition(
        [
            ("gpubox_watchdog_restarts_total", {"unit": unit}, restarts),
            ("gpubox_watchdog_probe_failures_total", {"unit": unit}, failures),
            ("gpubox_watchdog_probes_passing", {"unit": unit}, passing),
        ],
        writer=metrics.WATCHDOG,
    )


def with_textfile(url: str, tmp_path: Path) -> dict[str, Any]:
    return {
        **settings_for(url, tmp_path),
        "textfile": str(tmp_path / "tf" / "gpubox-watchdog.prom"),
    }


def test_the_programs_text_is_metrics_py_s():
    """The program imports nothing of gpubox: its names and help must equal metrics.py's."""
    names = [n for n, _ in watchdog.COUNTERS + watchdog.GAUGES]
    assert names == [m.name for m in metrics.of_writer("watchdog")]
    state = {"restarts": 3, "probe_failures": 7, "passing": 2}
    assert watchdog.textfile_text(state, "gpubox-vllm") == counters(3, 7, 2, "gpubox-vllm")
    assert watchdog.textfile_text({}, UNIT) == counters(0, 0)  # from 0


def test_only_failures_that_count_against_the_server_are_counted():
    state = {"probe_failures": 4}
    for action in ("ok", "warmup", "busy", "inactive"):
        assert watchdog.count(state, action)["probe_failures"] == 4, action
    for action in ("failure", "restart"):
        assert watchdog.count(state, action)["probe_failures"] == 5, action


def test_passing_counts_the_runs_in_a_row_that_passed_and_anything_else_resets_it():
    """BackendHung clears after four passes in a row: a warm-up (a restarted server loading),
    a busy server's run or the unit stopped is no pass, so the alert holds through them."""
    state: dict[str, Any] = {}
    seen = []
    for action in ("warmup", "ok", "ok", "ok", "busy", "ok", "failure", "restart", "ok",
                   "inactive", "ok", "ok"):  # fmt: skip
        state = watchdog.count(state, action)
        seen.append(state["passing"])
    assert seen == [0, 1, 2, 3, 0, 1, 0, 0, 1, 0, 1, 2]


def test_a_healthy_run_writes_both_counters_at_zero(server, tmp_path, monkeypatch):
    settings = with_textfile(server, tmp_path)
    monkeypatch.setattr(watchdog.subprocess, "run", Systemctl(5_000_000))
    config = one_run(settings, tmp_path, {})
    assert watchdog.main(["watchdog", str(config)]) == 0
    path = Path(settings["textfile"])
    assert path.read_text() == counters(0, 0, 1)
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert os.listdir(path.parent) == ["gpubox-watchdog.prom"]  # no temporary file left


def test_failures_and_a_restart_grow_the_counters_and_the_state_keeps_them(
    frozen, tmp_path, monkeypatch, capsys
):
    settings = {**with_textfile(frozen, tmp_path), "failures": 2}
    systemctl = Systemctl(5_000_000)
    monkeypatch.setattr(watchdog.subprocess, "run", systemctl)
    config = one_run(settings, tmp_path, {"start_us": 5_000_000, "healthy": True})
    seen = []
    for _ in range(3):
        assert watchdog.main(["watchdog", str(config)]) == 0
        seen.append(Path(settings["textfile"]).read_text())
    # failure 1, then failure 2 = the restart, then (the same start: systemctl stood in) a
    # failure again: every run's probes failed and counted
    assert seen == [counters(0, 1), counters(1, 2), counters(1, 3)]  # no pass: 0
    assert len(systemctl.restarts()) == 1
    state = json.loads(Path(settings["state_file"]).read_text())
    assert (state["restarts"], state["probe_failures"]) == (1, 3)
    capsys.readouterr()


def test_no_textfile_without_a_monitor(server, tmp_path, monkeypatch):
    settings = {**settings_for(server, tmp_path), "textfile": None}
    monkeypatch.setattr(watchdog.subprocess, "run", Systemctl(5_000_000))
    assert watchdog.main(["watchdog", str(one_run(settings, tmp_path, {}))]) == 0
    assert not list(tmp_path.rglob("*.prom"))


def test_a_textfile_that_cannot_be_written_is_a_journal_line_not_a_failed_run(
    server, tmp_path, monkeypatch, capsys
):
    (tmp_path / "blocked").write_text("a file where the directory should be")
    settings = {**settings_for(server, tmp_path), "textfile": str(tmp_path / "blocked" / "x.prom")}
    monkeypatch.setattr(watchdog.subprocess, "run", Systemctl(5_000_000))
    assert watchdog.main(["watchdog", str(one_run(settings, tmp_path, {}))]) == 0
    assert json.loads(Path(settings["state_file"]).read_text())["last_action"] == "ok"
    assert f"<4>cannot write {settings['textfile']}" in capsys.readouterr().out


@pytest.mark.parametrize("restarts", [0, 2])
def test_the_counters_never_go_down_across_runs_that_pass(server, tmp_path, monkeypatch, restarts):
    settings = with_textfile(server, tmp_path)
    monkeypatch.setattr(watchdog.subprocess, "run", Systemctl(5_000_000))
    config = one_run(settings, tmp_path, {"restarts": restarts, "probe_failures": 9})
    for passes in (1, 2):
        assert watchdog.main(["watchdog", str(config)]) == 0
        assert Path(settings["textfile"]).read_text() == counters(restarts, 9, passes)
