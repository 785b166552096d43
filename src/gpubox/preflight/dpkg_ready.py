"""dpkg ready: wait for dpkg's locks, and finish an interrupted dpkg run, before any apt step.

A freshly installed Ubuntu server runs unattended-upgrades on its first boot (the apt-daily and
apt-daily-upgrade timers) and holds dpkg's locks for minutes; apt-get fails at once with
"Could not get lock". A deploy killed while packages unpack leaves dpkg interrupted ("dpkg was
interrupted, you must manually run 'dpkg --configure -a'") and every later apt-get fails.

``prepare`` runs once per host and run, at plan time (from ``preflight.run``, before any stage
adds an operation), so:

1. it waits until no process holds dpkg's or apt's locks and no apt-daily unit runs, bounded by
   ``apt_lock_timeout``, logging who holds them; past the bound it refuses the run (nothing
   was changed);
2. the first operation it adds writes ``DPkg::Lock::Timeout`` to an apt.conf.d file, so every
   apt-get of the deploy also waits for dpkg's locks should they be taken again between plan
   and execution (pyinfra's apt operations take no apt option of ours: the file covers them
   all, and gpubox's own apt-get commands too). ``apt-get update`` ignores that option (its
   lists lock fails at once): ``apt_update`` below waits for that lock first;
3. when dpkg was interrupted, it adds an operation that runs ``dpkg --configure -a`` (then
   ``apt-get -f install``) before anything else touches apt. A healthy host gets no such
   operation: a no-op deploy changes nothing.

Locks: apt and dpkg take fcntl (POSIX) locks, listed in /proc/locks with the file's inode; the
holder is the listed process that has the lock file open (its /proc/PID/fd), named by
/proc/PID/comm and cmdline. Nothing to install: sh, stat, awk and /proc.
"""

from __future__ import annotations

import shlex
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent
from pyinfra import host, logger
from pyinfra.api import FactBase, operation

from gpubox.base import layout
from gpubox.base.errors import DeployRefused
from gpubox.config import HostConfig, Problem
from gpubox.infra.operations import ManagedFiles

# Order matters only for the messages: the frontend lock is the one apt waits on first.
LOCKS = (
    "/var/lib/dpkg/lock-frontend",
    "/var/lib/dpkg/lock",
    "/var/lib/apt/lists/lock",
    "/var/cache/apt/archives/lock",
)
# The units that run apt-get update and unattended-upgrades (oneshots: "activating" while they
# run). They take and release the locks in turn; between two locks the unit is still busy.
APT_UNITS = ("apt-daily.service", "apt-daily-upgrade.service")
CONF_FILE = layout.DPKG_LOCK_CONF  # the name the tests use
POLL_S = 3.0
REPORT_EVERY_S = 15.0
CMDLINE_CHARS = 160
# dpkg's package states that `dpkg --configure -a` (or apt-get -f install) finishes:
# U unpacked, F half-configured, H half-installed, W triggers-awaited, t triggers-pending.
UNFINISHED_STATES = {
    "U": "unpacked, not configured",
    "F": "half-configured",
    "H": "half-installed",
    "W": "awaiting triggers",
    "t": "triggers pending",
}


# Locks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    lock: str
    pid: int  # 0: a process outside this PID namespace
    comm: str
    cmdline: str

    def __str__(self) -> str:
        if self.pid <= 0:
            return "a process outside this PID namespace"
        what = self.comm or "?"
        if self.cmdline and self.cmdline != self.comm:
            what += f": {self.cmdline}"
        return f"PID {self.pid} ({what})"


@dataclass(frozen=True)
class LockStatus:
    holders: tuple[Holder, ...] = ()
    units: tuple[str, ...] = ()  # apt units running now

    @property
    def busy(self) -> bool:
        return bool(self.holders or self.units)

    def describe(self) -> str:
        """One line: which lock, held by whom (grouped per lock), and the running apt units."""
        parts: list[str] = []
        for lock in dict.fromkeys(h.lock for h in self.holders):
            who = ", ".join(str(h) for h in self.holders if h.lock == lock)
            parts.append(f"{lock} held by {who}")
        if self.units:
            parts.append(f"{', '.join(self.units)} running")
        return "; ".join(parts) or "free"


