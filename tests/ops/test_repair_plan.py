"""A re-deploy repairs what the host checks catch (issue 8 item H), and llama.cpp's build rule
(item E), as plans: a missing package file plans a reinstall of its package at the installed
version; a missing or changed build output plans the build even when its marker matches; a
model file that changed since it was verified plans the download command (verify again, then
download if needed). A converged box plans none of these."""

from __future__ import annotations

from conftest import REFERENCE, fresh_box, unit_state

from gpubox.config import load_host_config
from gpubox.infra import operations
from gpubox.plans import llamacpp as plan_llamacpp
from gpubox.plans import model as plan_model
from gpubox.stages import backend as backend_stage
from gpubox.stages import cuda as cuda_stage
from gpubox.stages import llamacpp_build
from gpubox.stages import model as model_stage
from gpubox.stages import tools as tools_stage

MISSING_FACT = "own() {"  # a fragment of MissingPackageFiles' command
CUDA_INSTALLED = {"dpkg -l": ["ii  cuda-toolkit-12-8  12.8.1-1  amd64  toolkit"]}
REINSTALL = (
    "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --reinstall --no-install-recommends "
    "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "
    "-o Dpkg::Options::=--force-confmiss "
)


# --------------------------------------------------------------------------- CUDA


def test_cuda_checks_the_compiler_and_runtime_packages_not_the_whole_toolkit():
    p = cuda_stage.plan(load_host_config("b", REFERENCE), None)
    assert {"cuda-nvcc-12-8", "cuda-cudart-12-8", "libcublas-12-8"} <= set(p.repair_packages)
    assert "cuda-toolkit-12-8" not in p.repair_packages  # a meta package: its files are few
    assert not [n for n in p.repair_packages if "nsight" in n]


def test_a_deleted_nvcc_plans_a_reinstall_of_its_package_then_ldconfig(plan_of):
    nvcc = "/usr/local/cuda-12.8/bin/nvcc"
    answers = fresh_box(
        "ubuntu2404",
        **CUDA_INSTALLED,
        **{MISSING_FACT: [f"cuda-nvcc-12-8\t12.8.93-1\t{nvcc}"]},
    )
    plan = plan_of(cuda_stage.cuda, REFERENCE, answers)
    assert plan.op("Reinstall CUDA 12.8 packages missing a file") == [
        REINSTALL + "cuda-nvcc-12-8=12.8.93-1"
    ]
    # apt counts the toolkit installed: no install is planned, only the reinstall helps
    assert not [n for n in plan.names if "Install cuda-toolkit-12-8" in n]
    assert any(n.split(" | ")[-1] == "ldconfig" for n in plan.conditional)


def test_a_converged_toolkit_plans_no_reinstall(plan_of):
    plan = plan_of(cuda_stage.cuda, REFERENCE, fresh_box("ubuntu2404", **CUDA_INSTALLED))
    assert plan.op("Reinstall CUDA 12.8 packages missing a file") == []


def test_reinstall_pins_each_owner_once_at_its_installed_version(plan_of):
    """The reusable piece the driver stage wires for nvidia-smi: paths, owners from dpkg."""

    def stage():
        operations.reinstall(
            name="Reinstall the driver's packages missing a file",
            paths=["/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"],
        )

    answers = {
        MISSING_FACT: [
            "nvidia-utils-570\t570.211.01-0ubuntu1\t/usr/bin/nvidia-smi",
            "libnvidia-compute-570:amd64\t570.211.01-0ubuntu1\t/usr/lib/x86_64-linux-gnu/a",
            "libnvidia-compute-570:amd64\t570.211.01-0ubuntu1\t/usr/lib/x86_64-linux-gnu/b",
        ]
    }
    plan = plan_of(stage, REFERENCE, answers)
    assert plan.op("Reinstall the driver's packages") == [
        REINSTALL
        + "nvidia-utils-570=570.211.01-0ubuntu1 libnvidia-compute-570:amd64=570.211.01-0ubuntu1"
    ]
    assert plan_of(stage, REFERENCE, {}).op("Reinstall the driver's packages") == []


