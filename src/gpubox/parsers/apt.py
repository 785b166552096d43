"""apt and dpkg: `apt-cache policy`, `apt-mark showhold`, `dpkg-query`, and deb822 stanzas (a
Packages index, a dpkg status file, a package's control file, `apt-cache show`, an apt
preferences file, a ``.sources`` file), read and written."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from gpubox.parsers._common import ParseError, _lines, _quote

# --------------------------------------------------------------------------- apt-cache policy


@dataclass(frozen=True)
class AptPolicyVersion:
    version: str
    priority: int  # the version's pin priority (1001, 500, 100, -1, ...)
    sources: list[str]  # "http://mirror.example.org/debian bookworm/main amd64 Packages", ...
    source_priorities: list[int] = field(default_factory=list)  # one per source
    installed: bool = False  # marked "***"


@dataclass(frozen=True)
class AptPolicy:
    installed: str | None
    candidate: str | None
    versions: list[AptPolicyVersion] = field(default_factory=list)


_POLICY_PACKAGE = re.compile(r"^(\S+):\s*$")
_POLICY_FIELD = re.compile(r"^  (Installed|Candidate): (.+?)\s*$")
_POLICY_VERSION = re.compile(r"^ (\*\*\*| {3}) (\S+) (-?\d+)\s*$")
_POLICY_SOURCE = re.compile(r"^ {8}(-?\d+) (.+?)\s*$")


@dataclass
class _PolicyBuilder:
    installed: str | None = None
    candidate: str | None = None
    versions: list[AptPolicyVersion] = field(default_factory=list)


def parse_apt_policy(text: str) -> dict[str, AptPolicy]:
    """`apt-cache policy PKG1 PKG2 ...` (in the C locale): per package, the installed and
    candidate versions ("(none)" becomes None) and the version table with each version's
    priority, its sources and whether it is the installed one ("***"). A package apt does
    not know prints nothing and is absent from the result."""
    packages: dict[str, _PolicyBuilder] = {}
    current: _PolicyBuilder | None = None
    version: AptPolicyVersion | None = None
    for line in _lines(text):
        if not line.strip() or line.startswith(("N: ", "W: ")):
            continue
        package = _POLICY_PACKAGE.match(line)
        if package:
            current = packages[package.group(1)] = _PolicyBuilder()
            version = None
            continue
        if current is None:
            raise ParseError(
                f"expected a 'PACKAGE:' line first (is this `apt-cache policy PKG...` in the C "
                f"locale?): {_quote(line)}"
            )
        fld = _POLICY_FIELD.match(line)
        if fld:
            value = None if fld.group(2) == "(none)" else fld.group(2)
            if fld.group(1) == "Installed":
                current.installed = value
            else:
                current.candidate = value
            continue
        if line.strip() == "Version table:":
            continue
        ver = _POLICY_VERSION.match(line)
        if ver:
            version = AptPolicyVersion(
                ver.group(2), int(ver.group(3)), [], [], installed=ver.group(1) == "***"
            )
            current.versions.append(version)
            continue
        src = _POLICY_SOURCE.match(line)
        if src and version is not None:
            version.sources.append(src.group(2))
            version.source_priorities.append(int(src.group(1)))
            continue
        raise ParseError(
            f"unexpected line in `apt-cache policy` output (C locale expected): {_quote(line)}"
        )
    return {name: AptPolicy(b.installed, b.candidate, b.versions) for name, b in packages.items()}


# --------------------------------------------------------------------------- apt-mark, dpkg


_PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.\-]+(?::[a-z0-9\-]+)?$")


def parse_showhold(text: str) -> set[str]:
    """`apt-mark showhold`: the held package names (one per line, possibly ":arch")."""
    held: set[str] = set()
    for line in _lines(text):
        name = line.strip()
        if not name:
            continue
        if not _PACKAGE_NAME.match(name):
            raise ParseError(f"not a package name in `apt-mark showhold` output: {_quote(line)}")
        held.add(name)
    return held


@dataclass(frozen=True)
class DpkgPackage:
    name: str
    version: str
    status: str  # db:Status-Abbrev, three characters: "ii ", "hi ", "rc ", "iU "...

    @property
    def installed(self) -> bool:
        """Unpacked and configured ("ii", "hi")."""
        return self.status[1:2] == "i"

    @property
    def held(self) -> bool:
        return self.status[:1] == "h"


_STATUS_ABBREV = re.compile(r"^[uihrp][ncHUFWti][ R]?$")


def parse_dpkg_query(text: str) -> dict[str, DpkgPackage]:
    """`dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'`: packages by
    name. The status keeps dpkg's three columns ("ii ", "hi ", "rc "; padded if stripped).
    dpkg-query's own "no packages found matching" messages are skipped."""
    packages: dict[str, DpkgPackage] = {}
    for line in _lines(text):
        if not line.strip() or line.startswith("dpkg-query: "):
            continue
        cells = line.split("\t")
        if len(cells) != 3:
            raise ParseError(
                "want 'PACKAGE<TAB>VERSION<TAB>STATUS' (dpkg-query -W -f='${Package}\\t"
                f"${{Version}}\\t${{db:Status-Abbrev}}\\n'): {_quote(line)}"
            )
        name, version, status = cells[0].strip(), cells[1].strip(), cells[2].rstrip("\n")
        if not _STATUS_ABBREV.match(status.rstrip() or "?"):
            raise ParseError(f"not a dpkg status abbreviation {status!r}: {_quote(line)}")
        packages[name] = DpkgPackage(name, version, status.ljust(3)[:3])
    return packages


