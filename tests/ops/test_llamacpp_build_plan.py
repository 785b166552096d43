"""llama.cpp's build cache and NCCL, as the stages plan them: ccache on by default with its
directory on the models' volume (a rebuild with the same inputs compiles nothing again), the
launcher kept out of BUILD-INFO; NCCL installed by the CUDA stage and built in when CUDA is on,
the box has more than one GPU and llama.cpp splits by tensor (the one split whose all-reduces
go through NCCL; the flag in BUILD-INFO, so adding it rebuilds), never for the layer or row
split, nor for the CPU build the sandbox runs."""

from __future__ import annotations

import json

import pytest
from conftest import REFERENCE, V100_LSPCI, fresh_box, unit_state

from gpubox.base.errors import DeployRefused
from gpubox.config import load_host_config
from gpubox.plans import llamacpp as plan_llamacpp
from gpubox.rules import nccl, offers
from gpubox.stages import backend as backend_stage
from gpubox.stages import cuda as cuda_stage
from gpubox.stages import llamacpp_build

# The reference box with a model of the user's own by URL: the model stage plans no hf tool.
DATA = {
    **REFERENCE,
    "model_source": "url",
    "model_url": "https://models.example.org/m.gguf",
    "model_file": "m.gguf",
    "model_sha256": "ab" * 32,
}
D = "/opt/llama.cpp/b11312"
# The tensor split: its all-reduces are the only use llama.cpp makes of NCCL.
TENSOR = {**DATA, "llamacpp_split_mode": "tensor"}
# The sandbox's llama.cpp: two (stand-in) GPUs, built for the CPU.
SANDBOX_LIKE = {**DATA, "llamacpp_cuda": False}
# One V100: a model small enough for it (the catalog's needs two).
ONE_GPU = {
    **DATA,
    "gpu_count": 1,
    "nvlink": False,
    "catalog_overrides": {"models.qwen3-next-80b-a3b-thinking.weights_gib": 8},
}


def build_of(data: dict[str, object]) -> plan_llamacpp.LlamaBuild:
    return plan_llamacpp.llama_build(load_host_config("b", data))


def converged(data: dict[str, object], info: str | None = None) -> dict[object, object]:
    """A box whose model is verified and whose llama.cpp build recorded ``info``."""
    from gpubox.plans import model as plan_model

    config = load_host_config("b", data)
    p = plan_model.plan(config)
    return fresh_box(
        "ubuntu2404",
        **{
            "gpubox-verified": [f"marker={p.stamp} size=5 mtime=7", "file=size=5 mtime=7"],
            plan_llamacpp.BUILD_INFO: build_of(data).info if info is None else info,
            **unit_state("gpubox-llama-server"),
            f"test -s {config.api_key_file}": "yes",
        },
    )


def built(plan) -> bool:
    return any("Build llama-server" in name for name in plan.names)


# --------------------------------------------------------------------------- ccache


def test_a_fresh_box_builds_through_ccache_in_a_directory_under_model_dir(plan_of):
    plan = plan_of(backend_stage.backend, DATA, fresh_box("ubuntu2404"))
    assert "ccache" in plan.installs()
    (build,) = plan.op("Build llama-server b11312")
    assert "mkdir -p /srv/models/.ccache ||" in build
    env = f"CCACHE_DIR=/srv/models/.ccache CCACHE_BASEDIR={D} "
    assert f"{env}cmake -S {D}/src -B {D}/build" in build
    assert f"{env}cmake --build {D}/build" in build
    for language in ("C", "CXX", "CUDA"):
        assert f"-DCMAKE_{language}_COMPILER_LAUNCHER=ccache" in build


def test_the_cache_follows_model_dir_or_its_own_key(plan_of):
    moved = build_of({**DATA, "model_dir": "/data/models/"})
    assert moved.ccache_dir == "/data/models/.ccache"
    own = {**DATA, "llamacpp_ccache_dir": "/var/cache/my ccache"}
    (command,) = llamacpp_build.build_commands(build_of(own))
    assert "CCACHE_DIR='/var/cache/my ccache' CCACHE_BASEDIR=" in command
    assert "mkdir -p '/var/cache/my ccache' ||" in command


def test_without_ccache_nothing_of_it_is_planned(plan_of):
    data = {**DATA, "llamacpp_ccache": False}
    plan = plan_of(backend_stage.backend, data, fresh_box("ubuntu2404"))
    assert "ccache" not in plan.installs()
    (build,) = plan.op("Build llama-server b11312")
    assert "CCACHE_DIR" not in build and "LAUNCHER" not in build and ".ccache" not in build


def test_turning_the_cache_on_or_off_rebuilds_nothing(plan_of):
    # a box built without the cache: the marker the build wrote then
    without = build_of({**DATA, "llamacpp_ccache": False}).info
    assert without == build_of(DATA).info
    assert "LAUNCHER" not in without
    plan = plan_of(backend_stage.backend, DATA, converged(DATA, info=without))
    assert not built(plan)
    # ...while any flag that changes the binaries does rebuild
    other = json.loads(without)
    other["flags"] = [f for f in other["flags"] if f != "-DGGML_NATIVE=OFF"]
    plan = plan_of(backend_stage.backend, DATA, converged(DATA, info=json.dumps(other)))
    assert built(plan)


