"""gpubox's Grafana dashboard (``files/monitoring/dashboard.json``, issue 31 D) read as data: its
panels' PromQL by area (the dashboard's rows) and by backend, ready to evaluate against a real
Prometheus, and the metric names each query reads. Pure: the dashboard is passed in (``load``
reads the packaged file).

- **Areas** are the dashboard's rows: ``AREAS`` maps each row's title to its kind ("gpu",
  "serving", "watchdog", "disk"). A panel belongs to the row above it.
- **Backends.** A query that reads llama.cpp's metrics (``llamacpp:...``) is llama.cpp's, one that
  reads vLLM's (``vllm:...``) is vLLM's; the rest are both backends' or none's. One serving panel
  may hold a query of each backend.
- **Substitution.** Every query selects ``host=~"$host"`` (the dashboard's template variable) and
  rate windows are Grafana's ``$__rate_interval``: ``queries`` replaces both, so that the query runs
  as it is against Prometheus's HTTP API (the sandbox's integration test does that)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.base.rendering import FILES

DASHBOARD_FILE = FILES / "monitoring" / "dashboard.json"
# The Prometheus datasource's uid: the dashboard names it in every panel and query, and the
# Grafana stage provisions the datasource under it (plans/grafana.py).
DATASOURCE_UID = "gpubox-prometheus"
DATASOURCE = {"type": "prometheus", "uid": DATASOURCE_UID}
# The template variable every query selects its boxes by, and the label it reads.
HOST_VARIABLE = "$host"
HOST_SELECTOR = 'host=~"$host"'
RATE_INTERVAL = "$__rate_interval"
# Row title -> kind of the panels under it.
AREAS = {"GPUs": "gpu", "Serving": "serving", "Watchdog": "watchdog", "Disk": "disk"}
# Metric name prefix -> backend.
BACKENDS = {"llamacpp:": "llamacpp", "vllm:": "vllm"}
KINDS = (*AREAS.values(), *BACKENDS.values())


@dataclass(frozen=True)
class Query:
    area: str  # one of AREAS' values
    backend: str | None  # "llamacpp", "vllm", or None (both backends', or no backend's)
    panel: str  # the panel's title
    ref_id: str
    expr: str  # as the dashboard holds it ($host, $__rate_interval)

    def promql(self, host: str = ".*", window: str = "5m") -> str:
        """The query as Prometheus takes it: ``$host`` replaced by the regex ``host``, Grafana's
        ``$__rate_interval`` by the fixed ``window``."""
        return self.expr.replace(RATE_INTERVAL, window).replace(HOST_VARIABLE, host)


def load(path: Path = DASHBOARD_FILE) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def panels(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every panel that is not a row, with its area (the row above it). A panel above the first
    row, or under a row whose title is not one of AREAS, is a ValueError: every query has its
    area."""
    area: str | None = None
    for panel in dashboard["panels"]:
        if panel.get("type") == "row":
            title = panel.get("title", "")
            if title not in AREAS:
                raise ValueError(f"row {title!r} is not one of the areas {list(AREAS)}")
            area = AREAS[title]
            continue
        if area is None:
            raise ValueError(f"panel {panel.get('title')!r} sits above the first row")
        yield area, panel


# PromQL's words that are not metric names: aggregations, keywords, and the functions the
# dashboard may call (a name followed by "(" is a function anyway).
_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` reads: its selectors' names, with label matchers, strings,
    range windows, grouping clauses and function names left out."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    found = set()
    for match in _NAME.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _WORDS or name.startswith("$"):
            continue
        found.add(name)
    return found


def selectors(expr: str) -> list[tuple[str, str]]:
    """Each vector selector of ``expr``: (metric name, its label matchers; "" with none)."""
    names = metric_names(expr)
    return [
        (match.group(1), match.group(2) or "")
        for match in re.finditer(r'(?<![\w:"])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?', expr)
        if match.group(1) in names
    ]


def backend_of(expr: str) -> str | None:
    names = metric_names(expr)
    found = {b for prefix, b in BACKENDS.items() for n in names if n.startswith(prefix)}
    if len(found) > 1:
        raise ValueError(f"one query reads both backends' metrics: {expr}")
    return found.pop() if found else None


def all_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    return [
        Query(area, backend_of(t["expr"]), panel["title"], t["refId"], t["expr"])
        for area, panel in panels(dashboard)
        for t in panel.get("targets", [])
    ]


def queries(
    dashboard: Mapping[str, Any], kind: str, host: str = ".*", window: str = "5m"
) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of ``kind``: an area ("gpu", "serving", "watchdog",
    "disk") or a backend ("llamacpp", "vllm"), with ``$host`` replaced by the regex ``host`` and
    ``$__rate_interval`` by ``window``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    return [
        (q.panel, q.promql(host, window))
        for q in all_queries(dashboard)
        if kind in (q.area, q.backend)
    ]
