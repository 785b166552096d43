"""Users on the box (docker_users): the read-only command that says which groups each named
user is in, one ``NAME:GROUP...`` line per user (parsers.parse_user_groups reads it). The
deploy's preflight and docker stage (gpubox.infra.host_facts.UserGroups) and the host check
docker.users
run the same command."""

from __future__ import annotations

import shlex
from collections.abc import Sequence


def groups_command(users: Sequence[str]) -> str:
    """``NAME:GROUPS`` per user: `id -nG` (the user database's answer, not a login's), nothing
    after the colon for a user the box does not have. Exits 0."""
    names = " ".join(shlex.quote(u) for u in users)
    return f'for u in {names}; do printf "%s:" "$u"; id -nG -- "$u" 2>/dev/null || echo; done'
