"""Layer 11, entry points: gpubox doctor, the whole box on one screen per host.

`gpubox doctor INVENTORY [--json]`: the whole box on one screen per host, and every way it
differs from its inventory, each with the command that fixes it. Read-only.

The verdicts are gpubox.checks' (the same checks ``pytest tests/host`` runs), all but those
that act on the box (a container run, a GPU load). Modules:

- ``cli``: read each host's facts once (``gather``), judge them (``evaluate``), print; ``main``.
- ``view``: ``describe``, the host's state as one JSON-able view (pure).
- ``alerts``: the alerts firing for each box, read once from the monitor's Alertmanager.
- ``render``: ``render_fleet`` (one table, a row per host), ``render_text`` (one screen per
  host), ``render_json``, ``format_bench``."""

from __future__ import annotations

from gpubox.checks import Output, Verdict
from gpubox.checks.core import Unreachable
from gpubox.doctor.cli import API_REQUESTS, doctor_checks, evaluate, gather, main
from gpubox.doctor.render import (
    fleet_row,
    format_bench,
    host_report,
    render_fleet,
    render_json,
    render_text,
)
from gpubox.doctor.view import describe

__all__ = [
    "Output",
    "Unreachable",
    "Verdict",
    "describe",
    "doctor_checks",
    "evaluate",
    "fleet_row",
    "format_bench",
    "gather",
    "API_REQUESTS",
    "host_report",
    "main",
    "render_fleet",
    "render_json",
    "render_text",
]
