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
    # the fit rule's own sum: 46 GiB of weights + two full slots of 131072 tokens x 24 KiB,
    # within 95% of 64 GiB
    model = config.catalog["models"][MODEL]
    need_mib = model["weights_gib"] * 1024 + model["kv_mib_per_1k_ctx"] * 2 * 131072 / 1024
    assert need_mib == 53248 and need_mib < 2 * 32768 * 0.95


def test_a_slot_smaller_than_the_thinking_budget_is_refused():
    message = errors({"model_ctx": 16384})["model_ctx"]
    assert message == (
        f"{MODEL} may think for 32768 tokens (its model card's output budget), but a slot "
        "holds model_ctx = 16384 tokens: raise model_ctx"
    )
    assert errors({"model_ctx": 32768}) == {}
    # every slot holds model_ctx, however many there are
    assert errors({"model_ctx": 32768, "model_parallel": 4}) == {}


@pytest.mark.parametrize(
    "args, flag",
    [
        (["-kvu"], "-kvu"),
        (["--kv-unified"], "--kv-unified"),
        (["--kv-unified-per-slot", "4096"], "--kv-unified-per-slot"),
        (["-no-kvu"], "-no-kvu"),
        (["-c", "65536"], "-c"),
        (["--ctx-size=65536"], "--ctx-size"),
        (["-np", "4"], "-np"),
        (["--parallel", "4"], "--parallel"),
    ],
)
def test_extra_args_that_would_resize_the_slots_are_refused(args, flag):
    message = errors({"llamacpp_extra_args": args})["llamacpp_extra_args"]
    assert message.startswith(f"sets {flag}: ")
    assert errors({"llamacpp_extra_args": ["--no-warmup"]}) == {}


def test_a_context_llamacpp_would_round_is_refused_naming_both_neighbours():
    assert errors({"model_ctx": 100000})["model_ctx"] == (
        "llama.cpp sizes each slot in steps of 256 tokens, so 100000 would become 100096: "
        "use 99840 or 100096"
    )
    assert errors({"model_ctx": 100096}) == {}
    # vLLM takes any length
    assert "model_ctx" not in errors({"backend": "vllm", "model_ctx": 100000})


def test_the_fit_counts_every_slot_full_at_once():
    # 46 GiB of weights on 2x V100-32GB (95% usable): about 14.8 GiB of KV room, 646k tokens
    # of 24 KiB; at four slots each may hold 160768 (rounded down to 1024)
    data = {"model_parallel": 4, "model_ctx": 163840}
    message = errors(data)["model_ctx"]
    assert "4 slot(s) of 163840 tokens (a KV pool of 655360 tokens" in message
    assert message.endswith("lower model_ctx to 160768 or less, or lower model_parallel")
    assert errors({**data, "model_ctx": 160768}) == {}
    # one slot of the same context fits easily
    assert errors({**data, "model_parallel": 1}) == {}


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