# --------------------------------------------------------------------------- deb822 stanzas

# Debian Policy 5.1: a field name is printable US-ASCII but space and colon, and starts with
# neither '#' nor '-'.
_FIELD_NAME = re.compile(r"^[!-\"$-,.-9;-~][!-9;-~]*$")


@dataclass(frozen=True)
class Stanza:
    r"""One deb822 stanza: its fields in their order, each value as the text holds it. A
    value is its first line without the whitespace around it, then each continuation line
    with its newline and its leading whitespace as written ("Depends: a,\n b" holds
    ``"a,\n b"``; "Conffiles:\n /etc/x 0123" holds ``"\n /etc/x 0123"``).

    Iterating gives the (name, value) pairs; ``stanza["Package"]``, ``stanza.get("Package")``
    and ``"Package" in stanza`` look a field up by its name, in any case (field names are
    case-insensitive: Debian Policy 5.1)."""

    fields: tuple[tuple[str, str], ...]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def get(self, name: str, default: str | None = None) -> str | None:
        wanted = name.lower()
        for key, value in self.fields:
            if key.lower() == wanted:
                return value
        return default

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None


def parse_stanzas(text: str) -> list[Stanza]:
    """Every stanza of deb822 text, in order. Stanzas are separated by one or more lines that
    are empty or hold only whitespace; a line that starts with ``#`` is a comment and is
    dropped wherever it stands (apt's ``.sources`` and preferences files have them, a
    recording's header too). Every other line is a field, "Name: value", or a continuation
    of the field above it (it starts with a space or a tab).

    Raises ParseError on a line that is neither, on a continuation line with no field above
    it, and on a field named twice in one stanza (dpkg refuses that too: "duplicate value
    for 'Version' field")."""
    stanzas: list[Stanza] = []
    fields: list[tuple[str, str]] = []
    seen: set[str] = set()
    for line in _lines(text):
        if line.startswith("#"):
            continue
        if not line.strip():
            if fields:
                stanzas.append(Stanza(tuple(fields)))
            fields, seen = [], set()
            continue
        if line[0] in " \t":
            if not fields:
                raise ParseError(f"a continuation line with no field above it: {_quote(line)}")
            name, value = fields[-1]
            fields[-1] = (name, value + "\n" + line)
            continue
        name, colon, value = line.partition(":")
        if not colon or not _FIELD_NAME.match(name):
            raise ParseError(f"want 'Name: value' (a deb822 field): {_quote(line)}")
        if name.lower() in seen:
            raise ParseError(f"the field {name!r} twice in one stanza: {_quote(line)}")
        seen.add(name.lower())
        fields.append((name, value.strip()))
    if fields:
        stanzas.append(Stanza(tuple(fields)))
    return stanzas


def format_stanza(fields: Iterable[tuple[str, str]]) -> str:
    """A stanza as deb822 text: one "Name: value" line per field in its order (a value's
    continuation lines as it holds them; "Name:" alone when the value starts on the next
    line, as dpkg writes Conffiles), each ending in a newline. ``parse_stanzas`` reads it
    back to the same fields; a name or value it could not (a bad name, whitespace around the
    first line, a continuation line that is empty or does not start with whitespace) raises
    ValueError."""
    out = []
    for name, value in fields:
        first, *rest = value.split("\n")
        if not _FIELD_NAME.match(name) or first != first.strip():
            raise ValueError(f"not a deb822 field: {name!r}: {value!r}")
        if any(not line.strip() or line[0] not in " \t" for line in rest):
            raise ValueError(f"the field {name!r} has a line that is not a continuation line")
        out.append(f"{name}:{value}\n" if value.startswith("\n") else f"{name}: {value}\n")
    return "".join(out)


def format_stanzas(stanzas: Iterable[Iterable[tuple[str, str]]]) -> str:
    """Stanzas as deb822 text, a blank line between each two (a Packages index, a dpkg
    status file)."""
    return "\n".join(format_stanza(stanza) for stanza in stanzas)
