"""Puts secrets into a configuration file on the box (issue 31 C, docs/monitoring.md#receivers):
gpubox.stages.monitoring uploads this file whole (to layout.ALERTMANAGER_RENDER) and runs it as
root. It imports nothing but Python's standard library.

Debian 12's Alertmanager 0.25 reads a webhook's URL and the SMTP password only from its own
configuration file (``url_file`` came in 0.26, the e-mail ``auth_password_file`` later still),
so the template (no secret in it, root-only) names each secret's file with a placeholder,
``GPUBOX_SECRET_FILE(/path)``, and this program writes the file with each placeholder replaced
by that file's content, stripped and quoted as a YAML (JSON) string. The result is written
0640, root and the group of the service's user (asked from systemd: ``User=`` of the unit), by a
temporary file and a rename. The secrets are never printed, nor on a command line.

    render_secrets TEMPLATE OUTPUT UNIT          write OUTPUT when it differs
    render_secrets --check TEMPLATE OUTPUT UNIT  print "same" or "differs", write nothing

Exit 1 with one line (naming the file, never its content) when a secret's file is missing."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import subprocess
import sys
from collections.abc import Callable

PLACEHOLDER = "GPUBOX_SECRET_FILE({path})"
PATTERN = re.compile(r"GPUBOX_SECRET_FILE\(([^()\s]+)\)")
MODE = 0o640


def render(text: str, read: Callable[[str], str]) -> str:
    """``text`` with each placeholder replaced by ``read(path)``, stripped and quoted."""
    return PATTERN.sub(lambda m: json.dumps(read(m.group(1)).strip()), text)


def read_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def service_group(unit: str) -> int:
    """The primary group of the user ``unit`` runs as (root's when it sets none, or when there
    is no systemd to ask)."""
    try:
        user = subprocess.run(
            ["systemctl", "show", "--property=User", "--value", unit],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        return 0
    return pwd.getpwnam(user).pw_gid if user else 0


def is_current(path: str, text: str, gid: int) -> bool:
    try:
        st = os.stat(path)
        return read_file(path) == text and st.st_gid == gid and st.st_mode & 0o777 == MODE
    except OSError:
        return False


def main(argv: list[str]) -> int:
    check = argv[1:2] == ["--check"]
    args = argv[2:] if check else argv[1:]
    if len(args) != 3:
        print("usage: render_secrets [--check] TEMPLATE OUTPUT UNIT", file=sys.stderr)
        return 2
    template, output, unit = args
    try:
        text = render(read_file(template), read_file)
    except OSError as exc:
        print(f"render_secrets: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        gid = service_group(unit)
    except KeyError:
        print(f"render_secrets: {unit}'s user does not exist", file=sys.stderr)
        return 1
    if check:
        print("same" if is_current(output, text, gid) else "differs")
        return 0
    if is_current(output, text, gid):
        return 0
    temporary = f"{output}.gpubox-new"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chown(temporary, 0, gid)
    os.chmod(temporary, MODE)
    os.replace(temporary, output)
    print(f"render_secrets: wrote {output} (0640 root:{grp.getgrgid(gid).gr_name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
