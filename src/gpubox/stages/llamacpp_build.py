"""The llama.cpp build's operations on the box: download, verify, extract, build, install.

What is built and why (the pinned source, the all-or-nothing marker, the compiler cache,
NCCL) is the plan's to say: gpubox.plans.llamacpp."""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra import host, logger
from pyinfra.operations import apt, server

from gpubox.config import HostConfig
from gpubox.infra import progress
from gpubox.infra.host_facts import CommandOutput, ManifestProblems, manifest_command
from gpubox.plans.llamacpp import (
    BUILD_FILES,
    BUILD_INFO,
    LLAMA_BUILD_PACKAGES,
    NCCL_FOUND,
    TARGETS,
    LlamaBuild,
    extract_command,
    llama_build,
    source_check_command,
    unity_text,
)
from gpubox.rules import nccl


def build_commands(b: LlamaBuild) -> list[str]:
    """One shell command, all or nothing (`set -e`, one statement per step so that no failure
    hides inside an `&&` chain): the marker goes first, the new bin/ replaces the old one only
    once complete, the file sizes and then the marker are written last."""
    q = shlex.quote
    d = q(b.directory)
    log = q(b.log)
    cache = q(b.ccache_dir)
    # the cache's paths relative to the build directory (CCACHE_BASEDIR): hits across rebuilds
    env = f"CCACHE_DIR={cache} CCACHE_BASEDIR={d} " if b.ccache else ""
    # a pin whose files clash in a unity batch fails to compile: say how to build it plainly
    hint = (
        "echo 'gpubox: this build batches files (unity); if the errors are redefinitions, "
        """set "llamacpp_unity": False for this pin' >&2; """
        if b.unity
        else ""
    )
    failed = (
        f"|| {{ rc=$?; echo 'gpubox: the build failed; the end of {b.log}:' >&2; "
        f"tail -n 40 {log} >&2; {hint}exit $rc; }}; "
    )
    unity = f"printf '%s' {q(unity_text())} > {q(b.unity_file)}; " if b.unity else ""
    make_cache = (
        f"mkdir -p {cache} || {{ echo 'gpubox: cannot create llamacpp_ccache_dir' {cache} >&2; "
        "exit 1; }; "
        if b.ccache
        else ""
    )
    # llama.cpp only warns when it does not find NCCL; a build that asked for it stops here
    nccl_found = (
        f"if ! grep -q '{NCCL_FOUND}' {log}; then echo 'gpubox: CMake did not find NCCL "
        f"({' and '.join(nccl.PACKAGES)}), which this multi-GPU CUDA build needs for -sm "
        "tensor; the CUDA stage installs it (deploy/cuda.py or deploy/full.py)' >&2; "
        f"tail -n 40 {log} >&2; exit 1; fi; "
        if b.cuda and b.nccl
        else ""
    )
    return [
        "set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
        # not built until this build is complete
        f"rm -f {d}/{BUILD_INFO} {d}/{BUILD_FILES}; "
        f"echo 'gpubox: downloading llama.cpp {b.tag} ({b.short_commit or 'commit unknown'})'; "
        f'curl -fsSL --retry 3 -o "$t/src.tar.gz" {q(b.url)}; '
        'got=$(sha256sum "$t/src.tar.gz" | cut -d" " -f1); '
        f'if [ "$got" != {q(b.sha256)} ]; then echo "gpubox: the llama.cpp source at {b.url} '
        f'has sha256 $got, the catalog pins {b.sha256}; refusing it" >&2; exit 1; fi; '
        f"echo 'gpubox: sha256 {b.sha256} verified'; "
        f"rm -rf {d}/src {d}/build {d}/bin.new {d}/bin.old {log}; mkdir -p {d}/src; "
        # only the llama.cpp tree; .git is a submodule's pointer into the sdist, not source
        + extract_command(b, '"$t/src.tar.gz"', f"{b.directory}/src")
        + "; "
        # what the source check found stays at the top of the build's log
        f"( {source_check_command(b.directory + '/src')} ) > {log} 2>&1 " + failed + f"cat {log}; "
        f"echo 'gpubox: building {' and '.join(TARGETS)} {b.tag} (minutes; log: {b.log})'; "
        + make_cache
        + unity
        + f"{env}cmake -S {d}/src -B {d}/build {' '.join(b.cmake_flags())} >> {log} 2>&1 "
        + failed
        + nccl_found
        + f"{env}cmake --build {d}/build -j$(nproc) --target {' '.join(TARGETS)} >> {log} 2>&1 "
        + failed
        + "".join(f"test -x {d}/build/bin/{t}; " for t in TARGETS)
        + f"cp -a {d}/build/bin {d}/bin.new; "
        # two renames: bin/ is always a complete build, never a half-copied one
        f"if [ -e {d}/bin ]; then mv {d}/bin {d}/bin.old; fi; "
        f"mv {d}/bin.new {d}/bin; rm -rf {d}/bin.old; "
        + manifest_command(b.directory, BUILD_FILES, "bin/*")
        + "; "
        f"echo {q(b.info)} > {d}/{BUILD_INFO}.new; mv {d}/{BUILD_INFO}.new {d}/{BUILD_INFO}",
    ]


def build(config: HostConfig) -> Any:
    """Plan llama.cpp's build: its packages, then the build when the marker differs or a file
    of bin/ is missing or changed. Returns the build operation, or None when none is planned."""
    b = llama_build(config)
    packages = LLAMA_BUILD_PACKAGES + (["ccache"] if b.ccache else [])
    apt.packages(name="llama.cpp build dependencies", packages=packages, no_recommends=True)
    info = host.get_fact(CommandOutput, command=f"cat {b.directory}/{BUILD_INFO}").strip()
    manifest = f"{b.directory}/{BUILD_FILES}"
    damaged = host.get_fact(ManifestProblems, manifest=manifest) if info == b.info else []
    if info == b.info and damaged == [manifest]:
        # built by a gpubox that recorded no sizes: record them, do not rebuild
        binary = host.get_fact(CommandOutput, command=f"test -x {b.binary} && echo yes").strip()
        if binary == "yes":
            server.shell(
                name=f"Record the files of llama-server {b.tag}",
                commands=[manifest_command(b.directory, BUILD_FILES, "bin/*")],
            )
            damaged = []
    if info == b.info and not damaged:
        return None
    why = f"{', '.join(damaged)} missing or changed" if damaged else f"CUDA: {b.cuda}"
    logger.info(f"{host.name}: llama.cpp {b.tag} will be built (minutes; {why})")
    (command,) = build_commands(b)
    return progress.long_step(
        name=f"Build llama-server {b.tag} ({'CUDA ' + b.architectures if b.cuda else 'CPU'})",
        command=command,
        probe=progress.ninja_probe(b.log),
        every=10,
    )
