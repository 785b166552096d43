"""Config validation: each rule, with its message."""

from __future__ import annotations

import pytest
from helpers import REFERENCE

from gpubox import catalog
from gpubox.base import compat
from gpubox.config import KEYS, ConfigError, load_host_config, validate


def messages(data):
    _, problems = validate("box", data)
    return {p.key: p.message for p in problems if p.severity == "error"}


def test_the_reference_box_has_no_problem_at_all():
    # the llama.cpp source is pinned: no warning about an unverified download any more
    assert validate("box", REFERENCE)[1] == []


def test_reference_box_is_valid_and_defaults_resolve():
    config = load_host_config("box", REFERENCE)
    assert config.driver_version == "570.211.01"
    assert config.driver_kernel_modules == "proprietary"
    assert config.allow_reboot is True and config.persistence_mode is True
    assert config.cuda["package"] == "cuda-toolkit-12-8"


def test_unknown_key_names_the_nearest_known_key():
    problems = messages({**REFERENCE, "driver_brach": "570"})
    assert problems["driver_brach"] == "unknown key; did you mean 'driver_branch'?"


def test_unknown_key_without_a_near_one():
    assert messages({**REFERENCE, "colour": "red"})["colour"] == "unknown key"


def test_pyinfra_connection_keys_are_not_unknown():
    assert messages({**REFERENCE, "ssh_port": 22, "ssh_user": "root", "_sudo": True}) == {}


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("gpu_count", "2", "must be int, got str '2'"),
        ("gpu_count", True, "must be int, got bool True"),
        ("nvlink", "yes", "must be bool, got str 'yes'"),
        ("driver_branch", 57.0, "must be str or int, got float 57.0"),
        ("cuda_version", 12.8, "must be str, got float 12.8"),
        ("catalog_overrides", [], "must be dict, got list []"),
    ],
)
def test_wrong_type(key, value, expected):
    """(pyinfra's --data turns 570 into an int, 12.8 into a float)"""
    assert messages({**REFERENCE, key: value})[key] == expected


def test_every_problem_is_reported_at_once():
    _, problems = validate(
        "box", {**REFERENCE, "driver_brach": "570", "gpu_count": "two", "cuda_version": "13.0"}
    )
    assert {p.key for p in problems if p.severity == "error"} == {
        "driver_brach",
        "gpu_count",
        "cuda_version",
    }
    assert all(p.host == "box" for p in problems)


def test_driver_branch_past_the_gpus_last():
    msg = messages({**REFERENCE, "driver_branch": "590"})["driver_branch"]
    assert "does not support Tesla V100-SXM2-32GB" in msg
    assert "R580 is the last branch for Volta" in msg


def test_driver_branch_may_be_an_int():
    assert load_host_config("box", {**REFERENCE, "driver_branch": 570}).driver_branch == "570"


def test_open_modules_on_volta():
    msg = messages({**REFERENCE, "driver_kernel_modules": "open"})["driver_kernel_modules"]
    assert msg.startswith("open kernel modules do not work on Tesla V100-SXM2-32GB")
    assert "use 'proprietary'" in msg


def test_kernel_module_choice_is_checked():
    msg = messages({**REFERENCE, "driver_kernel_modules": "closed"})["driver_kernel_modules"]
    assert msg == "must be one of 'proprietary', 'open', got 'closed'"


def test_open_modules_are_the_default_on_turing_and_newer():
    config = load_host_config("box", {**REFERENCE, "gpu_model": "Tesla T4", "backend": "none"})
    assert config.driver_kernel_modules == "open"


def test_cuda_13_cannot_build_for_volta():
    msg = messages({**REFERENCE, "driver_branch": "580", "cuda_version": "13.0"})["cuda_version"]
    assert msg == (
        "CUDA 13.0 cannot build for Tesla V100-SXM2-32GB (compute capability 7.0): "
        "CUDA 12.x is the last toolkit for Volta"
    )


def test_cuda_needs_a_newer_driver_branch():
    msg = messages({**REFERENCE, "cuda_version": "12.9"})["cuda_version"]
    assert msg == "CUDA 12.9 needs driver branch 575 or newer; driver_branch is 570"


def test_unknown_gpu_model_without_a_near_one_lists_the_known_ones():
    msg = messages({**REFERENCE, "gpu_model": "GeForce 256"})["gpu_model"]
    assert msg.startswith("unknown GPU model 'GeForce 256'; known models: ")
    for name in compat.GPU_MODELS:
        assert name in msg


def test_driver_version_must_belong_to_the_branch():
    msg = messages({**REFERENCE, "driver_version": "580.105.08"})["driver_version"]
    assert msg == "'580.105.08' is not a release of branch 570"


def test_catalog_override_of_a_url():
    url = "https://mirror.example.org/nvidia/{distro}/x86_64/"
    config = load_host_config(
        "box", {**REFERENCE, "catalog_overrides": {"repos.nvidia_cuda.url": url}}
    )
    assert config.catalog["repos"]["nvidia_cuda"]["url"] == url
    # the shared catalog is untouched
    assert catalog.load()["repos"]["nvidia_cuda"]["url"] != url


def test_catalog_override_of_an_unknown_entry():
    msg = messages({**REFERENCE, "catalog_overrides": {"repos.nvidia_cuda.ur": "x"}})
    assert "catalog entry 'repos.nvidia_cuda.ur' does not exist" in msg["catalog_overrides"]
    assert "did you mean 'repos.nvidia_cuda.url'?" in msg["catalog_overrides"]


def test_catalog_keys_with_dots_can_be_overridden():
    config = load_host_config(
        "box",
        {**REFERENCE, "catalog_overrides": {"cuda.versions.12.8.package_version": "12.8.0-1"}},
    )
    assert config.cuda["package_version"] == "12.8.0-1"


def test_load_host_config_raises_with_every_problem():
    with pytest.raises(ConfigError) as err:
        load_host_config("box", {"driver_brach": "570", "gpu_count": 0})
    text = str(err.value)
    assert "box: driver_brach: unknown key" in text
    assert "box: gpu_count: must be at least 1" in text


def test_every_key_is_documented():
    for key in KEYS:
        assert key.doc and key.name.islower()


def test_every_catalog_url_has_a_distro_or_is_absolute():
    for path in catalog.leaf_paths():
        value = catalog.get_path(catalog.load(), path)
        if path.endswith("url"):
            assert value.startswith("https://"), path


def test_a_context_that_does_not_fit_the_gpus_is_refused_with_the_largest_that_fits():
    # a KV cache of 200 MiB per 1k tokens: the weights fit 2x V100 32 GB, 131072 tokens do not
    kv = {"catalog_overrides": {"models.qwen3-next-80b-a3b-thinking.kv_mib_per_1k_ctx": 200}}
    msg = messages({**REFERENCE, **kv})["model_ctx"]
    assert msg == (
        "qwen3-next-80b-a3b-thinking with 2 slot(s) of 131072 tokens (a KV pool of 262144 "
        "tokens: every slot may hold its whole context at once) needs about 96 GiB of GPU "
        "memory (46 GiB of weights + the KV cache); 2x Tesla V100-SXM2-32GB have 61 GiB "
        "usable: lower model_ctx to 37888 or less, or lower model_parallel"
    )
    largest = 37888
    assert messages({**REFERENCE, **kv, "model_ctx": largest}) == {}
    assert "model_ctx" in messages({**REFERENCE, **kv, "model_ctx": largest + 1024})
