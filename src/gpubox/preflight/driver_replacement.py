"""What installing the pinned driver removes from a box that already runs another driver, said
before anything changes.

A box may run Ubuntu's own driver (Additional Drivers installs ``nvidia-driver-580``, or
``nvidia-driver-470`` for a Kepler display card) or Debian's. Installing NVIDIA's pinned roots
removes it: the pinned packages conflict with it. Preflight asks apt what exactly goes, in a
private apt root, and prints it; the deploy removes nothing on its own account.

How apt is asked (``simulate_command``): before the driver stage the host has neither NVIDIA's
repository nor gpubox's pin, so ``apt-get -s`` runs with its own directories under
/var/cache/gpubox/apt-query/driver-replacement: the host's own sources plus NVIDIA's repository
line (``[trusted=yes]``: a read-only simulation), the rendered driver pin as the only
preferences, the host's real dpkg status (read, never written), and package lists reused, not
downloaded: the host's /var/lib/apt/lists files and the NVIDIA lists that preflight's
repository query (gpubox.rules.offers) already fetched, hard-linked (copied across file systems).
The host's apt configuration, lists and status are never written.

When it runs (``installed_distro_driver``): only when a package of a driver build (source
``nvidia-graphics-drivers*`` or Canonical's ``linux-restricted-*`` modules) is installed at a
version other than the pinned one. dpkg's status carries no origin; NVIDIA's own packages are
builds of the same sources, so the version decides: on a converged box every one of them is at
the pinned version and nothing runs (a no-op re-deploy costs one dpkg-query). A firmware
package left by a replaced build (``nvidia-firmware-*``, which the install does not remove and
``apt autoremove`` does) does not count.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pyinfra import host, logger
from pyinfra.api import FactBase

from gpubox.base import layout
from gpubox.config import HostConfig, Target
from gpubox.plans import driver_move
from gpubox.plans.driver import DriverPlan
from gpubox.preflight import driver_kept
from gpubox.rules import offers
from gpubox.rules.apt_sources import source_line

MARK = "# gpubox-driver-replacement"
DRIVER_SOURCES = re.compile(
    r"^(nvidia-graphics-drivers|linux-restricted-modules|linux-restricted-signatures)"
)
# dpkg-query: status, name, version and source of every installed package of a driver source.
INSTALLED_COMMAND = (
    "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\t${source:Package}\\n' "
    "2>/dev/null | awk -F'\\t' '$1 ~ /^.i/ && $4 ~ "
    "/^(nvidia-graphics-drivers|linux-restricted-modules|linux-restricted-signatures)/'"
    " || true"
)


@dataclass
class Simulation:
    """apt's answer: what the install would remove and install, or why it could not say."""

    removed: list[tuple[str, str]] = field(default_factory=list)  # (package, version)
    installed: list[tuple[str, str]] = field(default_factory=list)  # (package, new version)
    error: str | None = None


# apt-get -s: "Remv name [version]", "Inst name [old] (new Origin:Suite [arch])"
_REMV = re.compile(r"^Remv (\S+)(?: \[([^\]]+)\])?")
_INST = re.compile(r"^Inst (\S+)(?: \[[^\]]+\])? \((\S+)")


def parse_simulation(lines: Iterable[str]) -> Simulation:
    """``apt-get -s install`` output: its Remv and Inst lines, and its ``E:`` lines as the
    error (apt's own words); everything else (Conf lines, the summary) is ignored."""
    sim = Simulation()
    errors: list[str] = []
    for raw in lines:
        line = raw.rstrip("\n")
        if m := _REMV.match(line):
            sim.removed.append((m[1], m[2] or ""))
        elif m := _INST.match(line):
            sim.installed.append((m[1], m[2]))
        elif line.startswith("E: "):
            errors.append(line[3:].strip())
    if errors:
        sim.error = " ".join(errors)
    return sim


def parse_installed(lines: Iterable[str]) -> dict[str, tuple[str, str]]:
    """INSTALLED_COMMAND's output: package -> (version, source package)."""
    found: dict[str, tuple[str, str]] = {}
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if len(parts) == 4 and parts[1] and parts[2]:
            found[parts[1]] = (parts[2], parts[3] or parts[1])
    return found