# --------------------------------------------------------------------------- gpu-burn


def gpu_burn_answers(manifest_problems: list[str]) -> dict[object, object]:
    build = tools_stage.gpu_burn_build(load_host_config("b", REFERENCE))
    return fresh_box(
        "ubuntu2404",
        **{
            tools_stage.STAMP: build.stamp,
            tools_stage.MANIFEST: manifest_problems,
        },
    )


def test_gpu_burn_is_not_rebuilt_when_its_outputs_are_there(plan_of):
    plan = plan_of(tools_stage.tools, REFERENCE, gpu_burn_answers([]))
    assert not [n for n in plan.names if "Build gpu-burn" in n]


def test_a_deleted_gpu_burn_is_rebuilt_though_its_stamp_matches(plan_of):
    plan = plan_of(tools_stage.tools, REFERENCE, gpu_burn_answers(["gpu_burn"]))
    build = tools_stage.gpu_burn_build(load_host_config("b", REFERENCE))
    assert plan.op("Build gpu-burn") == tools_stage.build_commands(build)


# --------------------------------------------------------------------------- llama.cpp

LLAMA_DATA = {
    **REFERENCE,
    "model_source": "url",
    "model_url": "https://models.example.org/m.gguf",
    "model_file": "m.gguf",
    "model_sha256": "ab" * 32,
}


def llama_answers(info: str | None = None, **extra: object) -> dict[object, object]:
    config = load_host_config("b", LLAMA_DATA)
    b = plan_llamacpp.llama_build(config)
    p = plan_model.plan(config)
    return fresh_box(
        "ubuntu2404",
        **{
            # the model verified as it is now: no download planned
            "gpubox-verified": [f"marker={p.stamp} size=5 mtime=7", "file=size=5 mtime=7"],
            plan_llamacpp.BUILD_INFO: b.info if info is None else info,
            **unit_state("gpubox-llama-server"),
            f"test -s {config.api_key_file}": "yes",
            **extra,
        },
    )


def llama() -> plan_llamacpp.LlamaBuild:
    return plan_llamacpp.llama_build(load_host_config("b", LLAMA_DATA))


def test_an_intact_build_is_not_rebuilt_and_nothing_restarts(plan_of):
    plan = plan_of(backend_stage.backend, LLAMA_DATA, llama_answers())
    assert not [n for n in plan.names if "Build llama-server" in n or "Record the files" in n]
    assert not [n for n in plan.names if "Download and verify" in n]
    restart = [n for n in plan.names if "(Re)start llama-server" in n]
    assert restart and set(restart) <= plan.conditional


def test_a_deleted_llama_server_is_rebuilt_though_the_marker_matches_then_restarted(plan_of):
    answers = llama_answers(**{plan_llamacpp.BUILD_FILES: ["bin/llama-server"]})
    plan = plan_of(backend_stage.backend, LLAMA_DATA, answers)
    (build,) = plan.op("Build llama-server b11312")
    # the build runs as a long step (progress lines); the script inside it is the build's
    (command,) = llamacpp_build.build_commands(llama())
    assert command in build
    assert [n for n in plan.names if "(Re)start llama-server" in n]


def test_a_changed_build_info_rebuilds(plan_of):
    plan = plan_of(backend_stage.backend, LLAMA_DATA, llama_answers(info='{"tag": "b1"}'))
    assert plan.op("Build llama-server b11312")


