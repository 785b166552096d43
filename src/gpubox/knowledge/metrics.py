"""gpubox's own Prometheus metrics, defined once: each one's name, type, help and labels, and the
text the node exporter's textfile collector reads (``exposition``). The alert rules
(``files/monitoring/alerts.yml``) and docs/monitoring.md name these metrics; a test keeps the
three equal. Pure: values and times are passed in.

The contract with the monitoring stage (issue 31 A), which writes and scrapes these:

- **The ``host`` label.** No metric here carries a ``host`` label of its own. The scrape
  configuration, generated from the inventory, sets a ``host`` target label on every target of a
  box (its node exporter, its dcgm-exporter, its backend's /metrics) to the inventory's name for
  the box, so every series, and every alert built on them, carries it. The rules join a box's
  series with ``on (host)``.
- **The jobs.** The scrape configuration names its jobs ``JOB_NODE``, ``JOB_DCGM`` and
  ``JOB_BACKEND`` (below); the rules select ``up`` by them.
- **The files, one per writer.** Each metric belongs to exactly one writer, and each writer
  writes its own file (``TEXTFILE_NAME``: writer -> file name) in the node exporter's
  textfile directory (Debian's package reads /var/lib/prometheus/node-exporter), whole, to a
  temporary name and renamed, as the collector asks; the collector reads every ``*.prom``
  there, and no metric is in two files. The writers: ``config`` (the monitoring stage, from
  the keys), ``deploy`` (the deploy's final checks), ``watchdog`` (the watchdog's program, at
  each run) and ``box`` (knowledge/box_metrics.py, run by a timer on the box).
- **The ``unit`` label** is the backend's unit as the watchdog names it
  (``base/layout.py``'s ``BACKEND_UNITS``: ``gpubox-llama-server``, ``gpubox-vllm``).
- **Counters stay counters.** ``gpubox_watchdog_restarts_total`` and
  ``gpubox_watchdog_probe_failures_total`` are written from the start at 0 and only grow
  (kept in the watchdog's state file), so that ``increase()`` sees the first restart.
  ``gpubox_watchdog_probes_passing`` is a gauge: the watchdog's runs in a row that passed.

Base units throughout (seconds, bytes), times as Unix timestamps in seconds
(``_timestamp_seconds``), ``_total`` only on counters, as Prometheus's naming guide asks."""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# The scrape jobs of the monitoring stage's configuration (issue 31 A).
JOB_NODE = "node"
JOB_DCGM = "dcgm"
JOB_BACKEND = "backend"
JOBS = (JOB_NODE, JOB_DCGM, JOB_BACKEND)
# The target label that names the box, set by the scrape configuration on every target.
HOST_LABEL = "host"
# The writers of these metrics, and each one's file in the textfile collector's directory.
CONFIG = "config"  # the monitoring stage (ManagedFiles: changes only when keys change)
DEPLOY = "deploy"  # the deploy's final checks (gpubox.stages.verify)
WATCHDOG = "watchdog"  # the watchdog's program (knowledge/watchdog.py), at each run
BOX = "box"  # knowledge/box_metrics.py, run by gpubox-box-metrics.timer
TEXTFILE_NAME = {
    CONFIG: "gpubox-config.prom",
    DEPLOY: "gpubox-deploy.prom",
    WATCHDOG: "gpubox-watchdog.prom",
    BOX: "gpubox-box.prom",
}
# The output tokens/s floor's fixed default, for the key that sets it (issue 31 A): the rules
# read the floor from gpubox_output_tokens_per_second_floor, not from this constant.
OUTPUT_TOKENS_PER_SECOND_FLOOR = 5.0

COUNTER = "counter"
GAUGE = "gauge"


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # COUNTER or GAUGE
    help: str
    labels: tuple[str, ...] = ()
    writer: str = CONFIG  # who writes it: one of TEXTFILE_NAME's keys


