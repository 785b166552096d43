"""A move to another driver build, and the way back: what the driver stage says before it, how
it keeps the installed build's packages first, and how a kept build is installed again (pure:
commands, their parsers, the offers merge and the warning's lines).

The kept packages (layout.DRIVER_KEPT_DIR, root-only)::

    <version>/                  the upstream version (570.211.01), one directory per build
      <name>_<version>_<arch>.deb   every installed package of the build, at its version
      SHA256SUMS                    sha256sum's lines, bare file names
      Packages                      a flat apt index of the .debs (dpkg-deb -f, Filename, Size,
                                    SHA256)
      installed                     name=version per line: what was installed (the restore list)
      apt-preferences               the driver pin file as it was when the build was kept
      complete                      written last; a directory without it is ignored

Which packages: every installed package at the exact version of the build's packages (the
versions of the driver-build packages that gpubox.preflight.driver_replacement finds at a
version other than the pinned one): the build's own source (nvidia-graphics-drivers*) and the
companions NVIDIA builds at the same version (nvidia-modprobe, nvidia-persistenced, ...), which
the pin also covers. Each .deb comes from apt's cache when a file of that exact name, version
and architecture is there, else from ``apt-get download name=version`` (while the repository
still offers it). Written into a temporary directory beside it, then renamed into place.

The way back: when the pinned version is kept, its Packages stanzas count as offered
(``kept_offers``: the plan, preflight's refusal of a missing pin and the kept answers see them),
and the stage serves the kept files to apt as a flat repository (``source_line``). apt-get
update reads a ``file:`` source as its sandbox user ``_apt``, who cannot enter the root-only
directory; so the verified files (``repo_command``: sha256sum -c first, failing with the file's
name) are hard-linked into layout.DRIVER_KEPT_REPO, a root-owned directory anyone may read
(the same files: apt checks each against the index's SHA256 as it installs it).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpubox.base import layout
from gpubox.plans.driver import offered_from_stanzas

KEEP_MARK = "# gpubox-keep-driver"
KEPT_MARK = "# gpubox-driver-kept"
REPO_MARK = "# gpubox-driver-kept-repo"
APT_ARCHIVES = "/var/cache/apt/archives"


def upstream(version: str) -> str:
    """A Debian version's upstream part: ``570.211.01-0ubuntu1`` -> ``570.211.01`` (an epoch
    and the revision dropped)."""
    version = version.split(":", 1)[1] if ":" in version else version
    return version.rsplit("-", 1)[0] if "-" in version else version


def old_builds(
    installed: Mapping[str, tuple[str, str]], names: Iterable[str]
) -> dict[str, list[str]]:
    """The builds a move replaces: upstream version -> the package versions of ``names`` (the
    other builds' packages, gpubox.preflight.driver_replacement.installed_distro_driver) at
    it, sorted."""
    builds: dict[str, set[str]] = {}
    for name in names:
        version = installed[name][0]
        builds.setdefault(upstream(version), set()).add(version)
    return {v: sorted(pvs) for v, pvs in sorted(builds.items())}


def kept_dir(version: str) -> str:
    return f"{layout.DRIVER_KEPT_DIR}/{version}"


def keep_command(
    version: str,
    package_versions: Sequence[str],
    *,
    base: str = layout.DRIVER_KEPT_DIR,
    cache: str = APT_ARCHIVES,
    pin: str = layout.DRIVER_PIN,
) -> str:
    """Shell that keeps every installed package at one of ``package_versions`` in
    kept_dir(version) (see the module's docstring); exits 1 naming the packages it cannot keep,
    before anything else changes. Leaves a complete directory as it is. (``base``, ``cache``
    and ``pin``: the paths, for the tests.)"""
    k, dest = base, f"{base}/{version}"
    wanted = " " + " ".join(package_versions) + " "
    awk = '$1 ~ /^.i/ && index(vs, " " $3 " ") { print $2 "\\t" $3 "\\t" $4 }'
    fmt = "${db:Status-Abbrev}\\t${Package}\\t${Version}\\t${Architecture}\\n"
    q = shlex.quote
    remedy = (
        f"Nothing was removed or changed. To go on, put their .deb files into {cache} "
        "(apt-get download NAME=VERSION from a mirror that still has them, or rebuilt from the "
        f"installed files: cd {cache} && dpkg-repack NAME...), then deploy again"
    )
    return (
        f"{KEEP_MARK} {version}\n"
        f"k={q(k)}; v={q(version)}; dest={q(dest)}; pin={q(pin)}; cache={q(cache)}\n"
        'if [ -f "$dest/complete" ]; then echo "driver $v: kept already in $dest"; exit 0; fi\n'
        "umask 022\n"
        'mkdir -p "$k" && chown root:root "$k" && chmod 0700 "$k" || exit 1\n'
        'tmp=$(mktemp -d "$k/.keep-$v.XXXXXX") || exit 1\n'
        "trap 'rm -rf \"$tmp\"' EXIT\n"
        'mkdir "$tmp/.dl" || exit 1\n'
        f"dpkg-query -W -f={q(fmt)} 2>/dev/null | awk -F'\\t' -v vs={q(wanted)} {q(awk)} "
        '| sort > "$tmp/.list"\n'
        'n=$(wc -l < "$tmp/.list")\n'
        'if [ "$n" -eq 0 ]; then echo "gpubox: no installed package of driver $v to keep" >&2; '
        "exit 1; fi\n"
        "echo \"driver $v: keeping its $n installed packages in $dest (from apt's cache, or "
        'downloaded)"\n'
        "tab=$(printf '\\t'); missing=\n"
        'while IFS="$tab" read -r name ver arch; do\n'
        '  f="${name}_$(printf %s "$ver" | sed \'s/:/%3a/g\')_${arch}.deb"\n'
        '  if [ -f "$cache/$f" ]; then cp "$cache/$f" "$tmp/$f"\n'
        '  else (cd "$tmp/.dl" && apt-get download -q -o APT::Sandbox::User=root '
        '"$name=$ver" >/dev/null 2>&1) && mv "$tmp/.dl/$f" "$tmp/$f" 2>/dev/null; fi\n'
        '  if [ -f "$tmp/$f" ] && [ "$(dpkg-deb -f "$tmp/$f" Package 2>/dev/null)" = "$name" ]; '
        'then printf \'%s=%s\\n\' "$name" "$ver" >> "$tmp/installed"\n'
        '  else rm -f "$tmp/$f"; missing="$missing $name=$ver"; fi\n'
        'done < "$tmp/.list"\n'
        'if [ -n "$missing" ]; then\n'
        '  echo "gpubox: cannot keep driver $v before replacing it: these packages are neither '
        "in apt's cache ($cache) nor downloadable from the box's repositories (no longer "
        f'offered?):$missing. {remedy}" >&2\n'
        "  exit 1\n"
        "fi\n"
        'rm -rf "$tmp/.dl" "$tmp/.list"\n'
        'cd "$tmp" || exit 1\n'
        "sha256sum -- *.deb > SHA256SUMS || exit 1\n"
        ": > Packages\n"
        'for f in *.deb; do dpkg-deb -f "$f" >> Packages && printf \'Filename: ./%s\\nSize: '
        '%s\\nSHA256: %s\\n\\n\' "$f" "$(stat -c %s "$f")" '
        '"$(sha256sum < "$f" | cut -d\' \' -f1)" >> Packages || exit 1; done\n'
        'if [ -f "$pin" ]; then cp "$pin" apt-preferences; else : > apt-preferences; fi\n'
        'chmod 0644 -- * && : > complete && chmod 0700 "$tmp" || exit 1\n'
        "size=$(du -cb -- *.deb | tail -n 1 | cut -f1)\n"
        'rm -rf "$dest" && mv "$tmp" "$dest" || exit 1\n'
        'echo "driver $v: kept $n packages ($((size / 1048576)) MiB) in $dest"\n'
    )


def kept_command(
    version: str,
    *,
    base: str = layout.DRIVER_KEPT_DIR,
    repo: str = layout.DRIVER_KEPT_REPO,
    src: str = layout.DRIVER_KEPT_SOURCE,
) -> str:
    """The kept builds (``KEPT version sha256-of-SHA256SUMS`` per complete directory), the
    kept repository's SHA256SUMS digest (``REPO``), the kept source file's line (``SOURCE``),
    and ``version``'s Packages stanzas after ``PACKAGES`` when it is kept. (``base``,
    ``repo``, ``src``: the paths, for the tests.)"""
    k = base
    q = shlex.quote
    return (
        f"{KEPT_MARK}\n"
        f"k={q(k)}; r={q(repo)}; s={q(src)}; v={q(version)}\n"
        'for d in "$k"/*/; do d=${d%/}; [ -f "$d/complete" ] && [ -f "$d/SHA256SUMS" ] || '
        'continue; echo "KEPT ${d##*/} $(sha256sum < "$d/SHA256SUMS" | cut -d\' \' -f1)"; done\n'
        '[ -f "$r/SHA256SUMS" ] && echo "REPO $(sha256sum < "$r/SHA256SUMS" | cut -d\' \' -f1)"\n'
        '[ -f "$s" ] && echo "SOURCE $(head -n 1 "$s")"\n'
        'if [ -f "$k/$v/complete" ] && [ -f "$k/$v/Packages" ]; then echo PACKAGES; '
        'cat "$k/$v/Packages"; fi\n'
        "true"
    )


@dataclass
class KeptState:
    """The kept builds on a box: version -> digest of its SHA256SUMS (complete ones only), the
    kept repository's SHA256SUMS digest and source line (None: absent), and the asked version's
    Packages stanzas ("" when it is not kept)."""

    versions: dict[str, str] = field(default_factory=dict)
    repo: str | None = None
    source: str | None = None
    packages: str = ""


def parse_kept(lines: Iterable[str]) -> KeptState:
    state = KeptState()
    body: list[str] | None = None
    for line in lines:
        if body is not None:
            body.append(line)
        elif line.startswith("KEPT "):
            parts = line.split()
            if len(parts) == 3:
                state.versions[parts[1]] = parts[2]
        elif line.startswith("REPO "):
            state.repo = line[5:].strip()
        elif line.startswith("SOURCE "):
            state.source = line[7:].strip()
        elif line.strip() == "PACKAGES":
            body = []
    state.packages = "\n".join(body or [])
    return state


def kept_offers(
    state: KeptState, version: str, package_version: str, roots: Iterable[str]
) -> dict[str, list[str]]:
    """What the kept build of ``version`` offers, as the plan reads a repository's answer
    (gpubox.plans.driver.offered_from_stanzas); {} when it is not kept."""
    if version not in state.versions or not state.packages:
        return {}
    return offered_from_stanzas(state.packages, package_version, roots)


def merge_offers(
    offers: Mapping[str, Sequence[str]], extra: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """The repository's offers with the kept build's added (each version once)."""
    merged = {name: list(versions) for name, versions in offers.items()}
    for name, versions in extra.items():
        have = merged.setdefault(name, [])
        have.extend(v for v in versions if v not in have)
    return merged


def source_line() -> str:
    """The apt source of the kept repository: trusted, a root-owned directory whose files are
    checked against SHA256SUMS before it is made (``repo_command``)."""
    return f"deb [trusted=yes] file:{layout.DRIVER_KEPT_REPO} ./\n"


def repo_command(
    version: str, *, base: str = layout.DRIVER_KEPT_DIR, repo: str = layout.DRIVER_KEPT_REPO
) -> str:
    """Shell: check the kept build of ``version`` against its SHA256SUMS (exit 1 naming each
    file that does not match, nothing changed), then make layout.DRIVER_KEPT_REPO of it (hard
    links, a copy across file systems; renamed into place). (``base``, ``repo``: for the
    tests.)"""
    q = shlex.quote
    return (
        f"{REPO_MARK} {version}\n"
        f"src={q(f'{base}/{version}')}; r={q(repo)}; v={q(version)}\n"
        'cd "$src" || { echo "gpubox: driver $v is not kept in $src" >&2; exit 1; }\n'
        "out=$(sha256sum -c SHA256SUMS 2>&1); rc=$?\n"
        "bad=$(printf \"%s\\n\" \"$out\" | grep -v ': OK$' | grep -v '^sha256sum: WARNING' "
        "| tr '\\n' ' ')\n"
        'if [ $rc -ne 0 ] || [ -n "$bad" ]; then echo "gpubox: the kept driver $v in $src does '
        "not match its SHA256SUMS: $bad(changed or damaged since it was kept); nothing was "
        "installed. Restore the files, or remove $src and install the driver from a repository "
        'that offers it" >&2; exit 1; fi\n'
        'rm -rf "$r.new" && mkdir -p "$r.new" || exit 1\n'
        "for f in $(awk '{ print $2 }' SHA256SUMS) Packages SHA256SUMS; do "
        'ln "$f" "$r.new/$f" 2>/dev/null || cp "$f" "$r.new/$f" || exit 1; done\n'
        'chmod 0755 "$r.new" && rm -rf "$r" && mv "$r.new" "$r" || exit 1\n'
        'echo "driver $v: its kept packages checked (SHA256SUMS) and served to apt from $r"\n'
    )


def reboot_action(
    reason: str | None,
    allow_reboot: bool,
    local: bool,
    users_at_the_display: bool,
    allow_desktop_reboot: bool,
) -> str | None:
    """What the driver stage does about the reboot: None (none needed), "reboot", or the stop:
    "stop-allow-reboot", "stop-local" (pyinfra runs on the box), "stop-desktop" (someone at
    the display and allow_desktop_reboot false)."""
    if not reason:
        return None
    if not allow_reboot:
        return "stop-allow-reboot"
    if local:
        return "stop-local"
    if users_at_the_display and not allow_desktop_reboot:
        return "stop-desktop"
    return "reboot"


def move_lines(
    host: str,
    old: Mapping[str, Sequence[str]],
    to: str,
    package_version: str,
    *,
    kept: Iterable[str],
    reboot: str | None,
    who: str = "",
    secure_boot_key: tuple[str, str] | None = None,
) -> list[str]:
    """The move's lines in the warning before the first change: from and to, the old build
    kept first, the reboot (``reboot``: reboot_action's answer; ``who``: the users at the
    display), and under Secure Boot the key DKMS signs the new modules with (key, certificate).
    """
    kept = set(kept)
    froms = ", ".join(f"{v} ({', '.join(pvs)})" for v, pvs in old.items())
    lines = [f"{host}: the driver moves from {froms} to {to} ({package_version})"]
    for v in old:
        where = kept_dir(v)
        lines.append(
            f"{host}: driver {v} is kept in {where} already: a way back needs no repository"
            if v in kept
            else f"{host}: first, before anything is removed, driver {v}'s installed packages "
            f"are kept in {where} (from apt's cache, or downloaded while the repository offers "
            "them; with their sha256): a way back needs no repository"
        )
    after = f"a reboot follows the install, to load driver {to}"
    lines.append(
        {
            None: f"{host}: driver {to} is loaded already: no reboot",
            "reboot": f"{host}: {after}: the deploy reboots the box once"
            + (f" (it ends the session of {who}: allow_desktop_reboot is true)" if who else ""),
            "stop-allow-reboot": f"{host}: {after}: allow_reboot is false, so the deploy stops "
            "after the install; reboot the box yourself, then deploy again",
            "stop-local": f"{host}: {after}: the deploy runs on the box itself (@local), so it "
            "stops after the install; reboot, then deploy again",
            "stop-desktop": f"{host}: {after}: {who} is logged in to the display and "
            "allow_desktop_reboot is false, so the deploy stops after the install; reboot when "
            'it suits them, or set "allow_desktop_reboot": True; the next deploy continues',
        }.get(reboot, f"{host}: {after}")
    )
    if secure_boot_key:
        key, certificate = secure_boot_key
        lines.append(
            f"{host}: Secure Boot is on: DKMS signs driver {to}'s modules, for every installed "
            f"kernel, with the enrolled key {key} (certificate {certificate}), so they load "
            "after the reboot"
        )
    return lines