# --------------------------------------------------------------------------- unity builds


def test_the_build_batches_the_slow_targets_through_gpuboxs_cmake_file(plan_of):
    plan = plan_of(backend_stage.backend, DATA, fresh_box("ubuntu2404"))
    (build,) = plan.op("Build llama-server b11312")
    unity = f"{D}/llamacpp-unity.cmake"
    # the file is written beside the source before CMake reads it, then named to CMake
    assert build.index(f"> {unity};") < build.index(f"cmake -S {D}/src")
    assert f"-DCMAKE_PROJECT_INCLUDE={unity}" in build
    text = plan_llamacpp.unity_text()
    for target in ("llama-common", "server-context", "llama-server-impl", "mtmd"):
        assert target in text
    # what stays out (each a compile error or a silent change batched) and ggml, CUDA
    for name in ("json.cpp", "jinja", "mtmd-helper.cpp", "mtmd-helper-gen.cpp"):
        assert name in text
    assert "ggml" not in text.split("include_guard")[1]
    assert "redefinitions" in build  # a failed build says how to build the pin plainly


def test_without_unity_the_build_is_upstreams_and_toggling_it_rebuilds(plan_of):
    off = {**DATA, "llamacpp_unity": False}
    plan = plan_of(backend_stage.backend, off, fresh_box("ubuntu2404"))
    (build,) = plan.op("Build llama-server b11312")
    assert "unity" not in build and "CMAKE_PROJECT_INCLUDE" not in build
    assert build_of(off).info != build_of(DATA).info
    plan = plan_of(backend_stage.backend, DATA, converged(DATA, info=build_of(off).info))
    assert built(plan)
    plan = plan_of(backend_stage.backend, DATA, converged(DATA, info=build_of(DATA).info))
    assert not built(plan)


def test_a_changed_unity_file_rebuilds(monkeypatch: pytest.MonkeyPatch):
    before = build_of(DATA).info
    monkeypatch.setattr(plan_llamacpp, "unity_text", lambda: "# another batching\n")
    assert build_of(DATA).info != before


# --------------------------------------------------------------------------- NCCL


def test_two_gpus_with_cuda_and_the_tensor_split_build_with_nccl_and_check_that_cmake_found_it():
    b = build_of(TENSOR)
    assert b.nccl and "-DGGML_CUDA_NCCL=ON" in b.cmake_flags()
    assert "-DGGML_CUDA_NCCL=ON" in json.loads(b.info)["flags"]
    (command,) = llamacpp_build.build_commands(b)
    configure = command.index(f"cmake -S {D}/src")
    check = command.index(f"if ! grep -q 'Found NCCL' {D}/build.log")
    compile_ = command.index(f"cmake --build {D}/build")
    assert configure < check < compile_


def test_adding_nccl_rebuilds(plan_of):
    # the marker of a build from before NCCL: the same flags without -DGGML_CUDA_NCCL
    before = json.loads(build_of(TENSOR).info)
    before["flags"] = [f for f in before["flags"] if not f.startswith("-DGGML_CUDA_NCCL")]
    plan = plan_of(backend_stage.backend, TENSOR, converged(TENSOR, info=json.dumps(before)))
    (build,) = plan.op("Build llama-server b11312")
    assert "-DGGML_CUDA_NCCL=ON" in build
    # the marker it writes carries the flag, so the next run builds nothing
    assert not built(plan_of(backend_stage.backend, TENSOR, converged(TENSOR)))


def test_one_gpu_builds_without_nccl_and_the_cpu_build_never_names_it():
    one = build_of(ONE_GPU)
    assert not one.nccl and "-DGGML_CUDA_NCCL=OFF" in one.cmake_flags()
    (command,) = llamacpp_build.build_commands(one)
    assert "Found NCCL" not in command
    cpu = build_of(SANDBOX_LIKE)
    assert not cpu.nccl
    (command,) = llamacpp_build.build_commands(cpu)
    assert "NCCL" not in command and "-DGGML_CUDA=OFF" in cpu.cmake_flags()


def test_the_cuda_stage_installs_and_holds_nccl_for_the_box_cuda(plan_of):
    plan = plan_of(cuda_stage.cuda, TENSOR, fresh_box("ubuntu2404"))
    # the newest +cuda12.8 build the repository offers, not its newer +cuda12.9 one
    nccl_installs = [p for p in plan.installs() if p.startswith("libnccl")]
    assert nccl_installs == ["libnccl2=2.26.2-1+cuda12.8", "libnccl-dev=2.26.2-1+cuda12.8"]
    assert plan.op("Hold the NCCL packages") == ["apt-mark hold libnccl2 libnccl-dev"]
    # after the toolkit: the NVIDIA repository is set up by then
    names = plan.names
    toolkit = next(i for i, n in enumerate(names) if "Install cuda-toolkit-12-8" in n)
    assert toolkit < next(i for i, n in enumerate(names) if "Install NCCL" in n)