METRICS: tuple[Metric, ...] = (
    Metric(
        "gpubox_gpus_expected",
        GAUGE,
        "GPUs the inventory says the box has (its gpu_count).",
        writer=CONFIG,
    ),
    Metric(
        "gpubox_watchdog_restarts_total",
        COUNTER,
        "Restarts of the API server's unit by gpubox's watchdog.",
        ("unit",),
        writer=WATCHDOG,
    ),
    Metric(
        "gpubox_watchdog_probe_failures_total",
        COUNTER,
        "Watchdog runs whose probes of the API (/health, a one-token completion) failed.",
        ("unit",),
        writer=WATCHDOG,
    ),
    Metric(
        "gpubox_watchdog_probes_passing",
        GAUGE,
        "Watchdog runs in a row whose probes of the API passed (0 after a failed probe, a "
        "restart, a start's warm-up or the unit stopped).",
        ("unit",),
        writer=WATCHDOG,
    ),
    Metric(
        "gpubox_deploy_last_run_timestamp_seconds",
        GAUGE,
        "When the last gpubox deploy of this box ended.",
        writer=DEPLOY,
    ),
    Metric(
        "gpubox_deploy_last_run_success",
        GAUGE,
        "Whether the last gpubox deploy of this box succeeded (1) or failed (0).",
        writer=DEPLOY,
    ),
    Metric(
        "gpubox_deploy_last_success_timestamp_seconds",
        GAUGE,
        "When the last successful gpubox deploy of this box ended.",
        writer=DEPLOY,
    ),
    Metric(
        "gpubox_checks_last_success_timestamp_seconds",
        GAUGE,
        "When the last run of gpubox's checks on this box passed.",
        writer=DEPLOY,
    ),
    Metric(
        "gpubox_reboot_pending",
        GAUGE,
        "Whether the installed NVIDIA driver is not the loaded one (1): a reboot is pending.",
        writer=BOX,
    ),
    Metric(
        "gpubox_reboot_pending_since_timestamp_seconds",
        GAUGE,
        "Since when the installed NVIDIA driver has not been the loaded one (0 when it is).",
        writer=BOX,
    ),
    Metric(
        "gpubox_model_download_bytes",
        GAUGE,
        "Bytes of the model's file downloaded so far.",
        ("model",),
        writer=BOX,
    ),
    Metric(
        "gpubox_model_download_size_bytes",
        GAUGE,
        "Bytes of the model's whole file (0 while unknown).",
        ("model",),
        writer=BOX,
    ),
    Metric(
        "gpubox_model_volume_info",
        GAUGE,
        "Always 1: the mount point of the filesystem that holds model_dir (the node "
        "exporter's node_filesystem_* mountpoint label).",
        ("mountpoint",),
        writer=BOX,
    ),
    Metric(
        "gpubox_driver_branch_end_of_life_timestamp_seconds",
        GAUGE,
        "When the installed driver branch's support ends (the end of its end-of-life month; "
        "0: past its end of life, no month known).",
        ("branch",),
        writer=CONFIG,
    ),
    Metric(
        "gpubox_output_tokens_per_second_floor",
        GAUGE,
        "The output tokens/s below which a box serving requests is slow (its key).",
        writer=CONFIG,
    ),
)

BY_NAME = {m.name: m for m in METRICS}


def end_of_life_timestamp(eol: str | None) -> float:
    """The end of a branch's end-of-life month ("YYYY-MM", knowledge/driver_lifecycle.py's
    ``Lifecycle.eol``) as a Unix timestamp: the first second of the next month, UTC. A branch
    with no month (its status says it is past) is 0: support ended, date unknown."""
    if eol is None:
        return 0.0
    year, month = (int(part) for part in eol.split("-"))
    year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return datetime.datetime(year, month, 1, tzinfo=datetime.UTC).timestamp()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


Sample = tuple[str, Mapping[str, str], float]  # metric name, its labels, its value


def of_writer(writer: str) -> tuple[Metric, ...]:
    """The metrics ``writer`` writes (in METRICS' order), to its file TEXTFILE_NAME[writer]."""
    if writer not in TEXTFILE_NAME:
        raise ValueError(f"{writer} is not one of gpubox's textfile writers {list(TEXTFILE_NAME)}")
    return tuple(m for m in METRICS if m.writer == writer)


def exposition(samples: Iterable[Sample], writer: str | None = None) -> str:
    """Prometheus's text format for ``samples``, each metric's HELP and TYPE once, in METRICS'
    order. A name that is not one of METRICS, or labels other than the metric's own, are a
    ValueError naming them: the rules rely on exactly these names. With ``writer``, the text
    of that writer's file: a metric of another writer is a ValueError naming both."""
    by_metric: dict[str, list[str]] = {}
    for name, labels, value in samples:
        metric = BY_NAME.get(name)
        if metric is None:
            raise ValueError(f"{name} is not one of gpubox's metrics (knowledge/metrics.py)")
        if writer is not None and metric.writer != writer:
            raise ValueError(
                f"{name} is written by {metric.writer} ({TEXTFILE_NAME[metric.writer]}), "
                f"not by {writer} ({TEXTFILE_NAME.get(writer, '?')})"
            )
        if set(labels) != set(metric.labels):
            raise ValueError(f"{name} takes the labels {list(metric.labels)}, got {sorted(labels)}")
        pairs = ",".join(f'{k}="{_escape(labels[k])}"' for k in metric.labels)
        series = f"{name}{{{pairs}}}" if pairs else name
        by_metric.setdefault(name, []).append(f"{series} {_number(value)}")
    lines = []
    for metric in METRICS:
        if metric.name in by_metric:
            lines.append(f"# HELP {metric.name} {metric.help}")
            lines.append(f"# TYPE {metric.name} {metric.type}")
            lines.extend(by_metric[metric.name])
    return "".join(line + "\n" for line in lines)


def read_values(text: str) -> dict[str, float]:
    """The samples without labels in a textfile's ``text`` (Prometheus's text format), by
    name: what a writer reads back of its own last file (the deploy's final checks keep the
    last success's times). Comments, labelled samples and lines that do not parse are left
    out."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2 or line.startswith("#") or "{" in words[0]:
            continue
        try:
            found[words[0]] = float(words[1])
        except ValueError:
            continue
    return found
