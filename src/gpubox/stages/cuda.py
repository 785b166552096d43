"""Stage: the CUDA toolkit (toolkit only: never `cuda`, `cuda-X-Y` or `cuda-drivers`, which
carry a driver of their own), on PATH for login shells, in the linker path, and
/usr/local/cuda pointing at it. A file of the toolkit's compiler and runtime packages that has
gone missing (apt still counts the package installed) is put back by reinstalling its package
at the installed version.

With llama.cpp built for CUDA on more than one GPU and split by tensor, NCCL too (libnccl2,
libnccl-dev: the build for the box's CUDA, one exact version installed and held;
gpubox.rules.nccl says how the catalog's pattern becomes that version)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.apt import noninteractive_apt
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import server

from gpubox.base import layout
from gpubox.base.errors import DeployRefused
from gpubox.base.rendering import render
from gpubox.config import HostConfig, Target
from gpubox.infra import operations, progress
from gpubox.infra.operations import ManagedFiles
from gpubox.knowledge import apt_versions
from gpubox.ops.apt_repo import nvidia_repo
from gpubox.ops.packages import install_pinned
from gpubox.preflight import answers
from gpubox.preflight import gate as preflight
from gpubox.rules import nccl
from gpubox.stages import current_config

# The paths under the names the plan tests use.
PROFILE_FILE = layout.CUDA_PROFILE
LD_FILE = layout.CUDA_LD_CONF

# What a toolkit install must never pull in (checked with apt-get -s before installing). The
# same pattern is handed to `grep -E`, so POSIX ERE only: no \d, no lazy or lookaround.
DRIVER_PACKAGE = re.compile(
    r"^(cuda-drivers.*|cuda-runtime-.*|cuda-[0-9]+-[0-9]+|cuda|nvidia-driver.*|nvidia-kernel-.*"
    r"|nvidia-dkms-.*|nvidia-open.*|libnvidia-compute-.*|libcuda1)$"
)


@dataclass(frozen=True)
class CudaPlan:
    package: str
    package_version: str
    prefix: str
    profile: str
    ld_conf: str
    # Packages whose every file is checked at each deploy (nvcc, the runtime, cuBLAS: what the
    # host checks and a CUDA build of llama.cpp or gpu-burn use); those not installed are
    # skipped. Not the whole toolkit: a no-op deploy stays one quick command.
    repair_packages: tuple[str, ...] = ()


def repair_packages(version: str) -> tuple[str, ...]:
    dash = version.replace(".", "-")
    return tuple(
        f"{name}-{dash}"
        for name in (
            "cuda-nvcc",
            "cuda-crt",
            "cuda-nvvm",
            "cuda-cudart",
            "cuda-cudart-dev",
            "libcublas",
            "libcublas-dev",
        )
    )


def plan(config: HostConfig, target: Target) -> CudaPlan:
    cuda = config.cuda
    return CudaPlan(
        package=cuda["package"],
        package_version=cuda["package_version"],
        prefix=cuda["prefix"],
        profile=render("cuda-profile.sh.j2", version=config.cuda_version, prefix=cuda["prefix"]),
        ld_conf=render("cuda-ld.conf.j2", version=config.cuda_version, prefix=cuda["prefix"]),
        repair_packages=repair_packages(config.cuda_version),
    )


def guard_command(package: str) -> str:
    """Refuse (exit 1) when installing ``package`` would install a driver package."""
    regex = DRIVER_PACKAGE.pattern.replace("^(", "^Inst (").replace(")$", ") ")
    return (
        f"out=$(apt-get -s install --no-install-recommends {shlex.quote(package)}) || "
        '{ echo "$out" >&2; exit 1; }; '
        f"bad=$(echo \"$out\" | grep -E {shlex.quote(regex)} | cut -d' ' -f2); "
        'if [ -n "$bad" ]; then echo "gpubox: installing '
        f'{package} would install driver packages: $bad; refusing" >&2; exit 1; fi'
    )


def install_command(package: str, version: str) -> str:
    """The apt-get install of the pinned toolkit, as pyinfra's apt.packages words it (no
    recommends, a downgrade allowed so that the pin wins)."""
    return (
        noninteractive_apt("install --no-install-recommends --allow-downgrades")
        + " "
        + shlex.quote(f"{package}={version}")
    )


@deploy("CUDA toolkit")
def cuda() -> None:
    config = current_config()
    target = preflight.run(config)
    p = plan(config, target)
    nvidia_repo(config, target)

    installed = host.get_fact(DebPackages).get(p.package)
    if not installed or p.package_version not in _versions(installed):
        server.shell(
            name=f"Check that {p.package} pulls no driver",
            commands=[guard_command(f"{p.package}={p.package_version}")],
        )
        # a ~3 GB download then minutes of dpkg: a progress line every 10 s meanwhile
        progress.long_step(
            name=f"Install {p.package} (toolkit only, no driver)",
            command=install_command(p.package, p.package_version),
            probe=progress.apt_probe(),
        )
    # e.g. nvcc deleted: apt still counts its package installed, so only a reinstall helps
    repaired = operations.reinstall(
        name=f"Reinstall CUDA {config.cuda_version} packages missing a file (nvcc, libraries)",
        packages=list(p.repair_packages),
    )
    managed = ManagedFiles({layout.CUDA_PROFILE: p.profile, layout.CUDA_LD_CONF: p.ld_conf})
    managed.put(f"CUDA {config.cuda_version} on PATH for login shells", layout.CUDA_PROFILE)
    ld = managed.put(
        f"CUDA {config.cuda_version} libraries in the linker path", layout.CUDA_LD_CONF
    )
    server.shell(
        name="ldconfig",
        commands=["ldconfig"],
        _if=lambda: ld.did_change() or repaired.did_change(),
    )
    operations.cuda_symlink(name=f"{layout.USR_LOCAL_CUDA} -> {p.prefix}", prefix=p.prefix)
    if nccl.wanted(config):
        install_nccl(config)


def nccl_version(config: HostConfig, installed: dict[str, list[str]]) -> str:
    """The exact NCCL version to install and hold: the one installed when it matches the
    catalog's pin (no repository answer needed), else what the repository offers
    (preflight's answer, which has already refused a run whose repository offers no match)."""
    pin = nccl.pin(config)
    here = apt_versions.resolve(pin, {}, installed, nccl.PACKAGES)
    if here:
        return here
    offered = answers.answer("nvidia_cuda").offers
    version = apt_versions.resolve(pin, offered, installed, nccl.PACKAGES)
    if version is None:
        have = ", ".join(list(offered.get(nccl.PACKAGES[0], []))[-6:]) or "none"
        raise DeployRefused(
            f"{config.host}: repos.nvidia_cuda offers no version matching {pin} for both "
            f"{' and '.join(nccl.PACKAGES)} ({nccl.PACKAGES[0]}: {have}); "
            f"pin one with {nccl.catalog_key(config)}"
        )
    return version


def install_nccl(config: HostConfig) -> None:
    installed = {
        name: sorted(_versions(v))
        for name, v in host.get_fact(DebPackages).items()
        if name in nccl.PACKAGES
    }
    version = nccl_version(config, installed)
    install_pinned(
        f"Install NCCL {version} (llama.cpp's tensor split)",
        list(nccl.PACKAGES),
        version,
        hold="Hold the NCCL packages",
        no_recommends=True,
    )


def _versions(installed: object) -> set[str]:
    if isinstance(installed, set | list | tuple):
        return {str(v) for v in installed}
    version = getattr(installed, "version", None) or getattr(installed, "versions", None)
    if isinstance(version, set | list | tuple):
        return {str(v) for v in version}
    return {str(version)} if version else set()
