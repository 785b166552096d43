"""Waiting on the box for a backend's /health, for the bench's runs that stop and start it
(llama-bench beside the served figures, the smoke's configurations): the command that asks,
and the wait with a progress line every PROGRESS_EVERY s."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Protocol

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
