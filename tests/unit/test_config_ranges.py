"""Number keys are range-checked, and one refused value is one problem, not a cascade."""

from __future__ import annotations

import pytest
from helpers import REFERENCE

from gpubox.config import KEYS, KEYS_BY_NAME, validate

MODEL = "qwen3-next-80b-a3b-thinking"
NUMBER_KEYS = [key for key in KEYS if key.type in (int, float)]


def errors(data):
    _, problems = validate("box", {**REFERENCE, **data})
    return {p.key: p.message for p in problems if p.severity == "error"}


def test_there_are_number_keys():
    assert {"gpu_count", "api_port", "vllm_gpu_memory_utilization"} <= {
        key.name for key in NUMBER_KEYS
    }


@pytest.mark.parametrize("key", NUMBER_KEYS, ids=lambda key: key.name)
def test_every_number_key_declares_a_range(key):
    """A new int or float key without min/max fails here."""
    assert key.min is not None or key.max is not None, f"{key.name} declares no range"
    if key.default is not None:
        assert key.in_range(key.default), f"{key.name}'s default is outside its own range"


@pytest.mark.parametrize("key", NUMBER_KEYS, ids=lambda key: key.name)
def test_every_number_key_refuses_a_value_past_its_range(key):
    step = 1 if key.type is int else 0.001
    outside = []
    if key.min is not None:
        outside.append(key.min - step)
    if key.max is not None:
        outside.append(key.max + step)
    for value in outside:
        value = key.type(value)
        message = errors({key.name: value}).get(key.name, "")
        assert message.startswith(f"must be {key.range_text()}, got {value!r}") or (
            # a key with choices (burnin_dcgm_level) says so first; either names the range
            key.choices and message.startswith("must be one of ")
        ), message


@pytest.mark.parametrize("key", NUMBER_KEYS, ids=lambda key: key.name)
def test_every_number_key_accepts_the_ends_of_its_range(key):
    for value in (key.min, key.max):
        if value is not None:
            # other rules may still refuse the value (model_ctx 1 holds no thinking answer)
            message = errors({key.name: key.type(value)}).get(key.name, "")
            assert not message.startswith("must be"), message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("api_port", 70000, "must be 1 to 65535, got 70000"),
        ("api_port", 0, "must be 1 to 65535, got 0"),
        ("dcgm_exporter_port", 65536, "must be 1 to 65535, got 65536"),
        ("model_parallel", 0, "must be at least 1, got 0"),
        ("reboot_timeout", 0, "must be at least 1, got 0"),
        ("apt_lock_timeout", -5, "must be at least 1, got -5"),
        ("health_timeout", 0, "must be at least 1, got 0"),
        ("burnin_seconds", 0, "must be at least 1, got 0"),
        ("burnin_max_age_days", 0, "must be at least 1, got 0"),
        ("model_ctx", 0, "must be at least 1, got 0"),
        ("gpu_count", 0, "must be at least 1, got 0"),
        ("vllm_tensor_parallel", 0, "must be at least 1, got 0"),
        ("nvlink_links", 0, "must be at least 1, got 0"),
        ("gpu_burn_compute", 7, "must be at least 50, got 7"),
        ("vllm_gpu_memory_utilization", 1.5, "must be 0.01 to 1.0, got 1.5"),
        ("vllm_gpu_memory_utilization", 0.0, "must be 0.01 to 1.0, got 0.0"),
    ],
)
def test_out_of_range_value_names_key_value_and_range(key, value, expected):
    assert errors({key: value}) == {key: expected}


def test_the_refused_value_is_never_used():
    config, problems = validate("box", {**REFERENCE, "api_port": 70000})
    assert config is None
    assert [str(p) for p in problems if p.severity == "error"] == [
        "box: api_port: must be 1 to 65535, got 70000"
    ]


