"""pyinfra, as `pyinfra ARGS...` runs it, with a clock on every stage, fact and operation.

Used by deploy_timing.py: ``python benchmarks/profile_deploy.py PROFILE.json ARGS...`` runs
pyinfra's command line with ARGS and writes where the time went to PROFILE.json:

- ``stages``: each stage's planning time (its @deploy function: preflight, the facts it
  reads, the operations it adds), in the order run_stages calls them;
- ``facts``: every fact command pyinfra ran (host, stage, fact, arguments, seconds, phase:
  ``prepare`` while the stages plan, ``execute`` when an operation reads one);
- ``operations``: every operation executed (host, names, seconds);
- ``total_s``, ``start_to_first_stage_s`` (imports, inventory, connecting),
  ``planning_s`` and ``execute_s``.

Only clocks are added; what pyinfra runs is unchanged.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

START = time.monotonic()
RECORD: dict[str, Any] = {"stages": [], "facts": [], "operations": []}
CURRENT = {"stage": "(before the stages)"}


def _install() -> None:
    import pyinfra.api.facts as facts_module
    import pyinfra.api.operations as operations_module

    import gpubox.stages as stages_module

    real_get_fact = facts_module._get_fact
    real_run_op = operations_module._run_host_op
    real_run_stages = stages_module.run_stages

    def timed_get_fact(
        state: Any, host: Any, cls: Any, args: Any = None, kwargs: Any = None, *rest: Any
    ) -> Any:  # noqa: E501
        began = time.monotonic()
        try:
            return real_get_fact(state, host, cls, args, kwargs, *rest)
        finally:
            stage = getattr(state, "current_stage", None)
            RECORD["facts"].append(
                {
                    "host": host.name,
                    "stage": CURRENT["stage"],
                    "fact": cls.__name__,
                    "args": repr(args or kwargs or "")[:160],
                    "seconds": round(time.monotonic() - began, 4),
                    "phase": "execute" if getattr(stage, "name", "") == "Execute" else "prepare",
                    "at": round(began - START, 3),
                }
            )

    def timed_run_op(state: Any, host: Any, op_hash: str) -> Any:
        began = time.monotonic()
        names = sorted(state.get_op_meta(op_hash).names)
        CURRENT["stage"] = names[0].split(" | ")[0] if names else "?"
        try:
            return real_run_op(state, host, op_hash)
        finally:
            RECORD["operations"].append(
                {
                    "host": host.name,
                    "names": names,
                    "seconds": round(time.monotonic() - began, 4),
                    "at": round(began - START, 3),
                }
            )

    def timed_run_stages(*stages: Any) -> None:
        def clocked(stage: Any) -> Any:
            def run() -> object:
                began = time.monotonic()
                CURRENT["stage"] = stage.__name__
                try:
                    return stage()
                finally:
                    RECORD["stages"].append(
                        {
                            "stage": stage.__name__,
                            "seconds": round(time.monotonic() - began, 4),
                            "at": round(began - START, 3),
                        }
                    )
                    CURRENT["stage"] = f"(after {stage.__name__})"

            run.__name__ = stage.__name__
            return run

        real_run_stages(*(clocked(s) for s in stages))

    facts_module._get_fact = timed_get_fact
    operations_module._run_host_op = timed_run_op
    stages_module.run_stages = timed_run_stages


def _write(path: Path) -> None:
    RECORD["total_s"] = round(time.monotonic() - START, 3)
    stages = RECORD["stages"]
    ops = RECORD["operations"]
    if stages:
        RECORD["start_to_first_stage_s"] = stages[0]["at"]
        RECORD["planning_s"] = round(stages[-1]["at"] + stages[-1]["seconds"] - stages[0]["at"], 3)
    if ops:
        RECORD["execute_s"] = round(ops[-1]["at"] + ops[-1]["seconds"] - ops[0]["at"], 3)
    from gpubox.infra import readahead

    RECORD["readahead"] = readahead.reports()
    path.write_text(json.dumps(RECORD, indent=1) + "\n")


def main() -> int:
    out = Path(sys.argv[1])
    sys.argv = ["pyinfra", *sys.argv[2:]]
    _install()
    from pyinfra_cli.main import main as pyinfra_main

    try:
        return int(pyinfra_main() or 0)
    except SystemExit as end:
        return int(end.code or 0) if not isinstance(end.code, str) else 1
    finally:
        _write(out)


if __name__ == "__main__":
    sys.exit(main())
