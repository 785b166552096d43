"""The stand-in NVIDIA driver packages of the sandbox's CUDA repository, for each driver build
served (``served_builds``: the pinned R570, the catalog's R580 the pin must resist, and
``NEWER_580``, an invented patch release of R580): derived from Debian 12's real
packages of the same names (debian_real.py fetches them once), their control fields,
maintainer scripts, conffiles, alternatives and users Debian's, re-versioned; only what touches
hardware (libraries, nvidia-smi, the daemons, firmware, the kernel module source) is a
stand-in. NVIDIA's ``nvidia-driver-cuda``, which Debian lacks, is a recorded guess, and
``cuda-drivers`` is the trap that follows the newest driver. STANDINS.md lists every
difference."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpubox.sandbox import debian_real, standin
from gpubox.sandbox.repo_debs import (
    PACKAGES_DIR,
    STANDIN_LIBDIR,
    Deb,
    RepoError,
    _doc,
    _dummy_library,
    _template,
)

# The driver branches served side by side: the pinned one and the temptation.
DRIVER_BRANCHES = ("570", "580")
# A newer build of the 580 branch, served beside the catalog's 580.105.08 and derived the same
# way. Its version number is INVENTED for the tests (issue 30 F): NVIDIA's real 580 builds are
# in catalog.yml, and this one must never be. It exists so that the sandbox can prove a patch
# release within a branch (a move from 580.105.08 to it, ``driver_version: "580.900.01"`` with
# ``driver_branch: "580"``), and so that the newest driver (what ``cuda-drivers`` follows) is
# not the catalog's. Its Debian revision follows the catalog's NVIDIA debian12 builds ("-1").
NEWER_580 = "580.900.01"


@dataclasses.dataclass(frozen=True)
class DriverBuild:
    """One driver build the stand-in repository serves."""

    branch: str  # 570
    version: str  # 570.211.01, the upstream version
    package_version: str  # 570.211.01-1, the Debian packages' version


def driver_build(branch: str, cat: dict[str, Any], version: str | None = None) -> DriverBuild:
    """The branch's build: the catalog's, or ``version`` (one of ``served_builds``)."""
    info = cat["driver"]["branches"][branch]
    if version is None or version == info["version"]:
        return DriverBuild(branch, info["version"], info["package_version"]["debian"])
    for build in served_builds(cat):
        if build.branch == branch and build.version == version:
            return build
    raise RepoError(f"the stand-in repository serves no driver build {version} of branch {branch}")


def served_builds(cat: dict[str, Any]) -> list[DriverBuild]:
    """Every driver build the stand-in repository serves, oldest first: the catalog's build of
    each of DRIVER_BRANCHES, then NEWER_580."""
    builds = [driver_build(branch, cat) for branch in DRIVER_BRANCHES]
    return [*builds, DriverBuild("580", NEWER_580, f"{NEWER_580}-1")]


def runtime_contract() -> dict[str, str]:
    """Where the stand-in packages keep the box's "kernel" state (standin/STATE.md)."""
    return {
        "loaded_file": str(standin.RUN_DIR / standin.LOADED_DRIVER_FILE),
        "persistence_file": str(standin.RUN_DIR / standin.PERSISTENCE_FILE),
        "persistenced_file": str(standin.RUN_DIR / standin.PERSISTENCED_FILE),
    }


# Control fields of a real package that the stand-in sets itself or drops: the maintainer is
# the stand-in's, the sizes and checksums of the index describe the real file.
_DROPPED_FIELDS = {
    "package",
    "version",
    "maintainer",
    "description",
    "installed-size",
    "filename",
    "size",
    "md5sum",
    "sha1",
    "sha256",
    "sha512",
    "description-md5",
    "tag",
    "x-recorded-from",
}
_SIMPLE_FIELDS = {
    "source": "source",
    "architecture": "architecture",
    "section": "section",
    "priority": "priority",
    "multi-arch": "multi_arch",
    "homepage": "homepage",
}
_RELATION_ATTRS = {
    "pre-depends": "pre_depends",
    "depends": "depends",
    "recommends": "recommends",
    "suggests": "suggests",
    "enhances": "enhances",
    "provides": "provides",
    "conflicts": "conflicts",
    "breaks": "breaks",
    "replaces": "replaces",
}
# CUDA releases after Debian's 535 build (whose libcuda1 provides libcuda-5.0-1 ...
# libcuda-12.2-1): the stand-in libcuda1 adds one per release its branch supports, as
# Debian's packaging does for the releases of its driver (STANDINS.md).
CUDA_RELEASES = ("12.3", "12.4", "12.5", "12.6", "12.8", "12.9", "13.0")
CUDA_BY_BRANCH = {"570": "12.8", "580": "13.0"}
# The stand-in binaries: basename of a real executable -> the stand-in script's source.
STANDIN_EXECUTABLES = ("nvidia-smi", "nvidia-persistenced", "nvidia-modprobe")
DKMS_STANDIN_DIR = "nvidia-dkms"  # packages/nvidia-dkms: the stand-in module source


