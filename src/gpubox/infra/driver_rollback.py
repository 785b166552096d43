"""After a driver move's reboot: the driver checks on the box, and on a failure the automatic
rollback to the kept driver (issue 30 C, key ``driver_rollback``; docs/deploy.md, "Automatic
rollback").

The operation runs its checks when it executes, after the move's reboot (its commands are
yielded one by one, each after the one before ran): the state before the move was read by the
driver stage from facts, before any change. On a failure it rolls back (the script of
gpubox.plans.driver_rollback), reboots (gpubox.infra.operations.reboot_commands), checks again
against the old version, and fails the host either way with what failed (a callback that
returns False: no traceback): the rest of the deploy does not run for that host, and
``gpubox deploy`` exits 1.
"""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, StringCommand, operation

from gpubox.infra.operations import reboot_commands
from gpubox.rules import driver_rollback as judge


def read_failures(on: Any, before: judge.DriverState, version: str) -> list[str]:
    """What fails on driver ``version`` on host ``on`` now (gpubox.rules.driver_rollback)."""
    ok, output = on.run_shell_command(judge.STATE_COMMAND, print_output=False)
    text = "\n".join(output.stdout_lines) if ok else ""
    if not ok:
        return [f"driver {version}: the driver's state could not be read ({output.stderr})"]
    return judge.failures(before, judge.state_from(text), version)


def _stop(on: Any, message: str) -> bool:
    """Fail the host with ``message``: a FunctionCommand of (state, host) returning False fails
    its operation as a failed command does (a raised exception would add pyinfra's traceback
    and "Unexpected error in Python callback" under the message)."""
    on.log_styled(message, fg="red", log_func=logger.error)
    return False


@operation(is_idempotent=False)
def verify_driver_move(
    old: str,
    new: str,
    before: judge.DriverState,
    rollback: str | None,
    no_rollback: str,
    timeout: int = 900,
    interval: float = 2.0,
):
    """Check driver ``new`` against ``before``; when it fails, run ``rollback`` (the script
    back to ``old``), reboot, check ``old``, and fail the host saying what happened. Without
    a ``rollback``, fail with what failed and ``no_rollback`` (why there is none, and the way
    back)."""
    found: list[list[str]] = []

    def _check(state: Any, host: Any) -> None:
        found.append(read_failures(host, before, new))

    yield FunctionCommand(_check, (), {})
    executing = state.is_executing
    if executing and not found[-1]:
        logger.info(f"{host.name}: driver {new} passes the driver checks after the reboot")
        return
    why = "; ".join(found[-1]) if found else f"driver {new}: (the checks' findings)"
    if rollback is None:

        def _fail(state: Any, host: Any) -> bool:
            return _stop(host, f"{host.name}: {why}. {no_rollback}")

        yield FunctionCommand(_fail, (), {})
        return
    if executing:
        logger.warning(
            f"{host.name}: {why}: rolling back to driver {old} from its kept packages, "
            "then a reboot (driver_rollback)"
        )
    yield StringCommand(f"why={shlex.quote(why)}\n{rollback}")
    yield from reboot_commands(
        f"rolling back to driver {old} ({new} failed its checks)", timeout, interval
    )
    again: list[list[str]] = []

    def _check_old(state: Any, host: Any) -> None:
        again.append(read_failures(host, before, old))

    yield FunctionCommand(_check_old, (), {})

    def _rolled_back(state: Any, host: Any) -> bool:
        if again[-1]:
            return _stop(
                host,
                f"{host.name}: {why}. The box was rolled back to driver {old} and rebooted, "
                f"but {old} fails its checks too: {'; '.join(again[-1])}. The box serves "
                f"no GPU: look at it (gpubox doctor), then deploy again",
            )
        return _stop(
            host,
            f"{host.name}: {why}. The box is back on driver {old} (its kept packages, "
            f"pinned and held), rebooted and passing the driver checks; the rest of the "
            f"deploy was not run for it. Set the driver key back to {old} in the inventory "
            f"(driver_branch / driver_version), or find why {new} fails before moving again",
        )

    yield FunctionCommand(_rolled_back, (), {})
