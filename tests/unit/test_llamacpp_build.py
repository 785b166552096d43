"""llama.cpp's build script, run for real in a temporary prefix: the sdist is verified, only its
llama.cpp tree is extracted, the source must run CUDA graphs on compute capability 7.0, and
the build is all or nothing. A stand-in `cmake` on PATH stands for CMake and Ninja (it prints
Ninja's "[n/N]" lines and writes the two binaries); everything else is the real tools."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpubox.config import load_host_config
from gpubox.plans import llamacpp as plan_llamacpp
from gpubox.plans.llamacpp import BUILD_FILES, BUILD_INFO, source_check_command
from gpubox.stages import llamacpp_build

# The gate as llama.cpp writes it (ggml-cuda.cu), with the compute capability to test.
GATE = """\
static bool ggml_cuda_graph_set_enabled(ggml_backend_cuda_context * cuda_ctx, const void * k) {
    ggml_cuda_graph * graph = cuda_ctx->cuda_graph(k);

    if (graph->graph == nullptr) {
        if (ggml_cuda_info().devices[cuda_ctx->device].cc < GGML_CUDA_CC_%s) {
            graph->disable_due_to_gpu_arch = true;
        }
    }

    return graph->is_enabled();
}

static void later(int cc) {
    if (cc < GGML_CUDA_CC_TURING) {
        return;
    }
}
"""
TREE = "pkg_x-1.0/vendor/llama.cpp"
pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("sh", "tar", "sed", "sha256sum", "curl", "nproc")),
    reason="needs sh, tar, sed, sha256sum, curl and nproc",
)


def write_source(root: Path, arch: str = "VOLTA", gdn: bool = True) -> None:
    cuda = root / "ggml/src/ggml-cuda"
    cuda.mkdir(parents=True, exist_ok=True)
    (cuda / "ggml-cuda.cu").write_text("// before\n" + GATE % arch)
    if gdn:
        (cuda / "gated_delta_net.cu").write_text("// GGML_OP_GATED_DELTA_NET\n")


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", source_check_command(str(root))], capture_output=True, text=True
    )


def test_the_source_check_passes_a_volta_gate(tmp_path):
    write_source(tmp_path, "VOLTA")
    done = check(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "gpubox: ggml_cuda_graph_set_enabled disables CUDA graphs for cc < GGML_CUDA_CC_VOLTA",
        "gpubox: CUDA graphs on from compute capability 7.0 (Volta) up; fused GATED_DELTA_NET "
        "kernel present",
    ]


def test_the_source_check_refuses_an_ampere_gate(tmp_path):
    write_source(tmp_path, "AMPERE")
    done = check(tmp_path)
    assert done.returncode == 1
    assert "disables CUDA graphs for cc < GGML_CUDA_CC_AMPERE" in done.stdout
    assert (
        "does not run CUDA graphs on compute capability 7.0 (Volta): its gate is "
        "'cc < GGML_CUDA_CC_AMPERE', not 'cc < GGML_CUDA_CC_VOLTA'; refusing to build it"
    ) in done.stderr


def test_the_source_check_reads_only_the_function(tmp_path):
    # a Volta gate elsewhere in the file does not count
    write_source(tmp_path, "AMPERE")
    path = tmp_path / "ggml/src/ggml-cuda/ggml-cuda.cu"
    path.write_text(path.read_text() + "static int x(int cc) { return cc < GGML_CUDA_CC_VOLTA; }\n")
    assert check(tmp_path).returncode == 1
    # no such function (another layout): refused, saying what it found
    path.write_text("static void other() {}\n")
    done = check(tmp_path)
    assert done.returncode == 1 and "its gate is 'none found'" in done.stderr


def test_the_source_check_wants_the_fused_gated_delta_net_kernel(tmp_path):
    write_source(tmp_path, "VOLTA", gdn=False)
    done = check(tmp_path)
    assert done.returncode == 1 and "gated_delta_net.cu" in done.stderr


def sdist(path: Path, arch: str = "VOLTA", tree: str = TREE) -> str:
    """A small archive laid out like llama-cpp-python's sdist (or, with ``tree`` one
    directory, like GitHub's tag archive); returns its sha256."""
    files = {
        f"{tree.split('/')[0]}/setup.py": "# not llama.cpp\n",
        f"{tree}/.git": "gitdir: ../../.git/modules/vendor/llama.cpp\n",
        f"{tree}/CMakeLists.txt": "project(llama.cpp)\n",
        f"{tree}/tools/server/server.cpp": "// the server\n",
        f"{tree}/ggml/src/ggml-cuda/ggml-cuda.cu": "// before\n" + GATE % arch,
        f"{tree}/ggml/src/ggml-cuda/gated_delta_net.cu": "// GDN\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


FAKE_CMAKE = """#!/bin/sh
# stand-in for cmake: configure records its arguments, --build prints Ninja's lines
echo "$*" >> "$FAKE_LOG"
echo "CCACHE_DIR=${CCACHE_DIR:-unset}" >> "$FAKE_LOG"
if [ "$1" = "--build" ]; then
  [ -n "$FAKE_FAIL" ] && { echo "FAILED: ggml.c.o"; exit 1; }
  mkdir -p "$2/bin"
  echo "[1/2] Building CXX object tools/server/server.cpp.o"
  echo "[2/2] Linking CXX executable bin/llama-server"
  for t in llama-server llama-bench; do
    printf '#!/bin/sh\\necho built\\n' > "$2/bin/$t"; chmod +x "$2/bin/$t"
  done
  printf 'lib' > "$2/bin/libllama.so"
else
  [ -n "$FAKE_NCCL" ] && echo "-- Found NCCL: /usr/lib/x86_64-linux-gnu/libnccl.so"
  [ -z "$FAKE_NCCL" ] && echo "-- Warning: NCCL not found, performance for multiple CUDA \
GPUs will be suboptimal"
  mkdir -p "$4"
fi
"""


@pytest.fixture
def box(tmp_path):
    """A prefix, a stand-in cmake and a runner for the build script (a `file://` URL for the
    archive: real curl)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "cmake").write_text(FAKE_CMAKE)
    (fake / "cmake").chmod(0o755)
    archive = tmp_path / "pkg_x-1.0.tar.gz"

    def build(
        sha256=None, arch="VOLTA", fail=False, tree=TREE, cuda=False, nccl_found=False, **data
    ):
        digest = sdist(archive, arch, tree or "llama.cpp-b11312")
        overrides = {
            "llamacpp.url": archive.as_uri(),
            "llamacpp.sha256": sha256 or digest,
            "llamacpp.tree": tree,
            "llamacpp.prefix": str(tmp_path / "opt"),
            **data.pop("catalog_overrides", {}),
        }
        config = load_host_config(
            "b",
            {
                "llamacpp_cuda": cuda,
                "catalog_overrides": overrides,
                "model_ctx": 32768,
                # never the default under model_dir (/srv/models) on the machine running tests
                "llamacpp_ccache_dir": str(tmp_path / "models/.ccache"),
                **data,
            },
        )
        b = plan_llamacpp.llama_build(config)
        (command,) = llamacpp_build.build_commands(b)
        env = {
            **os.environ,
            "PATH": f"{fake}:{os.environ['PATH']}",
            "FAKE_LOG": str(tmp_path / "cmake.log"),
            "FAKE_FAIL": "1" if fail else "",
            "FAKE_NCCL": "1" if nccl_found else "",
        }
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
        return b, done

    return build


def test_a_build_installs_both_binaries_and_marks_itself_last(box, tmp_path):
    b, done = box()
    assert done.returncode == 0, done.stderr
    d = Path(b.directory)
    assert (d / "bin/llama-server").exists() and (d / "bin/llama-bench").exists()
    assert (d / BUILD_INFO).read_text().strip() == b.info
    recorded = (d / BUILD_FILES).read_text()
    assert "bin/llama-bench" in recorded and "bin/llama-server" in recorded
    # only the llama.cpp tree, without the submodule pointer
    assert (d / "src/tools/server/server.cpp").exists() and not (d / "src/.git").exists()
    assert not (d / "src/setup.py").exists() and not (d / "src/pkg_x-1.0").exists()
    # the source check's finding heads the kept build log, Ninja's lines follow it
    log = (d / "build.log").read_text().splitlines()
    assert log[0].endswith("disables CUDA graphs for cc < GGML_CUDA_CC_VOLTA")
    assert "[2/2] Linking CXX executable bin/llama-server" in log
    assert "--target llama-server llama-bench" in (tmp_path / "cmake.log").read_text()
    assert "-G Ninja" in (tmp_path / "cmake.log").read_text()


def test_a_wrong_sha256_is_refused_before_anything_is_extracted(box, tmp_path):
    b, done = box(sha256="ab" * 32)
    assert done.returncode == 1
    assert f"the catalog pins {'ab' * 32}; refusing it" in done.stderr
    assert not (Path(b.directory) / "src").exists() and not (tmp_path / "cmake.log").exists()


def test_an_ampere_gate_stops_the_build_before_cmake(box, tmp_path):
    b, done = box(arch="AMPERE")
    assert done.returncode == 1
    assert "its gate is 'cc < GGML_CUDA_CC_AMPERE'" in done.stderr
    assert not (tmp_path / "cmake.log").exists()
    assert not (Path(b.directory) / BUILD_INFO).exists()


def test_a_failed_build_leaves_the_old_bin_and_no_marker(box):
    b, done = box()
    assert done.returncode == 0
    d = Path(b.directory)
    b, failed = box(fail=True)
    assert failed.returncode == 1
    assert "FAILED: ggml.c.o" in failed.stderr  # the log's end, shown with the error
    assert not (d / BUILD_INFO).exists()  # built again by the next deploy
    assert (d / "bin/llama-server").exists()  # the running service's binary is untouched


def test_a_github_style_archive_is_extracted_by_its_top_directory(box):
    # tree "": the archive's single top directory (llama.cpp-b11312/) is the tree
    b, done = box(tree="")
    assert done.returncode == 0, done.stderr
    assert (Path(b.directory) / "src/tools/server/server.cpp").exists()


def test_the_version_check_wants_the_catalogs_build_and_commit():
    b = plan_llamacpp.llama_build(load_host_config("b", {"llamacpp_cuda": False}))
    built = "version: 0.5.0-dev (build 11312, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux"
    assert b.is_version(built)
    assert b.is_version("version: 11312 (0c1e570)\nbuilt with cc")  # older trees' format
    assert not b.is_version("version: 0.5.0-dev (build 1, commit unknown)")  # no build info
    assert not b.is_version("version: 0.5.0-dev (build 11312, commit 0c1e571)")


def test_the_build_goes_through_ccache_in_its_directory_by_default(box, tmp_path):
    b, done = box()
    assert done.returncode == 0, done.stderr
    assert b.ccache and (tmp_path / "models/.ccache").is_dir()  # made before CMake runs
    log = (tmp_path / "cmake.log").read_text()
    # configure and build both run with the cache's directory, through the launcher
    assert log.count(f"CCACHE_DIR={tmp_path / 'models/.ccache'}") == 2
    assert "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache" in log
    # the launcher is how the build runs, not what it builds: not in the marker
    assert "LAUNCHER" not in (Path(b.directory) / BUILD_INFO).read_text()


def test_without_ccache_the_build_runs_the_compilers_directly(box, tmp_path):
    b, done = box(llamacpp_ccache=False)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "cmake.log").read_text()
    assert "CCACHE_DIR=unset" in log and "LAUNCHER" not in log
    assert not (tmp_path / "models/.ccache").exists()


def test_a_ccache_dir_that_cannot_be_made_stops_the_build_naming_the_key(box, tmp_path):
    (tmp_path / "file").write_text("")
    b, done = box(llamacpp_ccache_dir=str(tmp_path / "file/ccache"))
    assert done.returncode == 1
    assert "cannot create llamacpp_ccache_dir" in done.stderr
    assert not (Path(b.directory) / BUILD_INFO).exists()


def test_a_multi_gpu_cuda_build_that_finds_nccl_completes(box, tmp_path):
    b, done = box(cuda=True, gpu_count=2, nccl_found=True, llamacpp_split_mode="tensor")
    assert done.returncode == 0, done.stderr
    assert "-DGGML_CUDA_NCCL=ON" in (tmp_path / "cmake.log").read_text()
    assert (Path(b.directory) / BUILD_INFO).read_text().strip() == b.info


def test_a_multi_gpu_cuda_build_without_nccl_stops_before_compiling(box, tmp_path):
    b, done = box(cuda=True, gpu_count=2, nccl_found=False, llamacpp_split_mode="tensor")
    assert done.returncode == 1
    assert "CMake did not find NCCL (libnccl2 and libnccl-dev)" in done.stderr
    assert "Warning: NCCL not found" in done.stderr  # the end of the log, shown with it
    assert "--build" not in (tmp_path / "cmake.log").read_text()
    assert not (Path(b.directory) / BUILD_INFO).exists()


def test_one_gpu_the_layer_split_and_the_cpu_build_do_not_ask_for_nccl(box, tmp_path):
    # one V100 (a model small enough for it)
    small = {"models.qwen3-next-80b-a3b-thinking.weights_gib": 8}
    b, done = box(cuda=True, gpu_count=1, nccl_found=False, catalog_overrides=small)
    assert done.returncode == 0, done.stderr
    assert "-DGGML_CUDA_NCCL=OFF" in (tmp_path / "cmake.log").read_text()
    (tmp_path / "cmake.log").unlink()
    # two GPUs split by layer (the default): no all-reduce, so no NCCL and no refusal
    b, done = box(cuda=True, gpu_count=2, nccl_found=False)
    assert done.returncode == 0, done.stderr
    assert "-DGGML_CUDA_NCCL=OFF" in (tmp_path / "cmake.log").read_text()
    (tmp_path / "cmake.log").unlink()
    b, done = box(cuda=False, gpu_count=2, nccl_found=False)
    assert done.returncode == 0, done.stderr
    assert "NCCL" not in (tmp_path / "cmake.log").read_text()


TINY_CMAKE = """cmake_minimum_required(VERSION 3.16)
project(tiny C CXX)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(llama-server tools/server/server.cpp)
add_executable(llama-bench tools/bench/bench.c)
"""


@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("cmake", "ninja", "ccache", "cc", "c++")),
    reason="needs cmake, ninja, ccache and a C/C++ compiler",
)
def test_a_second_build_of_the_same_inputs_compiles_nothing(tmp_path):
    """The real build script, real CMake, Ninja, compilers and ccache, on a tiny tree laid out
    as the sdist: the second build re-extracts the source (new files, new times) into a fresh
    build directory, and every compile is a cache hit."""
    tree = "pkg_x-1.0/vendor/llama.cpp"
    files = {
        f"{tree}/CMakeLists.txt": TINY_CMAKE,
        f"{tree}/tools/server/server.cpp": '#include <cstdio>\nint main(){std::puts("s");}\n',
        f"{tree}/tools/bench/bench.c": '#include <stdio.h>\nint main(void){puts("b");}\n',
        f"{tree}/ggml/src/ggml-cuda/ggml-cuda.cu": "// before\n" + GATE % "VOLTA",
        f"{tree}/ggml/src/ggml-cuda/gated_delta_net.cu": "// GDN\n",
    }
    archive = tmp_path / "pkg_x-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    cache = tmp_path / "models/.ccache"
    config = load_host_config(
        "b",
        {
            "llamacpp_cuda": False,
            "llamacpp_ccache_dir": str(cache),
            "catalog_overrides": {
                "llamacpp.url": archive.as_uri(),
                "llamacpp.sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
                "llamacpp.tree": tree,
                "llamacpp.prefix": str(tmp_path / "opt"),
            },
        },
    )
    b = plan_llamacpp.llama_build(config)
    (command,) = llamacpp_build.build_commands(b)
    env = {**os.environ, "CCACHE_DIR": str(cache)}

    def stats() -> dict[str, int]:
        out = subprocess.run(
            ["ccache", "--print-stats"], capture_output=True, text=True, env=env, check=True
        ).stdout
        return {
            k: int(v) for k, v in (line.split("\t") for line in out.splitlines()) if v.isdigit()
        }

    def run() -> None:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr

    run()
    first = stats()
    assert first["cache_miss"] == 2  # the first build compiles both files, into the cache
    subprocess.run(["ccache", "--zero-stats"], env=env, check=True, capture_output=True)
    run()
    second = stats()
    hits = second.get("direct_cache_hit", 0) + second.get("preprocessed_cache_hit", 0)
    assert (hits, second["cache_miss"]) == (2, 0), second
    out = subprocess.run([b.binary], capture_output=True, text=True).stdout
    assert out.strip() == "s" and (Path(b.directory) / BUILD_INFO).read_text().strip() == b.info
