"""The CUDA stage's plan: the toolkit only, never a driver, and its paths."""

from __future__ import annotations

from conftest import REFERENCE, fresh_box

from gpubox.stages import cuda as cuda_stage


def test_toolkit_only_at_the_catalog_version(plan_of):
    plan = plan_of(cuda_stage.cuda, REFERENCE, fresh_box("ubuntu2404"))
    assert [p for p in plan.installs() if p.startswith("cuda")] == ["cuda-toolkit-12-8=12.8.1-1"]
    assert not [
        p for p in plan.installs() if p.split("=")[0] in ("cuda", "cuda-12-8", "cuda-drivers")
    ]


def test_guard_refuses_a_toolkit_that_would_pull_a_driver(plan_of):
    plan = plan_of(cuda_stage.cuda, REFERENCE, fresh_box("ubuntu2404"))
    (guard,) = plan.op("pulls no driver")
    assert "apt-get -s install" in guard and "cuda-drivers" in guard
    installed = plan_of(
        cuda_stage.cuda,
        REFERENCE,
        fresh_box("ubuntu2404", **{"dpkg -l": ["ii  cuda-toolkit-12-8  12.8.1-1  amd64  toolkit"]}),
    )
    assert not [n for n in installed.names if "pulls no driver" in n]
    # the install is a long step (it always runs when planned): planned only when needed
    assert not [n for n in installed.names if "Install cuda-toolkit-12-8" in n]


def test_paths_point_at_12_8(plan_of):
    plan = plan_of(cuda_stage.cuda, REFERENCE, fresh_box("debian12"))
    (link,) = plan.op("/usr/local/cuda ->")
    assert "update-alternatives --set cuda /usr/local/cuda-12.8" in link
    p = cuda_stage.plan(__import__("gpubox.config").config.load_host_config("b", REFERENCE), None)
    assert 'export PATH="/usr/local/cuda-12.8/bin:${PATH}"' in p.profile
    assert p.ld_conf.strip().endswith("/usr/local/cuda-12.8/lib64")
