"""apt and dpkg: `apt-cache policy`, `apt-mark showhold` and `dpkg-query`."""

from __future__ import annotations

import re
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
