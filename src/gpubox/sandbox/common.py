"""What every part of the sandbox shares: its error, the cache directory, the Debian mirror
it installs from, the Hub's port, and how to tell a process we started from a new one with
its PID. A leaf: it imports nothing of the sandbox (of gpubox, only the parsers), so box.py,
the servers (repo.py, hub.py, serve.py) and debian_real.py all build on it without importing
one another back."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from gpubox.parsers import ParseError, parse_stanzas

HUB_PORT = 8766  # the Hugging Face Hub and PyPI mirror (hub.py)
MODELSCOPE_PORT = 8767  # the ModelScope mirror, HTTPS (modelscope_mirror.py)
SUITE = "bookworm"


class SandboxError(RuntimeError):
    """A sandbox operation failed; the message says what to do."""


class SandboxNotUp(SandboxError):
    pass


def cache_dir() -> Path:
    """Rootfs and repository caches: $GPUBOX_CACHE_DIR or ~/.cache/gpubox."""
    env = os.environ.get("GPUBOX_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "gpubox"


def process_start_time(pid: int) -> int | None:
    """The kernel start time of a process (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def host_apt_sources(etc: Path = Path("/etc/apt")) -> list[tuple[str, str]]:
    """(URI, suite) pairs of the host's enabled ``deb`` sources (``etc``: apt's configuration
    directory); a ``.sources`` file that cannot be read, or is not deb822, is passed over."""
    pairs: list[tuple[str, str]] = []
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        with contextlib.suppress(OSError, ParseError):
            for stanza in parse_stanzas(path.read_text()):
                if (stanza.get("Enabled") or "yes").lower() == "no":
                    continue
                if "deb" not in (stanza.get("Types") or "").split():
                    continue
                for uri in (stanza.get("URIs") or "").split():
                    pairs.extend((uri, suite) for suite in (stanza.get("Suites") or "").split())
    lists = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    for path in lists:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    pairs.append((words[1], words[2]))
    return pairs


def debian_mirror() -> str:
    """The Debian mirror URL: $GPUBOX_DEBIAN_MIRROR, else the host's apt source for bookworm."""
    env = os.environ.get("GPUBOX_DEBIAN_MIRROR")
    if env:
        return env.rstrip("/")
    for uri, suite in host_apt_sources():
        if suite == SUITE:
            return uri.rstrip("/")
    raise SandboxError(
        f"no Debian mirror found: the host's apt sources have no '{SUITE}' entry; "
        "set GPUBOX_DEBIAN_MIRROR (e.g. the URL your /etc/apt/sources.list uses)"
    )
