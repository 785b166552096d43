"""gpu-burn and nvtop, proven by running them."""

from __future__ import annotations

import pytest

from gpubox import parsers


@pytest.mark.gpu
def test_gpu_burn_lists_every_gpu(box):
    gpus = parsers.parse_gpu_burn_list(box.out("gpu-burn -l"))
    assert len(gpus) == box.config.gpu_count, (
        f"{box.name}: gpu-burn -l lists {len(gpus)} GPU(s), expected {box.config.gpu_count}"
    )


@pytest.mark.burn
def test_a_short_gpu_burn_passes_on_every_gpu(box):
    """Opt-in (--burn): a few seconds of gpu-burn; it exits 0 even with a FAULTY GPU."""
    result = parsers.parse_gpu_burn(box.out("gpu-burn 5 2>&1"))
    bad = {i: s for i, s in result.gpus.items() if s != "OK"}
    assert result.tested == box.config.gpu_count and not bad, (
        f"{box.name}: gpu-burn tested {result.tested} GPU(s); not OK: {bad}"
    )


@pytest.mark.quick
def test_nvtop_runs(box):
    assert box.out("nvtop --version").startswith("nvtop version"), f"{box.name}: nvtop"
