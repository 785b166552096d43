"""A backend's unit stopped by the bench and started again (llama-bench beside the served
figures, the smoke's configurations): the /health command, the wait with a progress line
every PROGRESS_EVERY s, and the restore that a Ctrl-C cannot cut short."""

from __future__ import annotations

import contextlib
import shlex
import signal
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from gpubox.checks import Runner

HEALTH_POLL = 2.0
PROGRESS_EVERY = 15.0

Say = Callable[[str], None]
Sleep = Callable[[float], None]
Clock = Callable[[], float]


class Waited(Protocol):
    """What a wait needs of a bench plan: the host's name, its /health URL and how long."""

    name: str
    health_url: str
    health_timeout: int


def health_command(plan: Waited) -> str:
    """/health's HTTP status on the box (curl prints 000 when nothing answers)."""
    return (
        "curl -s -o /dev/null --max-time 5 -w '%{http_code}' "
        + shlex.quote(plan.health_url)
        + " || true"
    )


def wait_healthy(
    run: Runner,
    plan: Waited,
    what: str,
    say: Say,
    sleep: Sleep,
    clock: Clock,
    again: bool = False,
    gone: Callable[[], str | None] | None = None,
) -> str | None:
    """Wait for /health; None, or why it never came: health_timeout passed, or ``gone``
    (asked after each unanswered poll) said why it never will. ``again``: the line it prints
    says the server is back ("healthy again after N s")."""
    start = last = clock()
    while True:
        code = run(health_command(plan)).stdout.strip()
        if code == "200":
            said = "healthy again" if again else "healthy"
            say(f"{plan.name}: {what} {said} after {clock() - start:.0f} s")
            return None
        why = gone() if gone else None
        if why is not None:
            return why
        now = clock()
        if now - start >= plan.health_timeout:
            return f"{what} did not answer /health within {plan.health_timeout} s (health_timeout)"
        if now - last >= PROGRESS_EVERY:
            say(
                f"{plan.name}: waiting for {what} (/health {code or 'no answer'}, "
                f"{now - start:.0f} s)"
            )
            last = now
        sleep(HEALTH_POLL)


@contextlib.contextmanager
def deferred_interrupt(say: Say, unit: str) -> Iterator[list[bool]]:
    """Ctrl-C waits until the block ends (the unit's restart is not cut short); the list
    says whether one came."""
    pressed = [False]
    try:
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum: int, frame: Any) -> None:
            pressed[0] = True
            say(f"starting {unit} again first; it will not be left stopped")

        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: nothing to defer
        yield pressed
        return
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def restore_unit(
    run: Runner,
    plan: Waited,
    unit: str,
    cleanup: str,
    was_running: bool,
    say: Say,
    sleep: Sleep,
    clock: Clock,
) -> str | None:
    """Run ``cleanup`` (what the bench left on the box), start ``unit`` again when it was
    running before, and wait for its /health; None, or why it is not back."""
    try:
        with deferred_interrupt(say, unit) as pressed:
            run(cleanup)
            if not was_running:
                say(f"{plan.name}: {unit} was not running before; it is left stopped")
                return None
            say(f"{plan.name}: starting {unit} again")
            out = run(f"systemctl start {unit}")
        if out.rc != 0:
            return f"systemctl start {unit} failed: {out.first_error_line()}"
        if pressed[0]:
            return f"{unit} started, /health not awaited (interrupted)"
        why = wait_healthy(run, plan, unit, say, sleep, clock, again=True)
        return None if why is None else f"{why}: journalctl -u {unit} -n 50"
    except KeyboardInterrupt:
        return f"{unit} started, /health not awaited (interrupted)"
    except Exception as exc:  # the connection, most likely
        return f"{type(exc).__name__}: {exc}"
