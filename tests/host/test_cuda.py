"""The CUDA toolkit: the configured release, on PATH, /usr/local/cuda at it, nothing newer."""

from __future__ import annotations

import pytest

from gpubox import parsers


@pytest.mark.quick
def test_nvcc_in_a_login_shell_is_the_configured_release(box):
    result = box.run("bash -lc 'command -v nvcc && nvcc --version'")
    assert result.rc == 0, f"{box.name}: no nvcc on a login shell's PATH: {result.stderr}"
    path = result.stdout.splitlines()[0]
    version = parsers.parse_nvcc_version(result.stdout)
    prefix = box.config.cuda["prefix"]
    assert version.release == box.config.cuda_version and path == f"{prefix}/bin/nvcc", (
        f"{box.name}: login shell finds {path} reporting CUDA {version.release}, "
        f"expected {prefix}/bin/nvcc reporting {box.config.cuda_version}"
    )


@pytest.mark.quick
def test_usr_local_cuda_resolves_to_the_configured_toolkit(box):
    prefix = box.config.cuda["prefix"]
    real = box.out("readlink -e /usr/local/cuda || true").strip()
    assert real == prefix, (
        f"{box.name}: /usr/local/cuda resolves to {real or 'nothing'}, not {prefix}"
    )


@pytest.mark.quick
def test_cuda_runtime_is_in_the_linker_cache(box):
    """The dynamic linker finds the configured release's libcudart (through whichever
    directory, /usr/local/cuda/... or the versioned one)."""
    prefix = box.config.cuda["prefix"]
    found = box.out(
        "ldconfig -p | awk '/libcudart\\.so/ {print $NF}' | xargs -r readlink -f"
    ).split()
    assert any(path.startswith(prefix + "/") for path in found), (
        f"{box.name}: the linker cache has no libcudart under {prefix} (found: {found})"
    )


@pytest.mark.quick
def test_no_cuda_13_toolkit(box):
    dirs = box.out("ls -d /usr/local/cuda-13* 2>/dev/null || true").split()
    packages = sorted(
        n
        for n, p in box.dpkg.items()
        if n.startswith(("cuda-toolkit-13", "cuda-nvcc-13")) and p.status[:2] in ("ii", "hi")
    )
    assert not dirs and not packages, (
        f"{box.name}: a CUDA 13 toolkit is present (no sm_70 support): {dirs + packages}"
    )