def _standin_executable(name: str, values: dict[str, Any]) -> str:
    if name == "nvidia-smi":
        return standin.nvidia_smi_source(values["version"])
    return _template(name, **values)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _dkms_conf(text: str) -> tuple[str, list[str]]:
    """PACKAGE_NAME and the BUILT_MODULE_NAMEs of a dkms.conf."""
    name = re.search(r'^PACKAGE_NAME="?([^"\n]+)"?', text, re.M)
    modules = re.findall(r'^BUILT_MODULE_NAME\[\d+\]="?([^"\n]+)"?', text, re.M)
    if not name or not modules:
        raise RepoError("a real dkms.conf without PACKAGE_NAME or BUILT_MODULE_NAME")
    return name[1], modules


def _fields_to_deb(
    deb: Deb, fields: Iterable[tuple[str, str]], rewrite: debian_real.Rewrite
) -> None:
    """The real control fields on a stand-in: relations at the stand-in's version."""
    for key, value in fields:
        low = key.lower()
        if low in _DROPPED_FIELDS:
            continue
        if low in _RELATION_ATTRS:
            rewritten = rewrite.relations(value)
            setattr(deb, _RELATION_ATTRS[low], [r.strip() for r in rewritten.split(",")])
        elif low in _SIMPLE_FIELDS:
            setattr(deb, _SIMPLE_FIELDS[low], value)
        else:
            raise RepoError(
                f"{deb.name}: the real package has a control field {key!r} that the "
                "stand-in does not know how to carry"
            )


def _description(fields: Iterable[tuple[str, str]]) -> tuple[str, str]:
    """(synopsis, long description as continuation lines)."""
    text = debian_real.field_value(list(fields), "Description") or ""
    synopsis, _, rest = text.partition("\n")
    return synopsis.strip(), ("\n" + rest if rest else "")


def _versioned_description(
    fields: Iterable[tuple[str, str]], rewrite: debian_real.Rewrite
) -> tuple[str, str]:
    synopsis, long_description = _description(fields)
    return rewrite.text(synopsis), rewrite.text(long_description)


def _check_rewritten(deb: Deb, rewrite: debian_real.Rewrite) -> None:
    texts = [
        dataclasses.replace(deb, standin_of="").control(),
        *deb.raw_scripts.values(),
        "\n".join(deb.conffiles or []),
    ]
    texts += [c.decode(errors="replace") for c, _ in deb.control_files.values()]
    texts += list(deb.files) + list(deb.links) + list(deb.links.values()) + deb.dirs
    left = sorted({x for t in texts for x in rewrite.leftovers(t)})
    if left:
        raise RepoError(
            f"the stand-in {deb.name} {deb.version} still names the real build's version "
            f"{rewrite.real}: {left} (gpubox/sandbox/debian_real.py Rewrite)"
        )


