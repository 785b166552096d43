"""Building the sandbox's stand-in NVIDIA repositories: the packages (repo_driver.py,
repo_tools.py) built with dpkg-deb, indexed and signed as flat repositories with throwaway
keys (the CUDA repository's published as a binary keyring, the container toolkit's
ASCII-armored, as NVIDIA publishes theirs), the gpu-burn tarball beside them
(repo_gpu_burn.py); the driver install checked against apt's real resolver next to Debian's
archive; the result cached by its inputs' digest, and the box.json facts that point at it.
repo.py serves it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpubox import catalog
from gpubox.sandbox import debian_real, repo_index, standin
from gpubox.sandbox.repo_debs import Deb, RepoError
from gpubox.sandbox.repo_driver import DRIVER_BRANCHES, served_builds
from gpubox.sandbox.repo_gpu_burn import GPU_BURN_URL_PATH, gpu_burn_tarball
from gpubox.sandbox.repo_tools import all_packages, all_toolkit_packages

DISTRO = "debian12"
ARCH_DIR = "x86_64"
URL_PATH = "nvidia/{distro}/x86_64/"  # like developer.download.nvidia.com/compute/cuda/repos/
KEYRING_NAME = "cuda-archive-keyring.gpg"
ORIGIN = "NVIDIA"
LABEL = "NVIDIA CUDA"
KEY_UID = "gpubox sandbox stand-in NVIDIA CUDA repository (throwaway) <sandbox@gpubox.invalid>"
# Bump when the way packages are built changes: it is part of the cache key.
REPO_FORMAT_VERSION = 4

# The container toolkit repository, laid out as nvidia.github.io/libnvidia-container serves it.
TOOLKIT_URL_PATH = "libnvidia-container/stable/deb/"  # + "$(ARCH)", which apt expands
TOOLKIT_ARCH = "amd64"
TOOLKIT_KEY_PATH = "libnvidia-container/gpgkey"
TOOLKIT_KEY_UID = (
    "gpubox sandbox stand-in NVIDIA container toolkit repository (throwaway) "
    "<sandbox@gpubox.invalid>"
)

Progress = Callable[[str], None]


def _build_deb(deb: Deb, workdir: Path, outdir: Path) -> None:
    root = workdir / f"{deb.name}_{deb.version}"
    control_dir = root / "DEBIAN"
    control_dir.mkdir(parents=True)
    (control_dir / "control").write_text(deb.control())
    if deb.conffiles is None:
        conffiles = sorted("/" + p for p in deb.files if p.startswith("etc/"))
    else:
        conffiles = list(deb.conffiles)
    if conffiles:
        (control_dir / "conffiles").write_text("".join(c + "\n" for c in conffiles))
    for script, body in deb.scripts.items():
        path = control_dir / script
        path.write_text(
            "#!/bin/sh\n# gpubox sandbox stand-in maintainer script "
            "(never shipped to a real box)\nset -e\n" + body
        )
        path.chmod(0o755)
    for script, text in deb.raw_scripts.items():
        path = control_dir / script
        path.write_text(text)
        path.chmod(0o755)
    for name, (content, mode) in deb.control_files.items():
        path = control_dir / name
        path.write_bytes(content)
        path.chmod(mode)
    for rel in deb.dirs:
        (root / rel).mkdir(parents=True, exist_ok=True)
    for rel, (content, mode) in deb.files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    for rel, target in deb.links.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    subprocess.run(
        [
            "dpkg-deb",
            "--root-owner-group",
            "-Zgzip",
            "--build",
            str(root),
            str(outdir / deb.file_name()),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _input_digest(debs: Iterable[Deb], extra: Iterable[bytes] = ()) -> str:
    h = hashlib.sha256()
    h.update(f"format {REPO_FORMAT_VERSION} origin {ORIGIN} label {LABEL}\n".encode())
    for deb in debs:
        h.update(deb.name.encode() + deb.control().encode())
        for key in sorted(deb.files):
            h.update(key.encode() + b"\0" + deb.files[key][0] + str(deb.files[key][1]).encode())
        for key in sorted(deb.links):
            h.update(f"{key}->{deb.links[key]}".encode())
        for key in sorted(deb.scripts):
            h.update(f"{key}\0{deb.scripts[key]}".encode())
        for key in sorted(deb.raw_scripts):
            h.update(f"raw {key}\0{deb.raw_scripts[key]}".encode())
        for key in sorted(deb.control_files):
            content, mode = deb.control_files[key]
            h.update(f"control {key} {mode}\0".encode() + content)
        h.update(f"dirs {sorted(deb.dirs)} conffiles {deb.conffiles}\n".encode())
    for blob in extra:
        h.update(blob)
    return h.hexdigest()[:16]


def build_packages(debs: Iterable[Deb], repo: Path) -> Path:
    """Build the packages into the directory ``repo`` and index it (Packages, Packages.gz):
    a flat repository, unsigned (``deb [trusted=yes] file:REPO /``); returns ``repo``."""
    repo.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpubox-debs-") as tmp:
        for deb in debs:
            _build_deb(deb, Path(tmp), repo)
    # without --multiversion dpkg-scanpackages keeps only the newest version
    packages = subprocess.run(
        ["dpkg-scanpackages", "--arch", "amd64", "--multiversion", "."],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout
    (repo / "Packages").write_bytes(packages)
    subprocess.run(["gzip", "-9kfn", "Packages"], cwd=repo, check=True)
    return repo


def _flat_repo(
    repo: Path,
    debs: list[Deb],
    key_uid: str,
    armor: bool,
    origin: str | None = None,
    label: str | None = None,
    keep_in: Path | None = None,
) -> tuple[str, bytes]:
    """Build the packages into ``repo`` and index and sign it as a flat repository with a new
    throwaway key; returns (fingerprint, public key: binary, or ASCII-armored with ``armor``).
    With ``keep_in`` (the served root above ``repo``), what withdrawing a driver build needs
    later is kept there (repo_index.keep_for_withdrawal)."""
    repo.mkdir(parents=True)
    build_packages(debs, repo)
    with repo_index.gpg_home() as home:
        gpg = repo_index.gpg
        gpg(
            home,
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--quick-gen-key",
            key_uid,
            "ed25519",
            "sign",
            "never",
        )
        listing = gpg(home, "--with-colons", "--list-keys").stdout.decode()
        fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        repo_index.release_and_sign(repo, repo, home, origin, label)
        key = gpg(home, *(["--armor"] if armor else []), "--export", fpr).stdout
        if keep_in is not None:
            repo_index.keep_for_withdrawal(keep_in, str(repo.relative_to(keep_in)), home, fpr)
    return fpr, key


def build_repo(
    dest: Path,
    debs: list[Deb],
    toolkit_debs: list[Deb] | None = None,
    gpu_burn_tree: Path | None = None,
    driver_builds: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Build and sign everything the server publishes under ``dest`` (which must not exist):
    the NVIDIA CUDA repository, the container toolkit repository, the gpu-burn tarball.
    ``driver_builds`` (upstream -> package version): the builds ``repo_index.withdraw`` may
    take out of the CUDA repository's index."""
    dest.mkdir(parents=True)
    cuda_repo = dest / "nvidia" / DISTRO / ARCH_DIR
    builds = dict(driver_builds or {})
    fpr, keyring = _flat_repo(
        cuda_repo, debs, KEY_UID, armor=False, origin=ORIGIN, label=LABEL, keep_in=dest
    )
    # binary, like NVIDIA's cuda-archive-keyring.gpg
    (cuda_repo / KEYRING_NAME).write_bytes(keyring)
    meta: dict[str, Any] = {
        "key_fingerprint": fpr,
        "packages": len(debs),
        "distro": DISTRO,
        "cuda_repo": str(cuda_repo.relative_to(dest)),
        "origin": ORIGIN,
        "label": LABEL,
        "driver_builds": builds,
    }
    if toolkit_debs:
        tk_fpr, tk_key = _flat_repo(
            dest / TOOLKIT_URL_PATH / TOOLKIT_ARCH, toolkit_debs, TOOLKIT_KEY_UID, armor=True
        )
        (dest / TOOLKIT_KEY_PATH).write_bytes(tk_key)  # ASCII-armored, like NVIDIA's gpgkey
        meta.update(toolkit_key_fingerprint=tk_fpr, toolkit_packages=len(toolkit_debs))
    if gpu_burn_tree is not None:
        commit, tarball = gpu_burn_tarball(gpu_burn_tree)
        archive = dest / GPU_BURN_URL_PATH / f"{commit}.tar.gz"
        archive.parent.mkdir(parents=True)
        archive.write_bytes(tarball)
        meta.update(gpu_burn_commit=commit, gpu_burn_sha256=hashlib.sha256(tarball).hexdigest())
    (dest / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def driver_pin(debs: Iterable[Deb], package_version: str) -> str:
    """An apt pin like the deploy's: every package the repository builds at
    ``package_version``, at exactly that version (1001) and no other version (-1)."""
    names = " ".join(sorted({d.name for d in debs if d.version == package_version}))
    return (
        f"Package: {names}\nPin: version {package_version}\nPin-Priority: 1001\n\n"
        f"Package: {names}\nPin: version *\nPin-Priority: -1\n"
    )


def check_driver_install(
    real: debian_real.RealArchive,
    repo: Path,
    debs: Iterable[Deb],
    cat: dict[str, Any] | None = None,
    branch: str = DRIVER_BRANCHES[0],
) -> list[str]:
    """Problems with installing the branch's driver from the built repository ``repo`` next
    to Debian's own archive, as NVIDIA documents it (``apt-get install nvidia-driver-cuda
    nvidia-kernel-dkms``, or -open-dkms; exact versions, no Recommends) under a pin like the
    deploy's (``driver_pin``), asked of apt's real resolver in a private apt root: it must
    resolve, install from the stand-in repository only packages derived from Debian's real
    ones (never a metadata-only one) and no other driver build."""
    cat = cat or catalog.load()
    debs = list(debs)
    pv = cat["driver"]["branches"][branch]["package_version"]["debian"]
    by_name = {d.name: d for d in debs if d.version == pv}
    problems = []
    for dkms in ("nvidia-kernel-dkms", "nvidia-kernel-open-dkms"):
        command = ["install", "--no-install-recommends", f"nvidia-driver-cuda={pv}", f"{dkms}={pv}"]
        what = "apt-get -s " + " ".join(command)
        result = debian_real.simulate(real, [repo], command, preferences=driver_pin(debs, pv))
        if result.returncode != 0:
            problems.append(f"{what} does not resolve:\n" + (result.stdout + result.stderr)[-3000:])
            continue
        installs = debian_real.simulated_installs(result.stdout)
        for name, version in sorted(installs.items()):
            deb = by_name.get(name)
            if version == pv and (deb is None or "control fields only" in deb.standin_of):
                problems.append(
                    f"{what} installs {name} {version}, a stand-in without Debian's real "
                    "packaging behind it"
                )
            driver_build = re.match(r"^\d{3}\.\d+\.\d+$", debian_real.upstream(version))
            if version != pv and driver_build:
                problems.append(f"{what} installs {name} {version}, another driver build")
        if dkms not in installs:
            problems.append(f"{what} does not install {dkms}")
    return problems


def ensure_repo(
    base: Path,
    rebuild: bool = False,
    progress: Progress = lambda message: None,
    real_base: Path | None = None,
) -> Path:
    """Everything the server publishes, for the current inputs (cached under ``base``); its
    root directory. The driver packages derive from Debian's real ones, cached in
    ``real_base`` (default: ``debian-real`` beside ``base``) and fetched once when missing."""
    real = debian_real.ensure(real_base or base.parent / "debian-real", progress)
    cat = catalog.load()
    debs = all_packages(cat, real)
    builds = {b.version: b.package_version for b in served_builds(cat)}
    toolkit_debs = all_toolkit_packages()
    tree = standin.GPU_BURN_TREE
    _, tarball = gpu_burn_tarball(tree)
    digest = _input_digest([*debs, *toolkit_debs], [tarball, json.dumps(builds).encode()])
    dest = base / digest
    if (dest / "meta.json").exists() and not rebuild:
        return dest
    base.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    progress(
        f"building the stand-in NVIDIA repositories ({len(debs)} + {len(toolkit_debs)} "
        "packages) and the gpu-burn tarball"
    )
    tmp = base / f".building-{digest}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build_repo(tmp, debs, toolkit_debs, tree, builds)
        problems = check_driver_install(real, tmp / "nvidia" / DISTRO / ARCH_DIR, debs)
        if problems:
            raise RepoError(
                "the stand-in driver packages do not install as NVIDIA documents it:\n"
                + "\n".join(problems)
            )
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in base.iterdir():  # repositories of older inputs (small: delete now)
        if old != dest and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    progress(f"stand-in repositories built in {time.monotonic() - started:.1f} s")
    return dest


def repo_facts(root: Path, port: int) -> dict[str, Any]:
    """The box.json facts of a built repository served on 127.0.0.1:``port``."""
    meta = json.loads((root / "meta.json").read_text())
    server = f"http://127.0.0.1:{port}/"
    base = server + URL_PATH
    facts: dict[str, Any] = {
        "repo_root": str(root),
        "repo_url": base,
        "repo_distro": meta["distro"],
        "repo_suite": "/",
        "repo_origin": ORIGIN,
        "repo_label": LABEL,
        "key_url": base + KEYRING_NAME,
        "key_fingerprint": meta["key_fingerprint"],
    }
    if "toolkit_key_fingerprint" in meta:
        facts.update(
            # "$(ARCH)" is kept for apt to expand, as in NVIDIA's own list file
            toolkit_repo_url=server + TOOLKIT_URL_PATH + "$(ARCH)",
            toolkit_repo_suite="/",
            toolkit_key_url=server + TOOLKIT_KEY_PATH,
            toolkit_key_fingerprint=meta["toolkit_key_fingerprint"],
        )
    if "gpu_burn_commit" in meta:
        facts.update(
            # "{commit}" is kept, as in catalog.yml gpu_burn.url
            gpu_burn_url=server + GPU_BURN_URL_PATH + "{commit}.tar.gz",
            gpu_burn_commit=meta["gpu_burn_commit"],
            gpu_burn_sha256=meta["gpu_burn_sha256"],
        )
    return facts