def locks_command(paths: tuple[str, ...] = LOCKS) -> str:
    """Shell: one tab-separated line per process holding one of ``paths``:
    ``held <lock> <pid> <comm> <cmdline>``. A POSIX lock in /proc/locks on the lock file's
    inode counts when its process has the file open, or when its fds cannot be read (not
    root): an inode match on another filesystem is dropped that way. Blocked waiters ("->")
    hold nothing; apt and dpkg take neither flock(2) nor OFD locks (and /proc/locks shows
    OFD locks of every PID namespace, without a process to name)."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return (
        f"for f in {quoted}; do "
        'i=$(stat -L -c %i "$f" 2>/dev/null) || continue; '
        'for p in $(awk -v i="$i" \'$2 == "POSIX" '
        '{ n = split($6, a, ":"); if (a[n] == i) print $5 }\' /proc/locks 2>/dev/null '
        "| sort -u); do "
        'if [ "$p" -gt 0 ] 2>/dev/null && ls "/proc/$p/fd" >/dev/null 2>&1; then '
        "o=no; for d in /proc/$p/fd/*; do "
        '[ "$(readlink "$d" 2>/dev/null)" = "$f" ] && { o=yes; break; }; done; '
        '[ "$o" = yes ] || continue; fi; '
        'c=$(cat "/proc/$p/comm" 2>/dev/null); '
        "a=$(tr '\\0\\n\\t' '   ' < \"/proc/$p/cmdline\" 2>/dev/null "
        f"| cut -c1-{CMDLINE_CHARS}); "
        'printf \'held\\t%s\\t%s\\t%s\\t%s\\n\' "$f" "$p" "$c" "$a"; '
        "done; done"
    )


def units_command(units: tuple[str, ...] = APT_UNITS) -> str:
    """Shell: ``unit <name> <ActiveState>`` per unit (nothing where systemctl is absent)."""
    return (
        "command -v systemctl >/dev/null 2>&1 && "
        f"for u in {' '.join(units)}; do "
        'printf \'unit\\t%s\\t%s\\n\' "$u" "$(systemctl is-active "$u" 2>/dev/null)"; done'
    )


def parse_locks(output: list[str]) -> LockStatus:
    holders: list[Holder] = []
    units: list[str] = []
    for line in output:
        fields = line.rstrip("\n").split("\t")
        if fields[0] == "held" and len(fields) >= 3:
            try:
                pid = int(fields[2])
            except ValueError:
                continue
            comm = fields[3].strip() if len(fields) > 3 else ""
            cmdline = fields[4].strip() if len(fields) > 4 else ""
            holder = Holder(fields[1], pid, comm, cmdline)
            if holder not in holders:
                holders.append(holder)
        elif fields[0] == "unit" and fields[-1].strip() in ("activating", "deactivating"):
            # A oneshot is "activating" while it runs, "inactive" once done.
            units.append(fields[1])
    return LockStatus(tuple(holders), tuple(units))


class DpkgLocks(FactBase[LockStatus]):
    """Who holds dpkg's and apt's locks now, and whether an apt-daily unit runs."""

    def command(self) -> str:
        return f"{locks_command()}; {units_command()}; true"

    @staticmethod
    def default() -> LockStatus:
        return LockStatus()

    def process(self, output: list[str]) -> LockStatus:
        return parse_locks(output)


def progress_line(host: str, status: LockStatus, waited: float, timeout: int) -> str:
    return (
        f"{host}: waiting for dpkg: {status.describe()} "
        f"({waited:.0f} s of apt_lock_timeout {timeout} s)"
    )


def refusal(host: str, status: LockStatus, waited: float, timeout: int) -> Problem:
    return Problem(
        host,
        "apt_lock_timeout",
        f"dpkg is still busy after {waited:.0f} s: {status.describe()}. A fresh box runs "
        "unattended-upgrades for minutes after its first boot: let it finish and deploy again, "
        f"or raise apt_lock_timeout (now {timeout} s) in the inventory",
    )


def wait_until_free(
    host: str,
    timeout: int,
    probe: Callable[[], LockStatus],
    log: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Any] = time.sleep,
    poll: float = POLL_S,
    report_every: float = REPORT_EVERY_S,
) -> float:
    """Probe until dpkg is free; return the seconds waited. Logs the holder at once, then
    every ``report_every`` seconds; past ``timeout`` raises DeployRefused naming the host, the
    lock, its holder and the key."""
    timeout = max(0, timeout)
    start = clock()
    reported: float | None = None
    while True:
        status = probe()
        now = clock()
        waited = now - start
        if not status.busy:
            if reported is not None:
                log(f"{host}: dpkg is free after {waited:.0f} s; the deploy goes on")
            return waited
        if waited >= timeout:
            raise DeployRefused(
                f"dpkg is busy, nothing was changed:\n  - {refusal(host, status, waited, timeout)}"
            )
        if reported is None or now - reported >= report_every:
            log(progress_line(host, status, waited, timeout))
            reported = now
        sleep(max(0.0, min(poll, timeout - waited)))


def wait_command(timeout: int, interval: int = 2, paths: tuple[str, ...] = LOCKS) -> str:
    """Shell: the same wait at execution time (for `dpkg --configure -a`, which has no lock
    timeout of its own), failing past ``timeout`` with the holders."""
    return (
        f't=0; while h=$({locks_command(paths)}) && [ -n "$h" ]; do '
        f'if [ "$t" -ge {int(timeout)} ]; then echo "gpubox: dpkg is still busy after '
        f'{int(timeout)} s (apt_lock_timeout):" >&2; echo "$h" >&2; exit 1; fi; '
        f"sleep {interval}; t=$((t + {interval})); done"
    )


# Interrupted dpkg runs ---------------------------------------------------------------------


@dataclass(frozen=True)
class DpkgState:
    journal: tuple[str, ...] = ()  # dpkg's pending updates (/var/lib/dpkg/updates/NNNN)
    unfinished: tuple[tuple[str, str], ...] = ()  # (package, what) left half-done
    audit: tuple[str, ...] = field(default=(), compare=False)  # dpkg --audit, as it says

    @property
    def interrupted(self) -> bool:
        return bool(self.journal or self.unfinished)

    def describe(self) -> str:
        parts: list[str] = []
        if self.journal:
            parts.append(f"dpkg's journal holds {len(self.journal)} pending update(s)")
        if self.unfinished:
            shown = ", ".join(f"{name} ({what})" for name, what in self.unfinished[:6])
            more = len(self.unfinished) - 6
            parts.append(shown + (f" and {more} more" if more > 0 else ""))
        return "; ".join(parts) or "dpkg is consistent"


def dpkg_state_command() -> str:
    return (
        "for f in /var/lib/dpkg/updates/*; do "
        '[ -e "$f" ] && printf \'journal\\t%s\\n\' "${f##*/}"; done; '
        "dpkg-query -W -f='${db:Status-Abbrev}\\t${binary:Package}\\n' 2>/dev/null "
        "| grep -v '^.[nci] [[:space:]]' | sed 's/^/status\\t/'; "
        "dpkg --audit 2>&1 | head -n 40 | sed 's/^/audit\\t/'; true"
    )


def parse_dpkg_state(output: list[str]) -> DpkgState:
    journal: list[str] = []
    unfinished: list[tuple[str, str]] = []
    audit: list[str] = []
    for line in output:
        kind, _, rest = line.rstrip("\n").partition("\t")
        if kind == "journal":
            # dpkg's journal entries are all digits; apt ignores anything else (tmp files).
            if rest.isdigit():
                journal.append(rest)
        elif kind == "status":
            abbrev, _, package = rest.partition("\t")
            abbrev = abbrev.ljust(3)
            package = package.strip()
            if not package:
                continue
            what = UNFINISHED_STATES.get(abbrev[1])
            if abbrev[2] == "R":
                what = "reinstall required" + (f", {what}" if what else "")
            if what:
                unfinished.append((package, what))
        elif kind == "audit" and rest.strip():
            audit.append(rest.rstrip())
    return DpkgState(tuple(journal), tuple(unfinished), tuple(audit))


class DpkgInterrupted(FactBase[DpkgState]):
    """dpkg's journal, the packages a run left half-done, and what dpkg --audit says."""

    def command(self) -> str:
        return dpkg_state_command()

    @staticmethod
    def default() -> DpkgState:
        return DpkgState()

    def process(self, output: list[str]) -> DpkgState:
        return parse_dpkg_state(output)


