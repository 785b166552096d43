"""gpubox's own metrics (knowledge/metrics.py): Prometheus's naming rules, the textfile's text,
the driver branch's end of life as a time, and docs/monitoring.md listing every one.
(`promtool check metrics` lints them too: tests/unit/test_alert_rules.py.)"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
from test_alert_rules import run as promtool_run

from gpubox.knowledge import driver_lifecycle, metrics

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("metric", metrics.METRICS, ids=lambda m: m.name)
def test_every_metric_follows_prometheus_naming(metric: metrics.Metric) -> None:
    assert re.fullmatch(r"gpubox_[a-z0-9_]+", metric.name), metric.name
    assert metric.type in (metrics.COUNTER, metrics.GAUGE)
    assert metric.name.endswith("_total") == (metric.type == metrics.COUNTER), metric.name
    if "timestamp" in metric.name:
        assert metric.name.endswith("_timestamp_seconds"), metric.name
    # the host label is the scrape configuration's, never the file's
    assert metrics.HOST_LABEL not in metric.labels
    assert metric.help.endswith("."), metric.name


def test_the_names_are_unique() -> None:
    names = [m.name for m in metrics.METRICS]
    assert len(names) == len(set(names))


def test_exposition_writes_help_and_type_once_in_the_tables_order() -> None:
    text = metrics.exposition(
        [
            ("gpubox_watchdog_restarts_total", {"unit": "gpubox-llama-server"}, 2),
            ("gpubox_gpus_expected", {}, 2),
            ("gpubox_model_download_bytes", {"model": 'a "b"\\c'}, 1.5e9),
            ("gpubox_watchdog_restarts_total", {"unit": "gpubox-vllm"}, 0),
        ]
    )
    assert text == (
        "# HELP gpubox_gpus_expected GPUs the inventory says the box has (its gpu_count).\n"
        "# TYPE gpubox_gpus_expected gauge\n"
        "gpubox_gpus_expected 2\n"
        "# HELP gpubox_watchdog_restarts_total Restarts of the API server's unit by gpubox's "
        "watchdog.\n"
        "# TYPE gpubox_watchdog_restarts_total counter\n"
        'gpubox_watchdog_restarts_total{unit="gpubox-llama-server"} 2\n'
        'gpubox_watchdog_restarts_total{unit="gpubox-vllm"} 0\n'
        "# HELP gpubox_model_download_bytes Bytes of the model's file downloaded so far.\n"
        "# TYPE gpubox_model_download_bytes gauge\n"
        'gpubox_model_download_bytes{model="a \\"b\\"\\\\c"} 1500000000\n'
    )


def test_exposition_refuses_an_unknown_name_or_wrong_labels() -> None:
    with pytest.raises(ValueError, match="gpubox_gpus_missing is not one of gpubox's metrics"):
        metrics.exposition([("gpubox_gpus_missing", {}, 1)])
    with pytest.raises(ValueError, match=r"gpubox_gpus_expected takes the labels \[\]"):
        metrics.exposition([("gpubox_gpus_expected", {"host": "box1"}, 1)])
    with pytest.raises(ValueError, match=r"takes the labels \['unit'\], got \[\]"):
        metrics.exposition([("gpubox_watchdog_restarts_total", {}, 1)])


def test_end_of_life_is_the_end_of_its_month() -> None:
    def utc(year: int, month: int) -> float:
        return datetime.datetime(year, month, 1, tzinfo=datetime.UTC).timestamp()

    assert metrics.end_of_life_timestamp("2028-06") == utc(2028, 7)
    assert metrics.end_of_life_timestamp("2026-12") == utc(2027, 1)
    assert metrics.end_of_life_timestamp(None) == 0.0


def test_end_of_life_agrees_with_the_lifecycles_months_left() -> None:
    """A branch is past its end of life (months_left < 0) exactly when its end-of-life time
    has passed at the start of the month."""
    life = driver_lifecycle.Lifecycle("535", "long-term support", "2026-06", None, "test")
    for year, month in ((2026, 5), (2026, 6), (2026, 7)):
        today = datetime.date(year, month, 1)
        start = datetime.datetime(year, month, 1, tzinfo=datetime.UTC).timestamp()
        months_left = life.months_left(today)
        assert months_left is not None
        assert (metrics.end_of_life_timestamp(life.eol) <= start) == (months_left < 0)


def test_docs_monitoring_md_lists_every_metric() -> None:
    text = (ROOT / "docs" / "monitoring.md").read_text(encoding="utf-8")
    for metric in metrics.METRICS:
        labels = "{" + ",".join(metric.labels) + "}" if metric.labels else ""
        assert f"`{metric.name}{labels}` | {metric.type} |" in text, metric.name


# --- one file per writer (issue 31 C1)


def test_each_metric_has_one_writer_and_each_writer_its_own_file() -> None:
    assert set(metrics.TEXTFILE_NAME) == {
        metrics.CONFIG,
        metrics.DEPLOY,
        metrics.WATCHDOG,
        metrics.BOX,
    }
    files = list(metrics.TEXTFILE_NAME.values())
    assert len(set(files)) == len(files)
    assert all(re.fullmatch(r"gpubox-[a-z]+\.prom", f) for f in files), files
    owned = [m.name for w in metrics.TEXTFILE_NAME for m in metrics.of_writer(w)]
    assert sorted(owned) == sorted(m.name for m in metrics.METRICS)  # each in exactly one


def test_the_writers_own_what_the_contract_gives_them() -> None:
    names = lambda w: {m.name for m in metrics.of_writer(w)}  # noqa: E731
    assert names(metrics.WATCHDOG) == {
        "gpubox_watchdog_restarts_total",
        "gpubox_watchdog_probe_failures_total",
        "gpubox_watchdog_probes_passing",
    }
    assert names(metrics.DEPLOY) == {
        "gpubox_deploy_last_run_timestamp_seconds",
        "gpubox_deploy_last_run_success",
        "gpubox_deploy_last_success_timestamp_seconds",
        "gpubox_checks_last_success_timestamp_seconds",
    }
    assert names(metrics.BOX) == {
        "gpubox_reboot_pending",
        "gpubox_reboot_pending_since_timestamp_seconds",
        "gpubox_model_download_bytes",
        "gpubox_model_download_size_bytes",
        "gpubox_model_volume_info",
    }
    assert names(metrics.CONFIG) == {
        "gpubox_gpus_expected",
        "gpubox_driver_branch_end_of_life_timestamp_seconds",
        "gpubox_output_tokens_per_second_floor",
    }


def test_a_writers_exposition_refuses_another_writers_metric() -> None:
    text = metrics.exposition([("gpubox_reboot_pending", {}, 1)], writer=metrics.BOX)
    assert text.endswith("gpubox_reboot_pending 1\n")
    with pytest.raises(ValueError, match=r"gpubox_gpus_expected is written by config "):
        metrics.exposition([("gpubox_gpus_expected", {}, 2)], writer=metrics.BOX)
    with pytest.raises(ValueError, match="not one of gpubox's textfile writers"):
        metrics.of_writer("gpubox")


def test_read_values_reads_back_a_files_unlabelled_samples() -> None:
    text = metrics.exposition(
        [
            ("gpubox_deploy_last_run_success", {}, 0),
            ("gpubox_deploy_last_success_timestamp_seconds", {}, 1764838800.5),
            ("gpubox_model_download_bytes", {"model": "m"}, 3),
        ]
    )
    assert metrics.read_values(text + "garbage\nx y\n") == {
        "gpubox_deploy_last_run_success": 0.0,
        "gpubox_deploy_last_success_timestamp_seconds": 1764838800.5,
    }
    assert metrics.read_values("") == {}


@pytest.mark.parametrize("writer", list(metrics.TEXTFILE_NAME))
def test_each_writers_file_passes_promtools_lint(writer: str) -> None:
    """`promtool check metrics` on each file as its writer writes it (make promtool)."""
    samples = [(m.name, {k: "x" for k in m.labels}, 1.0) for m in metrics.of_writer(writer)]
    done = promtool_run("check", "metrics", stdin=metrics.exposition(samples, writer=writer))
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout
