"""Debian package versions: dpkg's ordering, and pins that are apt version patterns.

A catalog pin is normally one exact version. A few are patterns in apt's own glob syntax
("*+cuda12.8"): the repository publishes several builds of the package, the catalog names the
family it wants, and the repository's answer on the box decides the one exact version that is
installed and held (``resolve``). A version's release line (``line``: its epoch and the first
numbers of its upstream version, e.g. driver branch 570 or CUDA 12.8) says which newer versions
are the same line's (``newest_in_line``, what `gpubox outdated` lists). Pure functions; nothing
of gpubox is imported.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from fnmatch import fnmatchcase

_LEADING_NUMBERS = re.compile(r"\d+(?:\.\d+)*")


def is_pattern(pin: str) -> bool:
    """Whether ``pin`` is a pattern ("*" or "?"): Debian versions never hold either."""
    return "*" in pin or "?" in pin


def satisfies(pin: str, versions: Iterable[str]) -> bool:
    """Whether one of ``versions`` is ``pin`` (exact) or matches it (a pattern)."""
    if is_pattern(pin):
        return any(fnmatchcase(v, pin) for v in versions)
    return pin in versions


def _order(c: str) -> int:
    """dpkg's weight of one character of a non-digit part ("" is the end of the string)."""
    if not c or c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    if c == "~":
        return -1
    return ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit runs (by _order) and numbers (by value)."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i] if i < len(a) else "")
            bc = _order(b[j] if j < len(b) else "")
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        start_i, start_j = i, j
        while i < len(a) and a[i].isdigit():
            i += 1
        while j < len(b) and b[j].isdigit():
            j += 1
        x, y = int(a[start_i:i] or 0), int(b[start_j:j] or 0)
        if x != y:
            return x - y
    return 0


def _split(version: str) -> tuple[int, str, str]:
    epoch, colon, rest = version.partition(":")
    if not colon:
        epoch, rest = "0", version
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    return int(epoch) if epoch.isdigit() else 0, upstream, revision


def compare(a: str, b: str) -> int:
    """<0, 0 or >0 as ``a`` sorts before, with or after ``b`` (dpkg --compare-versions)."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return ea - eb
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def newest(versions: Iterable[str]) -> str | None:
    """The highest of ``versions`` in dpkg's order (None for none)."""
    best: str | None = None
    for version in versions:
        if best is None or compare(version, best) > 0:
            best = version
    return best


def resolve(
    pin: str,
    offered: Mapping[str, Collection[str]],
    installed: Mapping[str, Collection[str]],
    packages: Iterable[str],
) -> str | None:
    """The one exact version of ``packages`` (installed together at one version) that ``pin``
    stands for: an exact pin is itself; a pattern is the version they are all installed at
    when it matches (a re-run changes nothing), otherwise the newest matching version the
    repository offers for every one of them. None when the repository offers none."""
    names = list(packages)
    if not is_pattern(pin):
        return pin
    common = set.intersection(*(set(installed.get(n, [])) for n in names)) if names else set()
    here = [v for v in common if fnmatchcase(v, pin)]
    if here:
        return newest(here)
    sets = [set(offered.get(n, [])) for n in names]
    candidates = set.intersection(*sets) if sets else set()
    return newest(v for v in candidates if fnmatchcase(v, pin))


def line(version: str, parts: int) -> tuple[int, tuple[int, ...]] | None:
    """The release line of ``version``: its epoch and the first ``parts`` numbers of its upstream
    version ("570.211.01-1", 1 -> (0, (570,)); "1:4.4.1-1", 1 -> (1, (4,)); "12.8.1-1", 2 ->
    (0, (12, 8))). None when the upstream version does not start with that many numbers."""
    epoch, upstream, _ = _split(version)
    found = _LEADING_NUMBERS.match(upstream)
    numbers = tuple(int(n) for n in found.group().split(".")) if found else ()
    if len(numbers) < parts:
        return None
    return epoch, numbers[:parts]


def in_line(version: str, pin: str, parts: int) -> bool:
    """Whether ``version`` is of ``pin``'s line: a pattern pin is its own line (the versions
    it matches); an exact one shares its epoch and first ``parts`` upstream numbers."""
    if is_pattern(pin):
        return fnmatchcase(version, pin)
    mine = line(pin, parts)
    return mine is not None and line(version, parts) == mine


def newest_in_line(versions: Iterable[str], pin: str, parts: int) -> str | None:
    """The highest of ``versions`` in ``pin``'s line (``in_line``); None when none is."""
    return newest(v for v in versions if in_line(v, pin, parts))