# Each package dpkg marked "reinstall required" or left half-installed: dpkg refuses to
# configure it and apt's resolver does not reinstall it, so dpkg unpacks its .deb again (the
# version dpkg recorded, from apt's cache, else downloaded; else apt's candidate).
REINSTALL = r"""
r=$(dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\n' |
    awk 'substr($0, 3, 1) == "R" || substr($0, 2, 1) == "H" { print $2 }')
[ -n "$r" ] || exit 0
t=$(mktemp -d) && trap 'rm -rf "$t"' EXIT
for p in $r; do
  n=${p%%:*}
  v=$(dpkg-query -W -f='${Version}' "$p")
  a=$(dpkg-query -W -f='${Architecture}' "$p")
  f=/var/cache/apt/archives/${n}_$(printf %s "$v" | sed 's/:/%3a/')_$a.deb
  if [ ! -f "$f" ]; then
    (cd "$t" && { apt-get download "$p=$v" || apt-get download "$p"; }) >&2
    f=$(ls "$t/${n}"_*.deb 2>/dev/null | head -n 1)
  fi
  if [ -z "$f" ]; then echo "gpubox: no .deb of $p $v to reinstall" >&2; exit 1; fi
  echo "gpubox: reinstalling $p from $f"
  DEBIAN_FRONTEND=noninteractive dpkg --unpack --force-confdef --force-confold "$f" || exit 1
done
DEBIAN_FRONTEND=noninteractive dpkg --configure -a --force-confdef --force-confold ||
  echo 'gpubox: dpkg --configure -a left work for apt-get'
""".strip()