def installed_distro_driver(
    installed: Mapping[str, tuple[str, str]], package_version: str
) -> list[str]:
    """The installed driver-build packages that are not NVIDIA's build at the pinned version
    (see the module's docstring for why the version decides); firmware packages aside."""
    return sorted(
        name
        for name, (version, source) in installed.items()
        if DRIVER_SOURCES.match(source)
        and version != package_version
        and not name.startswith("nvidia-firmware-")
    )


def simulate_command(
    source_line: str,
    pin_text: str,
    install: Sequence[str],
    base: str = layout.APT_QUERY_DIR,
    *,
    state: str = "/var/lib/apt",
    status: str = "/var/lib/dpkg/status",
    etc: str = "/etc/apt",
    skip_source: str = "",
    kept: str = "",
) -> str:
    """Shell that prints ``apt-get -s install --no-install-recommends --allow-downgrades
    INSTALL`` as apt answers it in a private root (see the module's docstring); always exits 0,
    an ``E:`` line says what went wrong. ``install``: ``name=version`` words. ``skip_source``:
    a host source file left out (gpubox's own NVIDIA source, which the added line replaces).
    ``kept``: a kept driver build's directory (gpubox.plans.driver_move) whose Packages index
    apt sees as the kept repository's, as the stage will serve it (the way back)."""
    d = f"{base}/driver-replacement"
    q = f"{base}/nvidia_cuda"
    opts = " ".join(
        f"-o {shlex.quote(o)}"
        for o in (
            f"Dir::Etc::sourcelist={d}/sources.list",
            f"Dir::Etc::sourceparts={d}/parts",
            "Dir::Etc::preferences=/dev/null",
            f"Dir::Etc::preferencesparts={d}/prefs",
            f"Dir::State::Lists={d}/lists",
            f"Dir::State::status={status}",
            f"Dir::State::extended_states={d}/extended_states",
            f"Dir::Cache={d}/cache",
            "Debug::NoLocking=1",
        )
    )
    words = " ".join(shlex.quote(w) for w in install)
    return (
        f"{MARK}\n"
        f"d={shlex.quote(d)}; q={shlex.quote(q)}; s={shlex.quote(state)}; "
        f"e={shlex.quote(etc)}; skip={shlex.quote(skip_source)}\n"
        'rm -rf "$d" && mkdir -p "$d/lists/partial" "$d/parts" "$d/prefs" '
        '"$d/cache/archives/partial" || { echo "E: cannot write $d"; exit 0; }\n'
        'ls "$q"/lists/*Packages* >/dev/null 2>&1 || { echo "E: no index of NVIDIA\'s '
        "repository in $q/lists (preflight's repository query fetches it)\"; exit 0; }\n"
        'for f in "$s"/lists/* "$q"/lists/*; do [ -f "$f" ] || continue; '
        'case "${f##*/}" in lock) continue;; esac; '
        'ln -f "$f" "$d/lists/" 2>/dev/null || cp -f "$f" "$d/lists/" || '
        '{ echo "E: cannot copy $f"; exit 0; }; done\n'
        'cp "$s/extended_states" "$d/extended_states" 2>/dev/null || : > "$d/extended_states"\n'
        'if [ -f "$e/sources.list" ]; then cp "$e/sources.list" "$d/sources.list"; '
        'else : > "$d/sources.list"; fi\n'
        'for f in "$e"/sources.list.d/*.list "$e"/sources.list.d/*.sources; do '
        '[ -f "$f" ] && [ "$f" != "$skip" ] && cp "$f" "$d/parts/"; done\n'
        f'printf "%s\\n" {shlex.quote(offers.trusted_source_line(source_line))} '
        '> "$d/parts/zz-gpubox-nvidia.list"\n'
        f'printf "%s" {shlex.quote(pin_text)} > "$d/prefs/90-gpubox-nvidia-driver"\n'
        + (_kept_lines(kept) if kept else "")
        + f"LC_ALL=C apt-get -s -q {opts} install --no-install-recommends --allow-downgrades "
        f"{words} 2>&1\n"
        'rc=$?; [ $rc -eq 0 ] || echo "E: apt-get -s exited with status $rc"\n'
        "exit 0"
    )


def _kept_lines(kept: str) -> str:
    """The simulation's kept repository: its source line and its index, as apt-get update
    would list it (the file name apt gives a flat ``file:`` repository's Packages)."""
    line = driver_move.source_line().strip()
    listed = layout.DRIVER_KEPT_REPO.replace("/", "_") + "_._Packages"
    return (
        f'printf "%s\\n" {shlex.quote(line)} > "$d/parts/zz-gpubox-driver-kept.list"\n'
        f'cp {shlex.quote(kept)}/Packages "$d/lists/{listed}" || '
        f'{{ echo "E: cannot read {kept}/Packages"; exit 0; }}\n'
    )


