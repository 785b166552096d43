"""Compatibility rules as data: every known GPU resolves, rules agree with the reference."""

from __future__ import annotations

import pytest

from gpubox.base import compat


def test_every_gpu_model_has_a_known_architecture_and_pci_id():
    for gpu in compat.GPU_MODELS.values():
        assert gpu.architecture in compat.ARCHITECTURES
        assert all(pid.startswith("10de:") for pid in gpu.pci_ids)
        assert compat.pci_id_model(gpu.pci_ids[0]) is gpu


def test_v100_rules():
    v100 = compat.GPU_MODELS["Tesla V100-SXM2-32GB"]
    assert v100.compute_capability == (7, 0)
    assert compat.default_kernel_modules(v100) == "proprietary"
    assert compat.branch_supports("Volta", 570) and compat.branch_supports("Volta", 580)
    assert not compat.branch_supports("Volta", 590)
    assert compat.cuda_builds_for("12.8", v100) and not compat.cuda_builds_for("13.0", v100)


def test_display_cards_are_known_by_pci_id():
    assert compat.pci_id_architecture("10de:128b") == ("GeForce GT 710", "Kepler")
    assert not compat.branch_supports("Kepler", 570)
    assert compat.pci_id_architecture("10de:ffff") is None


@pytest.mark.parametrize(
    ("gpu", "branch", "modules", "cuda", "keys"),
    [
        ("Tesla V100-SXM2-32GB", 570, "proprietary", "12.8", []),
        ("Tesla V100-SXM2-32GB", 580, "proprietary", "13.0", ["cuda_version"]),
        ("Tesla V100-SXM2-32GB", 570, "open", "12.8", ["driver_kernel_modules"]),
        ("Tesla V100-SXM2-32GB", 570, "proprietary", "12.9", ["cuda_version"]),
        ("Tesla T4", 580, "open", "13.0", []),
        ("NVIDIA H100 80GB HBM3", 570, "open", "12.8", []),
        ("Tesla P40", 590, "proprietary", "12.8", ["driver_branch"]),
        ("Tesla P40", 570, "proprietary", "11.8", ["cuda_version"]),
    ],
)
def test_check_matrix(gpu, branch, modules, cuda, keys):
    assert [key for key, _ in compat.check(gpu, branch, modules, cuda)] == keys
