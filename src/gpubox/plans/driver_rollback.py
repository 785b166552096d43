"""The box-side rollback of a driver move (issue 30 C, key ``driver_rollback``): back to the
driver build kept in layout.DRIVER_KEPT_DIR/VERSION (gpubox.plans.driver_move keeps it).

One shell script, run as root after the move's reboot found the new driver failing: it checks
the kept directory (complete, its SHA256SUMS) and serves it to apt as the way back does
(driver_move.repo_command and source_line), puts back the old pin file (the kept
``apt-preferences``) and unattended-upgrades blacklist (as the stage renders it for that pin),
installs exactly the kept ``installed`` list with that source alone (apt reads no other, so
no repository is needed), removes the new build's packages the old one did not have, and
holds the old ones. dkms builds the old module for every kernel with headers in the
packages' own postinst. The reboot and the checks after it are the operation's
(gpubox.infra.driver_rollback).

Pure: text in, text out.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from gpubox.base import layout
from gpubox.base.rendering import render
from gpubox.parsers.apt import parse_stanzas
from gpubox.plans import driver_move


def blacklist_for_pin(pin: str) -> str | None:
    """The unattended-upgrades blacklist the driver stage renders beside pin file ``pin``
    (gpubox.plans.driver.plan: its pinned packages, then the other flavour's refused ones);
    None for an empty pin (the kept build had no pin file: not gpubox's)."""
    stanzas = parse_stanzas(pin)
    if not stanzas or "Package" not in stanzas[0]:
        return None
    pinned = stanzas[0]["Package"].split()
    refused: list[str] = []
    for stanza in stanzas[1:]:
        names = (stanza.get("Package") or "").split()
        if stanza.get("Pin") == "version *" and names != pinned:
            refused = names
            break
    return render("unattended-upgrades-blacklist.j2", packages=pinned + refused)


def _among_kept(command: str, names: list[str]) -> str:
    """Shell: ``command`` on those of ``names`` that are kept packages ($keep)."""
    if not names:
        return "true"
    return (
        f"these=''; for n in {' '.join(shlex.quote(n) for n in names)}; do "
        'case " $keep " in *" $n "*) these="$these $n";; esac; done; '
        f'if [ -n "$these" ]; then {command} $these; fi'
    )


def script(
    old: str,
    new_package_version: str,
    blacklist: str | None,
    kept_root: str = layout.DRIVER_KEPT_DIR,
    repo: str = layout.DRIVER_KEPT_REPO,
    source: str = layout.DRIVER_KEPT_SOURCE,
    pin_path: str = layout.DRIVER_PIN,
    blacklist_path: str = layout.UNATTENDED_BLACKLIST,
    held: Iterable[str] | None = None,
    auto: Iterable[str] = (),
) -> str:
    """The rollback to kept driver ``old``, from the new build at ``new_package_version``
    (its packages at that version that ``old`` did not have are removed). ``blacklist``: the
    unattended-upgrades blacklist to put back (None: the old driver had no pin file, so the pin
    file and the blacklist are removed). The kept build is checked and served to apt as the
    way back serves it (gpubox.plans.driver_move.repo_command and source_line: the state a
    deploy pinned to ``old`` leaves), and apt reads that source alone. On a failure it prints,
    on stderr, the step that failed, what failed on the new driver (shell variable ``why``, set
    before the script) and what to do, and exits non-zero.

    ``held`` and ``auto``: the packages apt held, and marked installed automatically, before
    the move (the box's own marks come back for the kept packages among them); ``held`` None:
    every kept package is held. (The paths: for the tests.)"""
    q = shlex.quote
    kept = f"{kept_root}/{old}"
    stop = (
        f"gpubox: the rollback to driver {old} FAILED at: %s (exit %s). The box is NOT back on "
        f"{old}, and the new driver failed its checks (%s). Nothing was rebooted. Look at the "
        f"output above, fix the cause, then install the packages {kept}/installed names by "
        f"hand (apt source: {driver_move.source_line().strip()}), or set the driver key back "
        f"to {old} and deploy again.\\n"
    )
    apt = (
        f'apt-get -q -o Dir::Etc::SourceList={q(source)} -o Dir::Etc::SourceParts="$parts" '
        "-o DPkg::Lock::Timeout=600"
    )
    if blacklist is None:
        restore = [
            f'step="removing the pin file {pin_path} (driver {old} had none)"',
            f"rm -f {q(pin_path)} {q(blacklist_path)}",
        ]
    else:
        restore = [
            f'step="restoring the pin file {pin_path}"',
            f'install -m 0644 "$d/apt-preferences" {q(pin_path)}',
            f'step="restoring the unattended-upgrades blacklist {blacklist_path}"',
            f"printf '%s' {q(blacklist)} > {q(blacklist_path)}.gpubox-new",
            f"chmod 0644 {q(blacklist_path)}.gpubox-new",
            f"mv {q(blacklist_path)}.gpubox-new {q(blacklist_path)}",
        ]
    serve = driver_move.repo_command(old, base=kept_root, repo=repo)
    # every kept package, or those of them held before (as the stage held them)
    hold = "apt-mark hold $keep" if held is None else _among_kept("apt-mark hold", sorted(held))
    marks = [_among_kept("apt-mark auto", sorted(auto))] if auto else []
    lines = [
        "set -eu",
        'why="${why:-the new driver failed its checks}"',
        f"d={q(kept)}",
        'step="finding the kept packages ($d/complete)"',
        'parts=""',
        "finish() { rc=$?; set +e; "
        '[ -z "$parts" ] || rmdir "$parts" 2>/dev/null; '
        f'if [ "$rc" -ne 0 ]; then printf {q(stop)} "$step" "$rc" "$why" >&2; fi; '
        'exit "$rc"; }',
        "trap finish EXIT",
        'test -f "$d/complete"',
        'step="reading the kept package list ($d/installed)"',
        "keep=$(cut -d= -f1 \"$d/installed\" | tr '\\n' ' ')",
        '[ -n "$keep" ]',
        f'step="checking the kept packages against $d/SHA256SUMS and serving them from {repo}"',
        f"( set +e\n{serve})",
        f'step="reading the kept packages as apt\'s only source ({source})"',
        f"printf '%s' {q(driver_move.source_line())} > {q(source)}",
        f"chmod 0644 {q(source)}",
        "parts=$(mktemp -d)",
        f"{apt} -o APT::Get::List-Cleanup=false update",
        'step="finding the new build\'s packages"',
        "gone=''",
        "for name in $(dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' "
        f"| awk -v v={q(new_package_version)} '$1 ~ /^[ih]i$/ && $3 == v {{print $2}}'); do",
        '  case " $keep " in *" $name "*) ;; *) gone="$gone $name";; esac',
        "done",
        'if [ -n "$gone" ]; then apt-mark unhold $gone; fi',
        *restore,
        f'step="installing driver {old} from the kept packages"',
        f"DEBIAN_FRONTEND=noninteractive {apt} install -y --no-install-recommends "
        "--allow-downgrades --allow-change-held-packages "
        "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "
        '$(cat "$d/installed") $(for n in $gone; do printf \'%s- \' "$n"; done)',
        f'step="holding driver {old}\'s packages"',
        hold,
        *marks,
    ]
    return "\n".join(lines) + "\n"
