"""The llama.cpp build's plan (gpubox.stages.llamacpp_build builds it).

llama.cpp built on the box from the catalog's pinned source: llama-server (the API) and
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

NCCL: with CUDA on, more than one GPU and the tensor split, the build asks for NCCL
(``-DGGML_CUDA_NCCL=ON``; llama.cpp's all-reduces of ``-sm tensor`` go through it, and nothing
else in llama.cpp uses it) and refuses to finish when CMake did not find it (llama.cpp would
only warn, and reduce slower); the CUDA stage installs it (gpubox.rules.nccl). The layer or row
split, one GPU, or a CPU build: ``OFF``, so what is linked never depends on what else happens
to be installed. The flag is in BUILD-INFO: adding NCCL, or switching the split to or from
tensor, rebuilds.

Unity builds (``llamacpp_unity``, on by default): the common library, the server and mtmd are
compiled several files per compiler run, through a CMake file of gpubox's given with
``-DCMAKE_PROJECT_INCLUDE`` (files/llamacpp-unity.cmake says which targets, which files stay
out and why); the source is unchanged, CUDA's files are never batched. A cold CPU build of the
two targets goes from about 220 steps to about 130, a third less CPU. The flag and the file's
digest are in BUILD-INFO: turning it on or off, or changing the file, rebuilds."""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from typing import Any

from gpubox.base.rendering import FILES
from gpubox.config import HostConfig
from gpubox.rules import nccl

BUILD_INFO = "BUILD-INFO.json"
BUILD_FILES = "BUILD-FILES"  # size of each file of bin/, recorded after a complete build
BUILD_LOG = "build.log"  # CMake's and Ninja's output; Ninja's "[n/N]" lines are the progress
UNITY_FILE = "llamacpp-unity.cmake"  # files/: which targets CMake batches (llamacpp_unity)
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
    nccl: bool = False  # with cuda: build against NCCL (more than one GPU, -sm tensor)
    unity: bool = False  # batch the slow C++ targets (files/llamacpp-unity.cmake)

    binary = _InBuild("bin/llama-server")
    bench = _InBuild("bin/llama-bench")
    log = _InBuild(BUILD_LOG)
    unity_file = _InBuild(UNITY_FILE)

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
        if self.unity:
            flags.append(f"-DCMAKE_PROJECT_INCLUDE={self.unity_file}")
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
                **(
                    {"unity": hashlib.sha256(unity_text().encode()).hexdigest()}
                    if self.unity
                    else {}
                ),
            },
            sort_keys=True,
        )


def unity_text() -> str:
    """The CMake file that turns the unity builds on (uploaded beside the source)."""
    return (FILES / UNITY_FILE).read_text(encoding="utf-8")


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
        unity=config.llamacpp_unity,
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