@pytest.mark.parametrize(
    "data",
    [
        # 0x V100: "needs 47 GiB of GPU memory; 0x ... have 0 GiB" is gpu_count's fault
        {"gpu_count": 0},
        # 2x 16 GB would not fit either, but the host did not say 2: no guess at its count
        {"gpu_model": "Tesla V100-SXM2-16GB", "gpu_count": 0},
        # vLLM's tensor parallel is checked against gpu_count
        {"gpu_count": 0, "backend": "vllm", "vllm_tensor_parallel": 2},
    ],
)
def test_a_wrong_gpu_count_is_one_problem(data):
    assert errors(data) == {"gpu_count": "must be at least 1, got 0"}


def test_a_wrong_gpu_model_does_not_judge_the_rest_against_the_default_gpu():
    # With the default V100 standing in, 'open' would be refused for Volta.
    assert errors({"gpu_model": 100, "driver_kernel_modules": "open"}) == {
        "gpu_model": "must be str, got int 100"
    }


def test_a_wrong_driver_branch_does_not_judge_cuda_against_the_default_branch():
    # With the default 570 standing in, CUDA 13.0 would need branch 580.
    data = {"gpu_model": "NVIDIA A100-SXM4-80GB", "driver_branch": 580.0, "cuda_version": "13.0"}
    assert errors(data) == {"driver_branch": "must be str or int, got float 580.0"}


def test_a_wrong_model_ctx_is_one_problem():
    assert errors({"model_ctx": 0, "gpu_model": "Tesla V100-SXM2-16GB", "gpu_count": 1}) == {
        "model_ctx": "must be at least 1, got 0"
    }


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (f"models.{MODEL}.context", "big", f"'models.{MODEL}.context' must be int, got str 'big'"),
        (f"models.{MODEL}.context", 1.5, f"'models.{MODEL}.context' must be int, got float 1.5"),
        (f"models.{MODEL}.context", True, f"'models.{MODEL}.context' must be int, got bool True"),
        (f"models.{MODEL}.weights_gib", -1, f"'models.{MODEL}.weights_gib' must be at least 0"),
        (
            f"models.{MODEL}.sampling.temp",
            "hot",
            f"'models.{MODEL}.sampling.temp' must be int or float, got str 'hot'",
        ),
        (f"models.{MODEL}", 1, f"catalog entry 'models.{MODEL}' is a section, not a value"),
    ],
)
def test_numbers_in_catalog_overrides_are_checked(path, value, expected):
    assert errors({"catalog_overrides": {path: value}})["catalog_overrides"].startswith(expected)


def test_catalog_override_keys_must_be_paths():
    message = errors({"catalog_overrides": {3: "x"}})["catalog_overrides"]
    assert message == "keys are dotted catalog paths, got int 3"


def test_a_good_number_override_is_used():
    config, _ = validate(
        "box",
        {
            **REFERENCE,
            "model_ctx": 300032,
            "catalog_overrides": {f"models.{MODEL}.context": 300032, f"models.{MODEL}.size": 7},
        },
    )
    assert config is not None
    assert config.catalog["models"][MODEL]["context"] == 300032
    assert config.catalog["models"][MODEL]["size"] == 7
    assert config.catalog["models"][MODEL]["sampling"]["temp"] == 0.6


def test_a_refused_override_does_not_judge_the_model_by_the_catalog_value():
    # The host meant a context of 300000; its refused override must not turn into
    # "context 300000 is larger than the model's 262144".
    data = {"model_ctx": 300000, "catalog_overrides": {f"models.{MODEL}.context": "300k"}}
    assert set(errors(data)) == {"catalog_overrides"}


def test_every_refused_override_is_reported_and_the_good_ones_kept():
    _, problems = validate(
        "box",
        {
            **REFERENCE,
            "catalog_overrides": {
                "repos.nvidia_cuda.ur": "x",
                f"models.{MODEL}.context": "big",
                "llamacpp.sha256": "ab" * 32,
            },
        },
    )
    assert [p.key for p in problems] == ["catalog_overrides", "catalog_overrides"]
    # the pinned sha256 was applied: no "no pinned sha256" warning
    assert all(p.severity == "error" for p in problems)


def test_key_range_text():
    assert KEYS_BY_NAME["api_port"].range_text() == "1 to 65535"
    assert KEYS_BY_NAME["gpu_count"].range_text() == "at least 1"
