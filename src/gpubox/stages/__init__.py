"""Layer 10, stages: one module per stage, each one @deploy; the deploy's final checks.

The stages: one module per stage, each exposing one @deploy function.

``current_config()`` validates the whole inventory once per run (every problem at once) and
returns the current host's typed config; it raises before any operation is added, so a
refused run changes nothing on any host.
"""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import host, inventory
from pyinfra.context import ctx_host

from gpubox.base.errors import DeployRefused, HostRefused, HostStopped
from gpubox.config import HostConfig, Problem, fleet_problems, validate
from gpubox.infra import outcome, readahead

__all__ = ["all_configs", "current_config", "run_stages"]


def run_stages(*stages: Callable[[], object]) -> None:
    """What every deploy file does: the stages for the current host, in order. A host that
    its preflight refuses among several (HostRefused) has failed alone: its remaining stages
    are skipped and the other hosts go on. A host whose stage stops it on purpose (HostStopped:
    its operations so far run, the last one fails with the owner's next step) plans no further
    stage either."""
    readahead.install()  # a no-op run reads the box once (gpubox.infra.readahead)
    # pyinfra names an operation by the line numbers of its call stack, not the files: two
    # stages adding an operation at the same line of their modules get the same name, and
    # hosts of one run that add different sets of operations (a fresh box beside converged
    # ones) then order them in a cycle ("Cycle detected in operation ordering DAG"). The
    # stage's position, like pyinfra's own host.loop, makes every stage's operations its own.
    position = ctx_host.get().loop_position if ctx_host.isset() else []
    position.append(0)
    try:
        for index, stage in enumerate(stages):
            position[-1] = index
            stage()
    except HostStopped:
        outcome.stopped(ctx_host.get().name if ctx_host.isset() else "")
    except HostRefused:
        pass  # the reason, with the host's name, is in the output already
    finally:
        position.pop()


def current_config() -> HostConfig:
    """Validate every host of the inventory (cheap, pure) and return this host's config."""
    configs: dict[str, HostConfig] = {}
    errors: list[Problem] = []
    for each in inventory:
        config, problems = validate(each.name, each.data.dict())
        errors.extend(p for p in problems if p.severity == "error")
        if config is not None:
            configs[each.name] = config
    if not errors:  # the rules that need every host (monitoring: gpubox.config.monitoring_rules)
        errors.extend(p for p in fleet_problems(configs) if p.severity == "error")
    if errors:
        lines = "\n".join(f"  - {p}" for p in errors)
        raise DeployRefused(
            f"invalid inventory, nothing was changed ({len(errors)} problem(s)):\n{lines}"
        )
    return configs[host.name]


def all_configs() -> dict[str, HostConfig]:
    """Every host of the inventory's config, in inventory order: the whole inventory, even
    under --limit (pyinfra's ``inventory`` holds every host; --limit only chooses those a run
    acts on), so a stage that describes the fleet (the monitor's scrape configuration) writes
    the same file whichever hosts a run is limited to. Call after ``current_config``."""
    configs = {}
    for each in inventory:
        config, _ = validate(each.name, each.data.dict())
        if config is not None:
            configs[each.name] = config
    return configs