@pytest.mark.parametrize(
    "data",
    [
        # two GPUs with CUDA, but a split that never all-reduces: layer (the default), row
        pytest.param(DATA, id="layer-split"),
        pytest.param({**DATA, "llamacpp_split_mode": "row"}, id="row-split"),
        pytest.param({**TENSOR, "llamacpp_cuda": False}, id="cpu-build"),
        pytest.param(ONE_GPU, id="one-gpu"),
        pytest.param({**REFERENCE, "backend": "vllm"}, id="vllm"),
        pytest.param({**REFERENCE, "backend": "none"}, id="no-backend"),
    ],
)
def test_no_nccl_where_llama_cpp_does_not_reduce_across_gpus(plan_of, data):
    config = load_host_config("b", data)
    assert not nccl.wanted(config)
    if config.backend == "llamacpp":
        assert "-DGGML_CUDA_NCCL=ON" not in build_of(data).cmake_flags()
    one_v100 = {"lspci -Dnn -d 10de:": V100_LSPCI[:-1]} if data is ONE_GPU else {}
    plan = plan_of(cuda_stage.cuda, data, fresh_box("debian12", **one_v100))
    assert [p for p in plan.installs() if p.startswith("cuda-toolkit")]  # the stage ran
    assert not [p for p in plan.installs() if p.startswith("libnccl")]
    assert not [n for n in plan.names if "NCCL" in n]


def test_nccl_installed_at_a_matching_build_stays_as_it_is(plan_of):
    answers = fresh_box(
        "ubuntu2404",
        **{
            "dpkg -l": [
                "ii  cuda-toolkit-12-8  12.8.1-1  amd64  toolkit",
                "hi  libnccl2  2.25.1-1+cuda12.8  amd64  NCCL",
                "hi  libnccl-dev  2.25.1-1+cuda12.8  amd64  NCCL",
            ],
            "apt-mark showhold": ["libnccl2", "libnccl-dev"],
        },
    )
    plan = plan_of(cuda_stage.cuda, TENSOR, answers)
    assert not [p for p in plan.installs() if p.startswith("libnccl")]
    # ...and one of another CUDA's build is replaced by the box's CUDA's
    answers["dpkg -l"] = [
        line.replace("2.25.1-1+cuda12.8", "2.32.3-1+cuda12.9") for line in answers["dpkg -l"]
    ]
    plan = plan_of(cuda_stage.cuda, TENSOR, answers)
    nccl_installs = [p for p in plan.installs() if p.startswith("libnccl")]
    assert nccl_installs == ["libnccl2=2.26.2-1+cuda12.8", "libnccl-dev=2.26.2-1+cuda12.8"]


def test_an_exact_nccl_version_by_override_pins_exactly(plan_of):
    data = {
        **TENSOR,
        "catalog_overrides": {"cuda.versions.12.8.nccl_version": "2.25.1-1+cuda12.8"},
    }
    plan = plan_of(cuda_stage.cuda, data, fresh_box("ubuntu2404"))
    nccl_installs = [p for p in plan.installs() if p.startswith("libnccl")]
    assert nccl_installs == ["libnccl2=2.25.1-1+cuda12.8", "libnccl-dev=2.25.1-1+cuda12.8"]


def test_preflight_refuses_a_repository_without_an_nccl_for_the_box_cuda(plan_of):
    answers = fresh_box("ubuntu2404")
    answers["gpubox-apt-query nvidia_cuda"] = [
        line for line in answers["gpubox-apt-query nvidia_cuda"] if "+cuda12.8" not in line
    ]
    with pytest.raises(DeployRefused) as err:
        plan_of(cuda_stage.cuda, TENSOR, answers)
    text = str(err.value)
    assert "nothing was changed" in text
    assert (
        "@fake/box: nccl: repos.nvidia_cuda does not offer libnccl2=*+cuda12.8 "
        "(offered: 2.32.3-1+cuda12.9); pin one it offers with catalog_overrides "
        "'cuda.versions.12.8.nccl_version'" in text
    )
    # the same repository is enough for the layer split (the default): it never uses NCCL
    plan = plan_of(cuda_stage.cuda, DATA, answers)
    assert [p for p in plan.installs() if p.startswith("cuda-toolkit")]
    assert not [p for p in plan.installs() if p.startswith("libnccl")]


def test_the_repository_query_asks_for_nccl_only_where_it_is_wanted():
    from gpubox.config import Target

    target = Target(os_id="ubuntu", version_id="24.04", distro="ubuntu2404", family="ubuntu")
    sets = offers.pinned_sets(load_host_config("b", TENSOR), target, {})
    (pinned,) = [s for s in sets if s.stage == "nccl"]
    assert pinned.repo == "nvidia_cuda"
    assert dict(pinned.packages) == {"libnccl2": "*+cuda12.8", "libnccl-dev": "*+cuda12.8"}
    for data in (SANDBOX_LIKE, {**TENSOR, "llamacpp_cuda": False}, DATA):
        sets = offers.pinned_sets(load_host_config("b", data), target, {})
        assert not [s for s in sets if s.stage == "nccl"]
