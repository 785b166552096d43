"""What 1Panel v2's installer leaves on a box, fact by fact, and a probe that checks a box.

Written from the record of 1Panel's own install.sh (1Panel-dev/installer install.sh @
aa4a6bbf24ae0fd938b32294672f5086f940e483, the installer of v2.3.0 to v2.3.2, steps Init_Panel
and Check_Ready) and of the core's start hook, not from gpubox's stage: a stage that
reproduces the installer must leave exactly this. Every fact names its source.

Use from an integration test (the probe is one bash script, sent on standard input, so the
password it looks for is never on a command line)::

    problems = panel_record.check(
        lambda script: box_sh("bash -s", stdin=script),
        base_dir="/opt", version="v2.3.2", password=password)
    assert not problems, "\\n".join(problems)

``root`` runs the same probe against a tree below a directory (the unit tests).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

INSTALL_SH = "1Panel-dev/installer install.sh @ aa4a6bb, Init_Panel"
CHECK_READY = "1Panel-dev/installer install.sh @ aa4a6bb, Check_Ready"
HOOK = "1Panel-dev/1Panel core/init/hook/hook.go (CHANGE_USER_INFO) and Check_Ready"
CORE_ROOT = "1Panel-dev/1Panel core/cmd/server/cmd/root.go @ 026eea2 (loadDBConn)"
SOCKET = "1Panel's agent listens on /etc/1panel/agent.sock; install.sh Check_Ready tests it"
INSTALL_LOG = "install.sh logs every line to <package dir>/install.log (with the password)"
UNITS = "1Panel-dev/installer v2 @ 17f2b15 1panel-core.service / 1panel-agent.service"
HEALTH = "install.sh Init_Panel: systemctl enable, start; 1pctl status"
MASK = "ORIGINAL_PASSWORD=**********"
LANGS = ("en", "zh", "fa", "pt-BR", "ru")
INITSCRIPTS = tuple(
    f"1panel-{service}.{kind}"
    for service in ("core", "agent")
    for kind in ("service", "init", "openrc", "procd")
)


@dataclass(frozen=True)
class Fact:
    """One thing on the box. ``kind``: exec (a regular file, executable), file (a regular
    file, not empty), dir (a directory; ``expect`` its octal mode when recorded), link
    (``expect`` the link's target, as written), socket, line (``expect`` is a whole line of
    the file), no-line (no line begins with ``expect``), same (the file equals ``expect``),
    none-found (no file named ``expect`` with 1panel in its path below ``path``), command
    (``path`` is a shell command whose output must be ``expect``)."""

    kind: str
    path: str
    expect: str = ""
    source: str = ""

    def describe(self) -> str:
        return f"{self.kind} {self.path}" + (f" {self.expect!r}" if self.expect else "")


def unit_lines(service: str) -> list[str]:
    """The recorded lines of a unit (UNITS)."""
    return [
        "Description=1Panel, a modern open source linux panel",
        "After=syslog.target network-online.target",
        "Wants=network-online.target",
        f"ExecStart=/usr/bin/1panel-{service}",
        "Restart=always",
        "RestartSec=5",
        "LimitNOFILE=1048576",
        "LimitNPROC=1048576",
        "LimitCORE=1048576",
        "Delegate=yes",
        "KillMode=process",
        "WantedBy=multi-user.target",
    ]


def facts(base_dir: str = "/opt", version: str | None = None, services: bool = False) -> list[Fact]:
    """The layout a finished install leaves (``base_dir``: the install directory, in which
    ``1panel/`` is the data directory)."""
    run = f"{base_dir.rstrip('/')}/1panel"
    out = [
        Fact("exec", f"/usr/local/bin/{name}", source=INSTALL_SH)
        for name in ("1panel-core", "1panel-agent", "1pctl")
    ]
    out += [
        Fact("link", "/usr/bin/1panel", "/usr/local/bin/1panel-core", INSTALL_SH),
        Fact("link", "/usr/bin/1panel-core", "/usr/local/bin/1panel-core", INSTALL_SH),
        Fact("link", "/usr/bin/1panel-agent", "/usr/local/bin/1panel-agent", INSTALL_SH),
        Fact("link", "/usr/bin/1pctl", "/usr/local/bin/1pctl", INSTALL_SH),
        Fact("line", "/usr/local/bin/1pctl", f"BASE_DIR={base_dir.rstrip('/')}", INSTALL_SH),
        Fact("line", "/usr/local/bin/1pctl", MASK, CHECK_READY),
        Fact("no-line", "/usr/local/bin/1pctl", "CHANGE_USER_INFO=", HOOK),
    ]
    if version:
        out.append(Fact("line", "/usr/local/bin/1pctl", f"ORIGINAL_VERSION={version}", INSTALL_SH))
    for service in ("core", "agent"):
        unit = f"/etc/systemd/system/1panel-{service}.service"
        out.append(Fact("file", unit, source=INSTALL_SH))
        out += [Fact("line", unit, line, UNITS) for line in unit_lines(service)]
        copy = f"{run}/resource/initscript/1panel-{service}.service"
        out.append(Fact("same", unit, copy, INSTALL_SH + " (units copied from initscript/)"))
    out.append(Fact("file", f"{run}/geo/GeoIP.mmdb", source=INSTALL_SH))
    out.append(Fact("dir", "/usr/local/bin/lang", source=INSTALL_SH))
    out += [Fact("file", f"/usr/local/bin/lang/{code}.sh", source=INSTALL_SH) for code in LANGS]
    out.append(Fact("dir", f"{run}/resource/initscript", source=INSTALL_SH))
    out += [
        Fact("file", f"{run}/resource/initscript/{name}", source=INSTALL_SH) for name in INITSCRIPTS
    ]
    out += [
        Fact("file", f"{run}/db/core.db", source=CORE_ROOT),
        Fact("dir", "/etc/1panel", "700", SOCKET + " (/etc/1panel root-only, third-party note)"),
        Fact("socket", "/etc/1panel/agent.sock", source=SOCKET),
        Fact("none-found", "/", "install.log", INSTALL_LOG + "; gpubox never runs install.sh"),
    ]
    if services:
        for service in ("core", "agent"):
            name = f"1panel-{service}.service"
            out.append(Fact("command", f"systemctl is-enabled {name}", "enabled", HEALTH))
            out.append(Fact("command", f"systemctl is-active {name}", "active", HEALTH))
    return out


def _observe(fact: Fact) -> str:
    """A shell expression printing what the box shows for ``fact`` (paths below $ROOT)."""
    path = '"$ROOT"' + shlex.quote(fact.path)
    stat = f"$(stat -c '%F|%a' -- {path} 2>/dev/null || echo missing)"
    if fact.kind in ("exec", "file", "dir", "socket"):
        size = f"$(stat -c '%s' -- {path} 2>/dev/null)"
        return f"{stat}|{size}"
    if fact.kind == "link":
        return f"{stat}|$(readlink -- {path})"
    if fact.kind == "line":
        line = shlex.quote(fact.expect)
        return f"$(grep -qxF -e {line} -- {path} 2>/dev/null && echo yes || echo no)"
    if fact.kind == "no-line":
        prefix = shlex.quote(fact.expect)
        return f"$(grep -F -e {prefix} -- {path} 2>/dev/null | grep -c '^'{prefix} || true)"
    if fact.kind == "same":
        other = '"$ROOT"' + shlex.quote(fact.expect)
        return f"$(cmp -s -- {path} {other} && echo same || echo differ)"
    if fact.kind == "none-found":
        name = shlex.quote(fact.expect)
        return (
            f"$(find {path} -xdev -path '*1panel*' -name {name} 2>/dev/null | head -3 | "
            "tr '\\n' ' ')"
        )
    if fact.kind == "command":
        return f"$({fact.path} 2>&1 | head -1)"
    raise ValueError(f"unknown fact kind {fact.kind!r}")


def password_places(base_dir: str = "/opt") -> tuple[str, ...]:
    """Where a clear-text panel password must not be: 1pctl (Check_Ready masks it), the
    units, /etc/1panel, the install directory (install.log, the databases: the real core
    encrypts the password, the stand-in hashes it), home, temporary directories, logs."""
    return (
        "/usr/local/bin/1pctl",
        "/etc/systemd/system",
        "/etc/1panel",
        base_dir,
        "/root",
        "/tmp",
        "/var/tmp",
        "/var/log",
    )


def probe_script(
    checked: list[Fact],
    password: str | None = None,
    root: str = "",
    services: bool = False,
    base_dir: str = "/opt",
) -> str:
    """One bash script printing ``<index>\\t<observation>`` for each fact, then (with a
    password) ``password\\t<files and logs that hold it>`` (``password_places``, and with
    ``services`` the units' journal). The password goes in a quoted here-document, never on
    a command line."""
    lines = ["#!/bin/bash", f"ROOT={shlex.quote(root.rstrip('/'))}"]
    for i, fact in enumerate(checked):
        lines.append(f"printf '%s\\t%s\\n' {i} \"{_observe(fact)}\"")
    if password:
        if "\n" in password or "GPUBOX_PASSWORD_END" in password:
            raise ValueError(
                "the password cannot be searched for: it holds a newline or the end marker"
            )
        places = " ".join('"$ROOT"' + shlex.quote(p) for p in password_places(base_dir))
        journal = (
            "journalctl --no-pager -q -u 1panel-core -u 1panel-agent 2>/dev/null"
            if services
            else "true"
        )
        lines += [
            "PASSWORD_FILE=$(mktemp -p /run)",  # not a searched place
            "cat >\"$PASSWORD_FILE\" <<'GPUBOX_PASSWORD_END'",
            password,
            "GPUBOX_PASSWORD_END",
            f'FOUND=$(grep -rlF -f "$PASSWORD_FILE" -- {places} 2>/dev/null | head -5 | '
            "tr '\\n' ' ')",
            f'if {journal} | grep -qF -f "$PASSWORD_FILE"; then FOUND="$FOUND journal"; fi',
            'rm -f "$PASSWORD_FILE"',
            "printf 'password\\t%s\\n' \"$FOUND\"",
        ]
    lines.append("exit 0")
    return "\n".join(lines) + "\n"


def _problem(fact: Fact, seen: str) -> str | None:
    kind, want = fact.kind, fact.expect
    if kind in ("exec", "file", "dir", "socket", "link"):
        ftype, _, rest = seen.partition("|")
        mode, _, extra = rest.partition("|")
        if kind == "exec":
            ok = ftype.startswith("regular") and mode.isdigit() and int(mode, 8) & 0o111 == 0o111
            return None if ok else f"not an executable file (found {ftype} {mode})"
        if kind == "file":
            ok = ftype == "regular file" and extra not in ("", "0")
            return None if ok else f"not a regular file with content (found {ftype})"
        if kind == "dir":
            if ftype != "directory":
                return f"not a directory (found {ftype})"
            return None if not want or mode == want else f"mode {mode}, not {want}"
        if kind == "socket":
            return None if ftype == "socket" else f"not a socket (found {ftype})"
        if ftype != "symbolic link":
            return f"not a symbolic link (found {ftype})"
        return None if extra == want else f"links to {extra!r}, not {want!r}"
    if kind == "line":
        return None if seen == "yes" else f"has no line {want!r}"
    if kind == "no-line":
        return None if seen in ("", "0") else f"still has a line beginning {want!r}"
    if kind == "same":
        return None if seen == "same" else f"differs from {want}"
    if kind == "none-found":
        return None if not seen.strip() else f"holds {want}: {seen.strip()}"
    return None if seen.strip() == want else f"says {seen.strip()!r}, not {want!r}"


def judge(checked: list[Fact], output: str, password_checked: bool = False) -> list[str]:
    """The problems in a probe's output; each names the path, what was expected and the
    source of the fact."""
    seen: dict[str, str] = {}
    for line in output.splitlines():
        key, _, value = line.partition("\t")
        seen[key] = value
    problems = []
    for i, fact in enumerate(checked):
        if str(i) not in seen:
            problems.append(f"{fact.describe()}: the probe printed nothing")
            continue
        problem = _problem(fact, seen[str(i)])
        if problem:
            problems.append(f"{fact.path}: {problem} ({fact.source})")
    if password_checked:
        if "password" not in seen:
            problems.append("password: the probe printed nothing")
        elif seen["password"].strip():
            problems.append(
                "the panel password is in clear text in: "
                + seen["password"].strip()
                + " ("
                + CHECK_READY
                + ")"
            )
    return problems


def check(
    run: Callable[[str], str],
    base_dir: str = "/opt",
    version: str | None = None,
    password: str | None = None,
    services: bool = True,
    root: str = "",
) -> list[str]:
    """Probe a box: ``run(script)`` runs bash with ``script`` on its standard input there and
    returns its standard output. The problems found, [] when the box has the record's
    layout."""
    checked = facts(base_dir, version, services)
    output = run(probe_script(checked, password, root, services, base_dir))
    return judge(checked, output, password_checked=bool(password))
