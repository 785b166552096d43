"""The model stage's plan: the download tool installed from catalog ``pypi.index_url`` (a PyPI
mirror is an override of it), the download as a long step with progress lines whose total is
the size the Hub announces, and that size in the disk check."""

from __future__ import annotations

from conftest import REFERENCE, fresh_box

from gpubox import progress
from gpubox.config import load_host_config
from gpubox.stages import model as model_stage

ANNOUNCED = "curl -sI --max-time 20 https://huggingface.co/unsloth/"


def test_the_download_tool_comes_from_the_catalogs_index(plan_of):
    plan = plan_of(model_stage.model, REFERENCE, fresh_box("ubuntu2404"))
    (_, pip) = plan.op("Download tool in /opt/gpubox/hf-venv")
    assert "--index-url https://pypi.org/simple " in pip
    assert pip.endswith("'huggingface_hub[hf_xet]>=1.0,<2'")


def test_a_pypi_mirror_is_a_catalog_override(plan_of):
    data = {
        **REFERENCE,
        "model_source": "modelscope",
        "catalog_overrides": {"pypi.index_url": "https://mirror.example.org/pypi/simple"},
    }
    plan = plan_of(model_stage.model, data, fresh_box("debian12"))
    (_, pip) = plan.op("Download tool in /opt/gpubox/modelscope-venv")
    assert "--index-url https://mirror.example.org/pypi/simple " in pip


def test_the_download_is_a_long_step_with_the_announced_size_as_total(plan_of):
    data = {**REFERENCE, "hf_endpoint": "https://hf-mirror.example.org", "model_repo": "me/x"}
    answers = fresh_box(
        "ubuntu2404", **{"curl -sI --max-time 20 https://hf-mirror.example.org/me/x/": "12345678"}
    )
    plan = plan_of(model_stage.model, data, answers)
    (step,) = plan.op("Download and verify Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf")
    config = load_host_config("b", data)
    p = model_stage.plan(config)
    assert step.startswith("# gpubox long step")
    assert progress.download_probe(p.path, 12345678) in step
    commands = model_stage.download_commands(
        p, "https://hf-mirror.example.org", config.catalog["modelscope"]["endpoint"]
    )
    assert model_stage.step_command(commands) in step
    assert "hf download me/x Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf --local-dir " in step


def test_without_an_announced_size_the_progress_has_no_total(plan_of):
    plan = plan_of(model_stage.model, REFERENCE, fresh_box("ubuntu2404"))
    (step,) = plan.op("Download and verify")
    p = model_stage.plan(load_host_config("b", REFERENCE))
    assert progress.download_probe(p.path, None) in step


def test_the_disk_check_counts_the_announced_size(plan_of):
    import pytest

    from gpubox.stages import DeployRefused

    answers = fresh_box(
        "ubuntu2404",
        **{"df -B1 --output=avail": str(60 * 2**30), ANNOUNCED: str(70 * 2**30)},
    )
    with pytest.raises(DeployRefused, match=r"has 60\.0 GiB free; .* needs 70\.0 GiB"):
        plan_of(model_stage.model, REFERENCE, answers)