def derived_package(real: debian_real.RealPackage, build: DriverBuild) -> Deb:
    """A stand-in of NVIDIA's package at the branch's version, derived from Debian's real
    package: its control fields (relations re-versioned), maintainer scripts, conffiles,
    triggers, directories, links and small files are the real ones; what touches hardware
    (libraries, executables, firmware, the kernel module source) is a stand-in. STANDINS.md."""
    branch, ver, pv = build.branch, build.version, build.package_version
    rewrite = debian_real.Rewrite(real.version, pv, branch)
    name = debian_real.RENAMES.get(real.name, real.name)
    synopsis, long_description = _versioned_description(real.fields, rewrite)
    deb = Deb(
        name,
        pv,
        synopsis,
        long_description=long_description,
        standin_of=f"Debian's {real.name} {real.version} ({real.archive})",
    )
    _fields_to_deb(deb, real.fields, rewrite)
    if name == "libcuda1":
        top = _version_tuple(CUDA_BY_BRANCH[branch])
        deb.provides += [
            f"libcuda-{c}-1"
            for c in CUDA_RELEASES
            if _version_tuple(c) <= top and f"libcuda-{c}-1" not in deb.provides
        ]
    values = {"version": ver, "package_version": pv, "branch": branch, **runtime_contract()}

    def path_of(path: str) -> str:
        path = rewrite.text(path)
        if name != real.name:  # /usr/share/doc/<package>/ and the like follow the name
            path = "/".join(name if part == real.name else part for part in path.split("/"))
        return path

    dkms_dirs: list[tuple[str, str]] = []  # (source directory, dkms.conf text)
    for entry in real.entries:
        if entry.path in ("", "."):
            continue
        path = path_of(entry.path)
        if path.startswith(f"usr/share/doc/{name}/") and not path.endswith("/copyright"):
            continue  # Debian's changelogs and READMEs describe the 535 build
        if entry.kind == "dir":
            if not (path.startswith("usr/src/") and path.count("/") > 2):
                deb.dirs.append(path)
            continue
        if entry.kind == "link":
            deb.links[path] = rewrite.text(entry.link)
            continue
        if path.startswith("lib/firmware/"):
            deb.add(
                path,
                f"gpubox sandbox stand-in for NVIDIA's firmware {Path(path).name} ({ver}); "
                "not firmware.\n",
                entry.mode,
            )
            continue
        if path.startswith("usr/src/"):
            if path.endswith("/dkms.conf") and path.count("/") == 3 and entry.content:
                text = rewrite.text(entry.content.decode())
                deb.add(path, text, entry.mode)
                dkms_dirs.append((str(Path(path).parent), text))
            continue  # the module's real source: replaced by the stand-in source below
        if entry.elf is not None:
            base = Path(path).name
            if entry.elf["type"] == "library":
                deb.add(path, _dummy_library(entry.elf["soname"], name), entry.mode)
            elif base in STANDIN_EXECUTABLES:
                deb.add(path, _standin_executable(base, values), entry.mode)
            else:
                raise RepoError(
                    f"Debian's {real.name} ships the executable /{entry.path}, for which the "
                    "sandbox has no stand-in (gpubox/sandbox/repo_driver.py STANDIN_EXECUTABLES)"
                )
            continue
        if entry.content is None:
            raise RepoError(
                f"Debian's {real.name} ships /{entry.path} ({entry.size} bytes), which the "
                "real-package cache did not keep: the stand-in cannot carry it"
            )
        content = entry.content
        with contextlib.suppress(UnicodeDecodeError):  # binary (a .gz man page): as it is
            content = rewrite.text(content.decode()).encode()
        deb.add(path, content, entry.mode)
    deb.dirs = sorted(set(deb.dirs))
    _doc(deb)

    for member, (content, mode) in real.control_files.items():
        if member == "symbols":
            continue  # the stand-in libraries export no symbols
        if member == "conffiles":
            deb.conffiles = [path_of(c.strip()) for c in content.decode().splitlines() if c.strip()]
        elif member in ("preinst", "postinst", "prerm", "postrm", "config"):
            deb.raw_scripts[member] = rewrite.script(content.decode())
        else:  # triggers, templates, shlibs
            deb.control_files[member] = (rewrite.text(content.decode()).encode(), mode)

    for source_dir, conf in dkms_dirs:
        _dkms_standin(deb, source_dir, conf, values)
    _check_rewritten(deb, rewrite)
    return deb


def _dkms_standin(deb: Deb, source_dir: str, conf: str, values: dict[str, Any]) -> None:
    """The stand-in module source beside Debian's real dkms.conf (whose MAKE runs `make
    modules`): a Makefile that writes placeholder modules, so that Debian's real dkms adds,
    builds and installs them; and the stand-in unit that "loads" the module at boot."""
    dkms_name, modules = _dkms_conf(conf)
    flavour = "open" if dkms_name.endswith("-open") else "proprietary"
    kvalues = dict(values, flavour=flavour, package=deb.name, dkms_name=dkms_name)
    kvalues["modules"] = " ".join(modules)
    here = f"{DKMS_STANDIN_DIR}/"
    deb.add(f"{source_dir}/Makefile", _template(here + "Makefile", **kvalues))
    deb.add(
        f"{source_dir}/gpubox-standin-ko", (PACKAGES_DIR / here / "gpubox-standin-ko").read_text()
    )
    deb.add(f"{source_dir}/README.gpubox-sandbox", _template(here + "README", **kvalues))
    unit = f"gpubox-standin-{dkms_name}.service"
    deb.add(
        f"{STANDIN_LIBDIR}/{dkms_name}/load-module",
        _template("nvidia-module-load", **kvalues),
        0o755,
    )
    deb.add(
        f"lib/systemd/system/{unit}", _template("gpubox-standin-nvidia-module.service", **kvalues)
    )
    header = "\n# gpubox sandbox stand-in addition (STANDINS.md): the module-load stand-in unit\n"
    post = _template("maintscripts/systemd-postinst", unit=unit)
    postrm = _template("maintscripts/systemd-postrm", unit=unit)
    deb.raw_scripts["postinst"] = (
        deb.raw_scripts.get("postinst", "#!/bin/sh\nset -e\n") + header + post
    )
    deb.raw_scripts["postrm"] = (
        deb.raw_scripts.get("postrm", "#!/bin/sh\nset -e\n") + header + postrm
    )