def recovery_commands(lock_timeout: int) -> list[str]:
    """Finish what an interrupted run left: configure what was unpacked, unpack again what
    dpkg left half-done, then let apt repair the dependencies (the transaction that was
    killed may have been a downgrade: the pinned driver over a newer one)."""
    t = int(lock_timeout)
    return [
        wait_command(t),
        "DEBIAN_FRONTEND=noninteractive dpkg --configure -a --force-confdef --force-confold "
        "|| echo 'gpubox: dpkg --configure -a left work for apt-get'",
        REINSTALL,
        f"DEBIAN_FRONTEND=noninteractive apt-get -y -o DPkg::Lock::Timeout={t} "
        '-o Dpkg::Options::="--force-confdef" -o Dpkg::Options::="--force-confold" '
        "--allow-downgrades --allow-change-held-packages -f install",
    ]


@operation(is_idempotent=False)
def recover_dpkg(lock_timeout: int):
    """`dpkg --configure -a`, then `apt-get -f install` (reinstalling what dpkg cannot
    configure), when dpkg's last run was interrupted."""
    state = host.get_fact(DpkgInterrupted)
    if not state.interrupted:
        host.noop("dpkg is consistent")
        return
    yield from recovery_commands(lock_timeout)


# apt's own wait ---------------------------------------------------------------------------


@operation(is_idempotent=False)
def apt_update(lock_timeout: int = 900):
    """`apt-get update`, after waiting for apt's lists lock: apt-get update ignores
    DPkg::Lock::Timeout and fails at once while apt-daily refreshes the lists."""
    yield f"{wait_command(lock_timeout, paths=('/var/lib/apt/lists/lock',))} && apt-get update"


def lock_timeout_conf(timeout: int) -> str:
    return (
        "// Managed by gpubox (inventory key apt_lock_timeout): apt-get waits this many\n"
        "// seconds for dpkg's lock, taken by unattended-upgrades on a fresh box, instead of\n"
        '// failing at once with "Could not get lock".\n'
        f'DPkg::Lock::Timeout "{max(0, int(timeout))}";\n'
    )


# The hook ---------------------------------------------------------------------------------

_prepared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def prepare(config: HostConfig) -> None:
    """Once per host and run, before any stage's operation: wait for dpkg (or refuse), then
    add apt's lock timeout file and, when dpkg was interrupted, its recovery."""
    done = _prepared.setdefault(host.state, set())
    if host.name in done:
        return
    done.add(host.name)

    timeout = int(config.apt_lock_timeout)
    wait_until_free(
        host.name, timeout, lambda: host.get_fact(DpkgLocks), logger.info, sleep=gevent.sleep
    )

    managed = ManagedFiles({layout.DPKG_LOCK_CONF: lock_timeout_conf(timeout)})
    managed.put(f"apt-get waits up to {timeout} s for dpkg's lock", layout.DPKG_LOCK_CONF)

    state = host.get_fact(DpkgInterrupted)
    if state.interrupted:
        logger.warning(f"{host.name}: dpkg was interrupted ({state.describe()}): recovering")
        recover_dpkg(
            name=f"Finish dpkg's interrupted run ({state.describe()})", lock_timeout=timeout
        )
