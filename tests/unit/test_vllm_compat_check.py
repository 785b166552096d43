"""vllm.compat proves the CUDA path vLLM runs on, not only that the image could take it: the
container's switch (VLLM_ENABLE_CUDA_COMPATIBILITY and what goes with it,
gpubox.plans.vllm.compat_env), the image's libraries where the path needs them, and the
libcuda.so the running vLLM's processes mapped. Driver 570 (CUDA 12.8) runs the CUDA 12.9 image
on its cuda-compat libraries; driver 580 on the host's own driver.

The outputs are test_check_definitions.py's converged vLLM box, one fact changed at a time."""

from __future__ import annotations

import json

from helpers import REFERENCE
from test_check_definitions import CONFIGS, INVENTORY, converged, recorded

from gpubox import checks
from gpubox.checks.core import Output
from gpubox.config import HostConfig, load_host_config

VLLM_570 = CONFIGS["vllm"]
VLLM_580 = load_host_config(
    "box",
    {**REFERENCE, "backend": "vllm", "nvlink_links": 2, "driver_branch": "580"},
)
COMPAT_LIBCUDA = "/usr/local/cuda-12.9/compat/libcuda.so.575.57.08"
HOST_LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"


def judge(config: HostConfig, **changed: Output | str) -> checks.Verdict:
    outputs = converged(config)
    for name, value in changed.items():
        old = outputs[name]
        outputs[name] = value if isinstance(value, Output) else Output(0, value, "", old.command)
    (verdict,) = checks.run(
        [checks.BY_ID["vllm.compat"]], "box", config, recorded(config, outputs), INVENTORY
    )
    return verdict


def env_without(config: HostConfig, *keys: str) -> str:
    """`docker inspect` of a container started without these variables (before this deploy)."""
    data = json.loads(converged(config)["vllm_inspect"].stdout)
    data[0]["Config"]["Env"] = [
        e for e in data[0]["Config"]["Env"] if e.split("=", 1)[0] not in keys
    ]
    return json.dumps(data)


def test_driver_570_passes_on_the_image_compat_libraries():
    verdict = judge(VLLM_570)
    assert verdict.status == "pass", str(verdict)
    # the engine and its workers on the compat libcuda; the API process, which runs no kernel,
    # on the host's (it started before vLLM put the compat directory in LD_LIBRARY_PATH)
    both = f"{COMPAT_LIBCUDA}\n/usr/lib/x86_64-linux-gnu/libcuda.so.570.211.01\n"
    assert judge(VLLM_570, vllm_libcuda=both).status == "pass"


def test_a_container_without_the_switch_fails_naming_it():
    verdict = judge(VLLM_570, vllm_inspect=env_without(VLLM_570, "VLLM_ENABLE_CUDA_COMPATIBILITY"))
    assert verdict.status == "fail"
    assert "VLLM_ENABLE_CUDA_COMPATIBILITY=(unset) in the container, not 1" in verdict.message
    # forked workers would keep the host's libcuda: spawn is part of the path
    verdict = judge(VLLM_570, vllm_inspect=env_without(VLLM_570, "VLLM_WORKER_MULTIPROC_METHOD"))
    assert "VLLM_WORKER_MULTIPROC_METHOD=(unset) in the container, not spawn" in verdict.message


def test_vllm_on_the_host_driver_where_the_compat_path_was_chosen_fails():
    verdict = judge(VLLM_570, vllm_libcuda="/usr/lib/x86_64-linux-gnu/libcuda.so.570.211.01\n")
    assert verdict.status == "fail"
    assert (
        "vLLM runs on /usr/lib/x86_64-linux-gnu/libcuda.so.570.211.01, not the image's "
        "/usr/local/cuda-12.9/compat/libcuda.so.*: driver branch 570 supports CUDA 12.8, older "
        "than the image's 12.9" in verdict.message
    )


def test_an_image_without_the_compat_libraries_fails():
    no_libs = Output(1, "", "vllm/vllm-openai:v0.19.1 has no /usr/local/cuda-12.9/compat\n")
    verdict = judge(VLLM_570, vllm_compat=no_libs)
    assert verdict.status == "fail"
    assert "has no /usr/local/cuda-12.9/compat" in verdict.message


def test_no_libcuda_loaded_fails():
    verdict = judge(VLLM_570, vllm_libcuda="")
    assert verdict.status == "fail"
    assert "no process of gpubox-vllm has a libcuda.so loaded" in verdict.message


def test_driver_580_runs_the_host_driver_with_the_switch_off():
    outputs = converged(VLLM_580)
    assert "vllm_compat" not in outputs  # no image check: the path does not use its libraries
    verdict = judge(VLLM_580, vllm_libcuda=HOST_LIBCUDA + "\n")
    assert verdict.status == "pass", str(verdict)
    verdict = judge(VLLM_580, vllm_libcuda=COMPAT_LIBCUDA + "\n")
    assert verdict.status == "fail"
    assert (
        f"vLLM runs on {COMPAT_LIBCUDA}, forward-compatibility libraries, though driver "
        "branch 580 runs the image's CUDA 12.9 itself" in verdict.message
    )
    verdict = judge(VLLM_580, vllm_inspect=env_without(VLLM_580, "VLLM_ENABLE_CUDA_COMPATIBILITY"))
    assert "VLLM_ENABLE_CUDA_COMPATIBILITY=(unset) in the container, not 0" in verdict.message