class InstalledDriverBuilds(FactBase[dict[str, tuple[str, str]]]):
    """Installed packages of a driver build: name -> (version, source package)."""

    def command(self) -> str:  # type: ignore[override]
        return INSTALLED_COMMAND

    @staticmethod
    def default() -> dict[str, tuple[str, str]]:  # no output: none installed
        return {}

    def process(self, output: list[str]) -> dict[str, tuple[str, str]]:
        return parse_installed(output)


class DriverReplacement(FactBase[Simulation]):
    """apt's simulation of the driver install in a private root (``simulate_command``)."""

    def command(  # type: ignore[override]
        self,
        source_line: str,
        pin_text: str,
        install: tuple[str, ...],
        skip_source: str = "",
        kept: str = "",
    ) -> str:
        return simulate_command(source_line, pin_text, install, skip_source=skip_source, kept=kept)

    def process(self, output: list[str]) -> Simulation:
        return parse_simulation(output)


def report(
    host: str, simulation: Simulation, sources: Mapping[str, tuple[str, str]] | None = None
) -> list[str]:
    """The lines preflight prints (without its prefix): what the install removes, grouped by
    driver build (source package and version), and why; or why apt could not say."""
    if simulation.error is not None:
        return [
            f"{host}: cannot tell what installing the pinned driver removes (apt's simulation "
            f"failed: {simulation.error}); the deploy goes on, apt removes what conflicts"
        ]
    if not simulation.removed:
        return []
    known = dict(sources or {})
    groups: dict[str, list[str]] = {}
    for name, version in simulation.removed:
        source = known.get(name, ("", ""))[1]
        key = f"{source} {version}" if DRIVER_SOURCES.match(source) else ""
        groups.setdefault(key, []).append(name if key else f"{name} {version}".strip())
    count = len(simulation.removed)
    lines = [
        f"{host}: installing the pinned driver removes {count} packages of the driver "
        "installed now:"
    ]
    for key in sorted(k for k in groups if k):
        lines.append(f"  {key}: {', '.join(sorted(groups[key]))}")
    if "" in groups:
        lines.append(f"  not a driver build: {', '.join(sorted(groups['']))}")
    lines.append(
        f"{host}: the deploy removes them only because installing the pinned driver must (its "
        "packages conflict with them; apt's own simulation, nothing has changed yet); nothing "
        "beyond this list is removed"
    )
    return lines


def warn_before_install(
    config: HostConfig,
    target: Target,
    plan: DriverPlan,
    *,
    reboot: str | None = None,
    who: str = "",
    secure_boot_key: tuple[str, str] | None = None,
) -> dict[str, list[str]]:
    """Preflight for the driver stage: when another driver build is installed, log the move
    (from and to, the old build kept first, the reboot as ``reboot`` says:
    gpubox.plans.driver_move.reboot_action; under Secure Boot the key that signs the new
    modules) and what installing the pinned one removes (apt's simulation), before any
    operation is added. A simulation that fails is a warning naming why, never a refusal.
    Returns the builds the move replaces (gpubox.plans.driver_move.old_builds; {}: none)."""
    installed = host.get_fact(InstalledDriverBuilds) or {}
    names = installed_distro_driver(installed, plan.package_version)
    if not names:
        return {}
    old = driver_move.old_builds(installed, names)
    kept = driver_kept.kept(config)
    simulation = host.get_fact(
        DriverReplacement,
        source_line=source_line(config, "nvidia_cuda", target),
        pin_text=plan.pin,
        install=tuple(f"{name}={plan.package_version}" for name in plan.install),
        skip_source=config.catalog["repos"]["nvidia_cuda"]["source_file"],
        kept=driver_move.kept_dir(config.driver_version)
        if config.driver_version in kept.versions
        else "",
    )
    if simulation is None:  # no output at all
        simulation = Simulation(error="apt printed nothing")
    lines = driver_move.move_lines(
        config.host,
        old,
        config.driver_version,
        plan.package_version,
        kept=kept.versions,
        reboot=reboot,
        who=who,
        secure_boot_key=secure_boot_key,
    )
    for line in lines[:1] + report(config.host, simulation, installed) + lines[1:]:
        logger.warning(f"preflight: {line}")
    return old
