"""llama.cpp built on the box from the catalog's pinned source: llama-server (the API) and
llama-bench (the raw speed of the GPUs on the model), for the GPUs' compute capability, with
CUDA (or for the CPU: llamacpp_cuda false).

The source is one archive whose sha256 the catalog pins: by default PyPI's llama-cpp-python
sdist, which vendors a whole llama.cpp tree (catalog.yml says why). The build downloads it,
refuses it unless its sha256 is the pinned one, extracts only the llama.cpp tree (``tree``;
"" for an archive whose one top directory is the tree, like GitHub's tag archives), checks
that the source runs CUDA graphs on compute capability 7.0, and builds with CMake and Ninja.
The sdist carries no git history, so the build number and commit come from the catalog
(``llama-server --version`` shows them).

The build is all or nothing: its marker (BUILD-INFO.json) is removed before anything in the
install directory changes and written last, after the complete build's bin/ has replaced the
old one in a rename and the size of each of its files is recorded (BUILD-FILES). A build cut
short (a killed deploy) leaves no marker and is built again; a deleted or changed binary or
library is rebuilt even when the marker matches; the service only ever runs a bin/ that was
complete when it was put in place.

The compiler cache (``llamacpp_ccache``, on by default): every compile goes through ccache,
whose directory (``llamacpp_ccache_dir``, by default ``<model_dir>/.ccache``) lives on the
models' volume, so a box rebuilt on a fresh system disk, or a second build with the same inputs,
compiles nothing again. The launcher does not change what is built, so it is not part of
BUILD-INFO: turning the cache on or off never forces a rebuild by itself.

NCCL: with CUDA on and more than one GPU, the build asks for NCCL (``-DGGML_CUDA_NCCL=ON``;
llama.cpp's all-reduces of ``-sm tensor`` go through it) and refuses to finish when CMake did
not find it (llama.cpp would only warn, and serve slower); the CUDA stage installs it
(gpubox.nccl). One GPU, or a CPU build: ``OFF``, so what is linked never depends on what
else happens to be installed. The flag is in BUILD-INFO: adding NCCL rebuilds."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger
from pyinfra.operations import apt, server

from gpubox import nccl, progress
from gpubox.config import HostConfig
from gpubox.facts import CommandOutput, ManifestProblems, manifest_command

BUILD_INFO = "BUILD-INFO.json"
BUILD_FILES = "BUILD-FILES"  # size of each file of bin/, recorded after a complete build
BUILD_LOG = "build.log"  # CMake's and Ninja's output; Ninja's "[n/N]" lines are the progress
LLAMA_BUILD_PACKAGES = ["cmake", "ninja-build", "g++", "make", "libssl-dev", "curl"]
TARGETS = ("llama-server", "llama-bench")
# Where llama.cpp decides, per GPU, whether it may capture CUDA graphs (ggml-cuda.cu):
# `static bool ggml_cuda_graph_set_enabled` disables them below one compute capability. Sources
# from before mid-2026 said GGML_CUDA_CC_AMPERE (8.0), so a V100 (7.0) launched every kernel of
# every token by itself, which is what held it near 65 tokens/s on Qwen3-Next; the pinned
# source says GGML_CUDA_CC_VOLTA (7.0).
CUDA_GRAPH_SOURCE = "ggml/src/ggml-cuda/ggml-cuda.cu"
CUDA_GRAPH_FUNCTION = "ggml_cuda_graph_set_enabled"
CUDA_GRAPH_GATE = "cc < GGML_CUDA_CC_VOLTA"
# The fused GATED_DELTA_NET kernel of Qwen3-Next's linear attention layers.
GDN_SOURCE = "ggml/src/ggml-cuda/gated_delta_net.cu"
# What CMake prints when llama.cpp's FindNCCL.cmake (find_package_handle_standard_args) found
# NCCL; without it, ggml-cuda's CMakeLists only prints "Warning: NCCL not found".
NCCL_FOUND = "Found NCCL"


class _InBuild:
    """A LlamaBuild attribute that is a path inside the build's directory."""

    def __init__(self, relative: str) -> None:
        self.relative = relative

    def __get__(self, build: LlamaBuild, owner: type | None = None) -> str:
        return f"{build.directory}/{self.relative}"


