"""`gpubox check`'s llama.cpp rules: a pinned source, a slot that holds a thinking answer, the
defaults that fit the reference box, and what each split mode needs."""

from __future__ import annotations

import pytest
from helpers import REFERENCE

from gpubox import catalog
from gpubox.config import KEYS_BY_NAME, load_host_config, validate

MODEL = "qwen3-next-80b-a3b-thinking"
# the sandbox's tiny model: a file of its own, not the catalog's thinking model
TINY = {
    "model_source": "url",
    "model_url": "http://127.0.0.1:8765/models/gpubox-tiny.gguf",
    "model_file": "gpubox-tiny.gguf",
    "model_sha256": "ab" * 32,
}


def errors(data):
    _, problems = validate("box", {**REFERENCE, **data})
    assert all(p.severity == "error" for p in problems), problems
    return {p.key: p.message for p in problems}


def test_the_catalog_pins_the_pypi_sdist_with_pypis_sha256():
    llama = catalog.load()["llamacpp"]
    assert llama["url"].startswith("https://files.pythonhosted.org/packages/")
    assert llama["url"].endswith("/llama_cpp_python-0.3.36.tar.gz")
    assert llama["sha256"] == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    assert llama["tree"] == "llama_cpp_python-0.3.36/vendor/llama.cpp"
    assert llama["commit"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert (llama["tag"], llama["build_number"]) == ("b11312", 11312)


def test_an_empty_sha256_is_an_error_naming_the_key():
    message = errors({"catalog_overrides": {"llamacpp.sha256": ""}})["catalog_overrides"]
    assert message.startswith("llamacpp.sha256 is empty")
    assert "nothing is downloaded unverified" in message
    # vLLM does not build llama.cpp: no rule about its source there
    assert errors({"backend": "vllm", "catalog_overrides": {"llamacpp.sha256": ""}}) == {}


def test_a_malformed_sha256_is_an_error():
    message = errors({"catalog_overrides": {"llamacpp.sha256": "AB" * 32}})["catalog_overrides"]
    assert message == f"llamacpp.sha256 must be 64 lowercase hex digits, got {'AB' * 32!r}"


def test_the_defaults_are_two_slots_of_the_whole_context_and_fit_the_reference_box():
    config = load_host_config("box", REFERENCE)
    assert (config.model_ctx, config.model_parallel) == (131072, 2)
    assert config.llamacpp_split_mode == "layer"
    assert validate("box", REFERENCE)[1] == []
    # the fit rule's own sum: 46 GiB of weights + 131072 tokens x 24 KiB, within 95% of 64 GiB
    model = config.catalog["models"][MODEL]
    need_mib = model["weights_gib"] * 1024 + model["kv_mib_per_1k_ctx"] * 131072 / 1024
    assert need_mib == 50176 and need_mib < 2 * 32768 * 0.95


def test_a_slot_smaller_than_the_thinking_budget_is_refused():
    message = errors({"model_ctx": 16384})["model_ctx"]
    assert message == (
        f"{MODEL} may think for 32768 tokens (its model card's output budget), but a slot "
        "holds 16384 tokens (with the unified KV cache each slot gets all of model_ctx): "
        "raise model_ctx"
    )
    assert errors({"model_ctx": 32768}) == {}


def test_without_the_unified_kv_cache_each_slot_gets_a_share():
    # -np 4 -c 65536 without -kvu: 16384 tokens a slot, the seed's mistake
    data = {"model_ctx": 65536, "model_parallel": 4, "llamacpp_extra_args": ["-no-kvu"]}
    message = errors(data)["model_ctx"]
    assert "a slot holds 16384 tokens" in message
    assert "model_ctx / model_parallel (65536 / 4)" in message
    assert message.endswith("raise model_ctx or lower model_parallel")
    assert errors({**data, "model_parallel": 2}) == {}
    # with the unified KV cache (gpubox's -kvu) the same context is every slot's
    assert errors({"model_ctx": 65536, "model_parallel": 4}) == {}


def test_the_sandboxs_tiny_model_is_not_held_to_the_thinking_budget():
    assert errors({**TINY, "model_ctx": 2048, "model_parallel": 2}) == {}
    # ...but the catalog's own file, named explicitly, is
    named = {**TINY, "model_file": catalog.load()["models"][MODEL]["file"], "model_ctx": 2048}
    assert "model_ctx" in errors(named)


def test_split_mode_choices():
    assert KEYS_BY_NAME["llamacpp_split_mode"].choices == ("layer", "row", "tensor")
    assert errors({"llamacpp_split_mode": "none"}) == {
        "llamacpp_split_mode": "must be one of 'layer', 'row', 'tensor', got 'none'"
    }
    for mode in ("layer", "row", "tensor"):
        assert errors({"llamacpp_split_mode": mode}) == {}, mode


@pytest.mark.parametrize("mode", ["row", "tensor"])
def test_row_and_tensor_need_two_gpus(mode):
    one = {"gpu_model": "NVIDIA A100-SXM4-80GB", "gpu_count": 1, "nvlink": False}  # fits one
    assert errors({**one, "llamacpp_split_mode": mode}) == {
        "llamacpp_split_mode": f"{mode!r} splits each layer across the GPUs: it needs "
        "gpu_count 2 or more (got 1); use 'layer'"
    }
    assert errors({**one, "llamacpp_split_mode": "layer"}) == {}


@pytest.mark.parametrize("off", [["-fa", "off"], ["--flash-attn", "auto"], ["-fa=off"]])
def test_tensor_refuses_flash_attention_turned_off(off):
    message = errors({"llamacpp_split_mode": "tensor", "llamacpp_extra_args": off})
    assert message["llamacpp_extra_args"].startswith(
        "llamacpp_split_mode 'tensor' needs FlashAttention on; the extra args set -fa "
    )
    # layer split runs without it
    assert errors({"llamacpp_extra_args": off}) == {}


@pytest.mark.parametrize("kv", [["-ctk", "q8_0"], ["--cache-type-v", "q4_0"]])
def test_tensor_refuses_a_quantized_kv_cache(kv):
    message = errors({"llamacpp_split_mode": "tensor", "llamacpp_extra_args": kv})
    assert message["llamacpp_extra_args"] == (
        f"llamacpp_split_mode 'tensor' needs an f16 KV cache; the extra args ask for {kv[1]}"
    )
    assert errors({"llamacpp_split_mode": "tensor", "llamacpp_extra_args": ["-ctk", "f16"]}) == {}
    assert errors({"llamacpp_extra_args": kv}) == {}


def test_tensor_refuses_a_context_left_to_the_model():
    message = errors({"llamacpp_split_mode": "tensor", "llamacpp_extra_args": ["-c", "0"]})
    assert message["model_ctx"].startswith("llamacpp_split_mode 'tensor' needs an explicit context")


def test_the_split_mode_is_set_by_its_key_not_by_extra_args():
    message = errors({"llamacpp_extra_args": ["-sm", "row"]})["llamacpp_extra_args"]
    assert message == "sets -sm: use llamacpp_split_mode instead"
