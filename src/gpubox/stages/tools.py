"""Stage: gpu-burn (built from a pinned source tarball for the GPUs' compute capability with
the pinned CUDA) and nvtop (from the distribution, checked not to pull another driver's
libraries). The build records the size of what it built; a missing or changed gpu_burn or
compare.fatbin is rebuilt by the next deploy even when the build stamp matches."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, server

from gpubox.base import layout
from gpubox.base.rendering import render
from gpubox.config import HostConfig
from gpubox.infra import operations
from gpubox.infra.host_facts import CommandOutput, ManifestProblems, manifest_command
from gpubox.infra.operations import ManagedFiles
from gpubox.ops.apt_repo import nvidia_repo
from gpubox.preflight import answers, dpkg_ready
from gpubox.preflight import gate as preflight
from gpubox.stages import current_config

STAMP = ".gpubox-build"
MANIFEST = ".gpubox-files"  # sizes of the build's outputs, what `gpu-burn` runs
OUTPUTS = "gpu_burn compare.fatbin"
BUILD_PACKAGES = ["make", "g++", "curl", "ca-certificates"]


@dataclass(frozen=True)
class GpuBurnBuild:
    commit: str
    url: str
    sha256: str
    compute: int
    cuda_prefix: str
    directory: str

    @property
    def stamp(self) -> str:
        """What the build directory records; a different one means rebuild."""
        return f"commit={self.commit} compute={self.compute} cudapath={self.cuda_prefix}"


def gpu_burn_build(config: HostConfig) -> GpuBurnBuild:
    burn = config.catalog["gpu_burn"]
    major, minor = config.gpu.compute_capability
    compute = config.gpu_burn_compute or major * 10 + minor
    return GpuBurnBuild(
        commit=burn["commit"],
        url=burn["url"].format(commit=burn["commit"]),
        sha256=burn["sha256"],
        compute=compute,
        cuda_prefix=config.cuda["prefix"],
        directory=f"{burn['prefix']}/{burn['commit']}",
    )


def build_commands(build: GpuBurnBuild) -> list[str]:
    q = shlex.quote
    d = q(build.directory)
    return [
        "set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
        f"echo 'gpubox: downloading gpu-burn {build.commit[:12]}'; "
        f'curl -fsSL --retry 3 -o "$t/src.tar.gz" {q(build.url)}; '
        'got=$(sha256sum "$t/src.tar.gz" | cut -d" " -f1); '
        f'if [ "$got" != {q(build.sha256)} ]; then echo "gpubox: gpu-burn tarball from '
        f'{build.url} has sha256 $got, the catalog pins {build.sha256}; refusing it" >&2; '
        "exit 1; fi; "
        f"rm -rf {d}.new && mkdir -p {d}.new && "
        f'tar -xzf "$t/src.tar.gz" -C {d}.new --strip-components=1; '
        f"echo 'gpubox: building gpu-burn (COMPUTE={build.compute})'; "
        f"make -C {d}.new COMPUTE={build.compute} CUDAPATH={q(build.cuda_prefix)}; "
        + manifest_command(build.directory + ".new", MANIFEST, OUTPUTS)
        + "; "
        f"echo {q(build.stamp)} > {d}.new/{STAMP}; "
        # the complete build replaces the old one in one rename; a build cut short leaves
        # only {d}.new, which the next build removes
        f"rm -rf {d}; mv {d}.new {d}",
    ]


def nvtop_guard(driver_version: str) -> str:
    """Refuse (exit 1) if installing nvtop would install NVIDIA libraries of another driver."""
    return (
        "out=$(apt-get -s install --no-install-recommends nvtop) || "
        '{ echo "$out" >&2; exit 1; }; '
        'bad=$(echo "$out" | awk \'$1=="Inst" && $2 ~ /^(lib)?nvidia|^libcuda/ '
        f"&& $0 !~ /{driver_version.replace('.', '[.]')}/ {{print $2}}'); "
        'if [ -n "$bad" ]; then echo "gpubox: installing nvtop would install NVIDIA '
        'packages of another driver: $bad; refusing" >&2; exit 1; fi'
    )


@deploy("Tools")
def tools() -> None:
    config = current_config()
    target = preflight.run(config)
    build = gpu_burn_build(config)

    apt.packages(name="Build tools for gpu-burn", packages=BUILD_PACKAGES, no_recommends=True)
    stamp = host.get_fact(
        CommandOutput, command=f"cat {shlex.quote(build.directory)}/{STAMP}"
    ).strip()
    # gpu_burn or compare.fatbin deleted or cut short: rebuild, whatever the stamp says
    damaged = host.get_fact(ManifestProblems, manifest=f"{build.directory}/{MANIFEST}")
    if stamp != build.stamp or damaged:
        server.shell(
            name=f"Build gpu-burn {build.commit[:12]} for compute {build.compute}",
            commands=build_commands(build),
        )
    managed = ManagedFiles(
        {
            layout.GPU_BURN_WRAPPER: render(
                "gpu-burn.sh.j2",
                commit=build.commit,
                compute=build.compute,
                cuda_prefix=build.cuda_prefix,
                directory=build.directory,
            )
        },
        mode="0755",
    )
    managed.put("gpu-burn on PATH (runs from its build directory)", layout.GPU_BURN_WRAPPER)

    if target.family == "debian":
        nvidia_repo(config, target)  # enables contrib, where Debian keeps nvtop
    else:
        changed = operations.apt_enable_component(
            name="Enable Ubuntu's multiverse (nvtop)", component="multiverse"
        )
        dpkg_ready.apt_update(
            name="apt update (multiverse enabled)",
            lock_timeout=config.apt_lock_timeout,
            _if=changed.did_change,
        )
    installed = "install ok installed" in host.get_fact(
        CommandOutput, command="dpkg-query -W -f='${Status}' nvtop"
    )
    if not installed:
        server.shell(
            name="Check that nvtop pulls no other driver's libraries",
            commands=[nvtop_guard(config.driver_version)],
        )
    apt.packages(name="Install nvtop", packages=["nvtop"], no_recommends=True)
    answers.keep_answers()  # this run's answers, kept (only if they changed)