@dataclass(frozen=True)
class LlamaBuild:
    tag: str
    build_number: int
    commit: str  # the full commit; the build records its 7-hex short form
    url: str
    sha256: str
    tree: str  # the llama.cpp tree inside the archive; "" = the archive's top directory
    cuda: bool
    architectures: str  # CMAKE_CUDA_ARCHITECTURES, e.g. "70"
    nvcc: str
    ccache: bool
    prefix: str
    ccache_dir: str = ""
    nccl: bool = False  # with cuda: build against NCCL (more than one GPU)

    binary = _InBuild("bin/llama-server")
    bench = _InBuild("bin/llama-bench")
    log = _InBuild(BUILD_LOG)

    @property
    def directory(self) -> str:
        return f"{self.prefix}/{self.tag}"

    @property
    def short_commit(self) -> str:
        """What llama.cpp's build-info records (`git rev-parse --short`: 7 hex digits)."""
        return self.commit[:7]

    def is_version(self, output: str) -> bool:
        """Whether `llama-server --version` output names this build's number and commit:
        "version: 0.5.0-dev (build 11312, commit 0c1e570)" (older trees: "version: 11312
        (0c1e570)")."""
        line = next((ln for ln in output.splitlines() if ln.startswith("version: ")), "")
        n, c = self.build_number, self.short_commit
        return f"(build {n}, commit {c})" in line or line == f"version: {n} ({c})"

    @property
    def strip(self) -> int:
        """tar --strip-components for the tree: its path's parts, or the one top directory."""
        return len(self.tree.strip("/").split("/")) if self.tree.strip("/") else 1

    def cmake_flags(self) -> list[str]:
        flags = [
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            f"-DLLAMA_BUILD_NUMBER={self.build_number}",
        ]
        if self.commit:
            flags.append(f"-DLLAMA_BUILD_COMMIT={self.short_commit}")
        if self.cuda:
            # real sm_70 code, not PTX compiled at the first start
            flags += [
                "-DGGML_CUDA=ON",
                f"-DCMAKE_CUDA_ARCHITECTURES={self.architectures}",
                f"-DCMAKE_CUDA_COMPILER={self.nvcc}",
                f"-DGGML_CUDA_NCCL={'ON' if self.nccl else 'OFF'}",
            ]
        else:
            flags.append("-DGGML_CUDA=OFF")
        return flags + self.launcher_flags()

    def launcher_flags(self) -> list[str]:
        """ccache as the compilers' launcher: how the build runs, not what it builds."""
        if not self.ccache:
            return []
        flags = ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        if self.cuda:
            flags.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
        return flags

    @property
    def info(self) -> str:
        """What the install records; a different one means rebuild. The URL is left out: the
        same bytes from a mirror are the same build; so are the compiler launcher (ccache) and
        its directory, which change how the build runs, not what it builds."""
        launcher = self.launcher_flags()
        return json.dumps(
            {
                "tag": self.tag,
                "sha256": self.sha256,
                "tree": self.tree,
                "targets": list(TARGETS),
                "flags": [f for f in self.cmake_flags() if f not in launcher],
            },
            sort_keys=True,
        )


def llama_build(config: HostConfig) -> LlamaBuild:
    llama: dict[str, Any] = config.catalog["llamacpp"]
    major, minor = config.gpu.compute_capability
    return LlamaBuild(
        tag=llama["tag"],
        build_number=int(llama["build_number"]),
        commit=llama["commit"],
        url=llama["url"].format(tag=llama["tag"], commit=llama["commit"]),
        sha256=llama["sha256"],
        tree=llama["tree"],
        cuda=config.llamacpp_cuda,
        architectures=f"{major}{minor}",
        nvcc=f"{config.cuda['prefix']}/bin/nvcc",
        ccache=config.llamacpp_ccache,
        prefix=llama["prefix"],
        ccache_dir=config.llamacpp_ccache_dir,
        nccl=nccl.wanted(config),
    )


def source_check_command(src: str) -> str:
    """Fail unless the llama.cpp tree at ``src`` runs CUDA graphs on compute capability 7.0
    (the gate in ggml_cuda_graph_set_enabled is `cc < GGML_CUDA_CC_VOLTA`) and has the fused
    GATED_DELTA_NET kernel; print what it found. It only reads the source, so CPU builds run
    it too (the sandbox proves the pinned source this way)."""
    q = shlex.quote
    gdn = q(f"{src}/{GDN_SOURCE}")
    # the function's body, from its definition to the first "}" of column 0
    body = f"sed -n '/^static bool {CUDA_GRAPH_FUNCTION}(.*{{/,/^}}/p' {q(src)}/{CUDA_GRAPH_SOURCE}"
    refuse = 'refusing to build it" >&2; exit 1; fi'
    return "; ".join(
        [
            f"gate=$({body} | grep -o 'cc < GGML_CUDA_CC_[A-Z0-9_]*' | head -n 1)",
            f'echo "gpubox: {CUDA_GRAPH_FUNCTION} disables CUDA graphs for ${{gate:-(no gate)}}"',
            f'if [ "$gate" != {q(CUDA_GRAPH_GATE)} ]; then echo "gpubox: this llama.cpp source '
            "does not run CUDA graphs on compute capability 7.0 (Volta): its gate is "
            f"'${{gate:-none found}}', not '{CUDA_GRAPH_GATE}'; {refuse}",
            f'if [ ! -f {gdn} ]; then echo "gpubox: this llama.cpp source has no {GDN_SOURCE} '
            f"(the fused GATED_DELTA_NET kernel); {refuse}",
            "echo 'gpubox: CUDA graphs on from compute capability 7.0 (Volta) up; fused "
            "GATED_DELTA_NET kernel present'",
        ]
    )


def extract_command(b: LlamaBuild, archive: str, dest: str) -> str:
    """Extract only the llama.cpp tree of ``archive`` (a shell word) into ``dest``. A .git
    there is a submodule's pointer into the sdist's own history, not source: left out."""
    tree = b.tree.strip("/")
    members = f" {shlex.quote(tree)}" if tree else ""
    return (
        f"tar -xzf {archive} -C {shlex.quote(dest)} --strip-components={b.strip} "
        f"--exclude=.git{members}"
    )


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
    failed = (
        f"|| {{ rc=$?; echo 'gpubox: the build failed; the end of {b.log}:' >&2; "
        f"tail -n 40 {log} >&2; exit $rc; }}; "
    )
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