def test_a_build_from_before_the_manifest_is_recorded_not_rebuilt(plan_of):
    b = llama()
    manifest = f"{b.directory}/{plan_llamacpp.BUILD_FILES}"
    answers = llama_answers(**{plan_llamacpp.BUILD_FILES: [manifest], f"test -x {b.binary}": "yes"})
    plan = plan_of(backend_stage.backend, LLAMA_DATA, answers)
    assert not [n for n in plan.names if "Build llama-server" in n]
    (record,) = plan.op("Record the files of llama-server b11312")
    assert "stat -c '%s %n' -- bin/*" in record and "BUILD-FILES" in record
    # ... unless its binary is gone too
    gone = llama_answers(**{plan_llamacpp.BUILD_FILES: [manifest]})
    assert plan_of(backend_stage.backend, LLAMA_DATA, gone).op("Build llama-server b11312")


def test_the_build_command_keeps_the_rule():
    """Marker removed before the install directory changes, written last; the new bin/ put
    in place by renames once complete; no step hidden in an `&&` chain."""
    (command,) = llamacpp_build.build_commands(llama())
    d = llama().directory
    assert command.startswith("set -e; ")
    removed = command.index(f"rm -f {d}/BUILD-INFO.json {d}/BUILD-FILES")
    first_change = command.index(f"rm -rf {d}/src")
    built = command.index("cmake --build")
    swapped = command.index(f"mv {d}/bin.new {d}/bin;")
    recorded = command.index("BUILD-FILES.new")
    marked = command.index(f"mv {d}/BUILD-INFO.json.new {d}/BUILD-INFO.json")
    assert removed < first_change < built < swapped < recorded < marked
    assert command.endswith(f"mv {d}/BUILD-INFO.json.new {d}/BUILD-INFO.json")
    assert " && mkdir" not in command and "cp -a" in command and "bin.new && " not in command


# --------------------------------------------------------------------------- model


def test_a_model_that_changed_since_it_was_verified_is_verified_again(plan_of):
    answers = llama_answers(
        **{
            "gpubox-verified": [
                "marker=sha256=" + "ab" * 32 + " size=5 mtime=7",
                "file=size=2 mtime=9",
            ]
        }
    )
    plan = plan_of(model_stage.model, LLAMA_DATA, answers)
    config = load_host_config("b", LLAMA_DATA)
    p = plan_model.plan(config)
    ((download,),) = [c for n, c in plan.ops if "Download and verify m.gguf" in n]
    assert "gpubox long step" in download  # with progress lines (gpubox.infra.progress)
    # the download runs in its unit (started again: the file no longer matches its marker)
    assert model_stage.wait_command(p) in download
    assert [n for n in plan.names if "Start gpubox-model-download" in n]


def test_a_verified_model_plans_nothing_and_an_hf_one_leaves_no_token(plan_of):
    plan = plan_of(model_stage.model, LLAMA_DATA, llama_answers())
    assert not [n for n in plan.names if "Download" in n or "HF_TOKEN" in n]
    config = load_host_config("b", REFERENCE)
    p = plan_model.plan(config)
    answers = fresh_box(
        "ubuntu2404",
        **{"gpubox-verified": [f"marker={p.stamp} size=5 mtime=7", "file=size=5 mtime=7"]},
    )
    hf = plan_of(model_stage.model, REFERENCE, answers)
    assert not [n for n in hf.names if "Download" in n]
    assert [n for n in hf.names if "No HF_TOKEN file left on the box" in n]


def test_the_free_space_check_counts_the_file_already_there(plan_of):
    """A file to verify again needs no new space for the bytes it already has."""
    config = load_host_config("b", REFERENCE)
    p = plan_model.plan(config)
    weights = config.catalog["models"][config.model]["weights_gib"] * 2**30
    answers = fresh_box(
        "ubuntu2404",
        **{
            "gpubox-verified": [
                f"marker={p.stamp} size={weights} mtime=7",
                f"file=size={weights} mtime=8",
            ],
            "df -B1 --output=avail": str(2**30),
        },
    )
    plan = plan_of(model_stage.model, REFERENCE, answers)
    assert [n for n in plan.names if "Download and verify" in n]