def metadata_package(stanza: list[tuple[str, str]], build: DriverBuild) -> Deb:
    """A package of the driver's source that the driver install does not touch: its control
    fields from Debian's index (relations re-versioned), no payload and no scripts."""
    pv, branch = build.package_version, build.branch
    name = debian_real.field_value(stanza, "Package") or ""
    version = debian_real.field_value(stanza, "Version") or ""
    archive = debian_real.field_value(stanza, "X-Recorded-From") or "Debian's index"
    rewrite = debian_real.Rewrite(version, pv, branch)
    synopsis, long_description = _versioned_description(stanza, rewrite)
    deb = Deb(
        debian_real.RENAMES.get(name, name),
        pv,
        synopsis,
        long_description=long_description,
        standin_of=f"Debian's {name} {version} ({archive}; control fields only)",
    )
    _fields_to_deb(deb, stanza, rewrite)
    _doc(deb)
    _check_rewritten(deb, rewrite)
    return deb


def driver_cuda_package(build: DriverBuild) -> Deb:
    """NVIDIA's `nvidia-driver-cuda`, which Debian does not have: its control fields are a
    RECORDED GUESS (STANDINS.md): the compute userspace at exactly the same version."""
    pv = build.package_version
    same = f"(= {pv})"
    deb = Deb(
        "nvidia-driver-cuda",
        pv,
        "NVIDIA driver CUDA integration components",
        depends=[
            f"nvidia-smi {same}",
            f"libcuda1 {same}",
            f"libnvidia-ml1 {same}",
            f"libnvidia-cfg1 {same}",
            f"libnvidia-ptxjitcompiler1 {same}",
            f"nvidia-persistenced {same}",
            f"nvidia-modprobe {same}",
        ],
        recommends=[f"nvidia-kernel-dkms {same} | nvidia-kernel-open-dkms {same}"],
        section="non-free/libs",
        standin_of="NVIDIA's nvidia-driver-cuda (control fields guessed: Debian has none)",
    )
    _doc(deb)
    return deb


def driver_packages(
    branch: str,
    cat: dict[str, Any],
    real: debian_real.RealArchive | None = None,
    version: str | None = None,
) -> list[Deb]:
    """Every Debian driver package of NVIDIA's repository for one build (the branch's in the
    catalog, or ``version``), as stand-ins: derived from Debian's real packages (those the
    driver install touches), metadata-only (the other binaries of the same sources), NVIDIA's
    nvidia-driver-cuda (guessed) and the cuda-drivers trap."""
    real = real or debian_real.ensure()
    build = driver_build(branch, cat, version)
    pv = build.package_version
    debs: dict[str, Deb] = {}
    for package in real.packages.values():
        deb = derived_package(package, build)
        debs[deb.name] = deb
    for stanza in real.metadata:
        deb = metadata_package(stanza, build)
        debs.setdefault(deb.name, deb)
    cuda = driver_cuda_package(build)
    debs[cuda.name] = cuda

    wanted = [n for group in cat["driver"]["packages"]["debian"].values() for n in group]
    unknown = [n for n in wanted if n not in debs]
    if unknown:
        raise RepoError(
            f"catalog.yml driver.packages.debian names {unknown}, which the sandbox's stand-in "
            "repository has no stand-in for: add one in gpubox/sandbox/repo_driver.py "
            "driver_packages"
        )
    # the trap: a meta package that follows the newest driver (each build has its own, as in
    # NVIDIA's repository, so apt's candidate is the newest build's)
    trap = Deb(
        "cuda-drivers",
        pv,
        "CUDA Driver meta-package, branch-agnostic",
        depends=[f"nvidia-driver-cuda (>= {pv})", f"nvidia-kernel-dkms (>= {pv})"],
        section="multiverse/metapackages",
    )
    _doc(trap)
    return [*debs.values(), trap]


def all_driver_packages(
    cat: dict[str, Any], real: debian_real.RealArchive | None = None
) -> list[Deb]:
    """The driver packages of every build the stand-in repository serves (served_builds)."""
    real = real or debian_real.ensure()
    return [
        d
        for build in served_builds(cat)
        for d in driver_packages(build.branch, cat, real, build.version)
    ]
