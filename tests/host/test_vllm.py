"""The vLLM backend on the box: the container runs the image and checkpoint the config names,
its compile caches are host volumes that the warm-up filled (so a restart is warm), and the
image carries the CUDA forward-compatibility libraries when the driver needs them."""

from __future__ import annotations

import json
import shlex

import pytest

from gpubox import vllm_rules
from gpubox.stages import vllm as vllm_stage

CONTAINER = "gpubox-vllm"


@pytest.fixture
def vllm_box(box):
    if box.config.backend != "vllm":
        pytest.skip("the backend is not vllm in the inventory")
    return box


@pytest.fixture
def container(vllm_box):
    out = vllm_box.run(f"docker inspect {CONTAINER}")
    assert out.rc == 0, f"{vllm_box.name}: no {CONTAINER} container: {out.stderr}"
    (info,) = json.loads(out.stdout)
    return info


@pytest.mark.quick
def test_the_container_runs_the_configured_image_and_checkpoint(vllm_box, container):
    image = vllm_box.config.catalog["vllm"]["image"]
    assert container["Config"]["Image"] == image, (
        f"{vllm_box.name}: {CONTAINER} runs {container['Config']['Image']}, not {image}"
    )
    args = container["Args"]
    want = vllm_stage.vllm_args(vllm_box.config)
    assert args[-len(want) :] == want, f"{vllm_box.name}: vLLM runs with {args}, not {want}"


@pytest.mark.quick
def test_the_compile_caches_are_host_volumes(vllm_box, container):
    mounts = {m["Destination"]: m["Source"] for m in container["Mounts"]}
    for name, path in vllm_stage.CACHES.items():
        assert mounts.get(path) == f"{vllm_stage.CACHE_DIR}/{name}", (
            f"{vllm_box.name}: {path} is not the host's {vllm_stage.CACHE_DIR}/{name}: {mounts}"
        )
    env = dict(e.split("=", 1) for e in container["Config"]["Env"])
    for key, value in vllm_stage.CACHE_ENV.items():
        assert env.get(key) == value, f"{vllm_box.name}: {key}={env.get(key)} in the container"


def test_the_warm_up_left_compiled_kernels_on_the_host(vllm_box, container):
    """After a start and its warm-up, Triton's and vLLM's caches hold files on the host: the
    next restart reuses them instead of compiling for minutes."""
    for name in ("triton", "vllm"):
        d = f"{vllm_stage.CACHE_DIR}/{name}"
        found = vllm_box.out(f"find {shlex.quote(d)} -type f 2>/dev/null | head -n 1").strip()
        assert found, f"{vllm_box.name}: {d} is empty: the compile caches are not kept"


def test_the_image_carries_the_forward_compatibility_libraries(vllm_box):
    config = vllm_box.config
    cuda = vllm_rules.image_info(config.catalog["vllm"]).cuda
    if not vllm_rules.needs_forward_compat(cuda, config.branch):
        pytest.skip(f"the image's CUDA {cuda} runs natively on driver branch {config.branch}")
    command = vllm_stage.compat_check_command(
        config.catalog["vllm"]["image"], str(cuda), str(vllm_rules.driver_cuda(config.branch))
    )
    result = vllm_box.run(command)
    assert result.rc == 0, f"{vllm_box.name}: {result.stderr.strip()}"
