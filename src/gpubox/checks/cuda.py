"""Checks of the CUDA toolkit (deploy/cuda.py fixes them)."""

from __future__ import annotations

from gpubox.base import layout
from gpubox.checks.core import Check, Reading
from gpubox.config import HostConfig


def nvcc_login_shell(c: HostConfig, r: Reading) -> str | None:
    out = r.out("nvcc")
    if out.rc != 0 or not out.stdout.strip():
        return "no nvcc on a login shell's PATH"
    path = out.stdout.splitlines()[0]  # `command -v nvcc`
    release = r.get("nvcc").release
    prefix = c.cuda["prefix"]
    if release != c.cuda_version or path != f"{prefix}/bin/nvcc":
        return (
            f"a login shell finds {path} (CUDA {release}), expected {prefix}/bin/nvcc "
            f"(CUDA {c.cuda_version})"
        )
    return None


def usr_local_cuda(c: HostConfig, r: Reading) -> str | None:
    real, prefix = r.get("cuda_link").strip(), c.cuda["prefix"]
    if real != prefix:
        return f"{layout.USR_LOCAL_CUDA} resolves to {real or 'nothing'}, not {prefix}"
    return None


def linker_cache(c: HostConfig, r: Reading) -> str | None:
    prefix, found = c.cuda["prefix"], r.get("ldconfig_cudart")
    if not any(path.startswith(prefix + "/") for path in found):
        return f"the linker cache has no libcudart under {prefix} (found: {found})"
    return None


def no_cuda_13(c: HostConfig, r: Reading) -> str | None:
    dirs, dpkg = r.get("cuda13_dirs"), r.get("dpkg")
    packages = sorted(
        n
        for n, p in dpkg.items()
        if n.startswith(("cuda-toolkit-13", "cuda-nvcc-13")) and p.status[:2] in ("ii", "hi")
    )
    if dirs or packages:
        return f"a CUDA 13 toolkit is present (no sm_70 support): {dirs + packages}"
    return None


CHECKS = [
    Check(
        "cuda.nvcc",
        "nvcc in a login shell is the configured release",
        "quick",
        ("nvcc",),
        nvcc_login_shell,
    ),
    Check(
        "cuda.link",
        f"{layout.USR_LOCAL_CUDA} resolves to the configured toolkit",
        "quick",
        ("cuda_link",),
        usr_local_cuda,
    ),
    Check(
        "cuda.ldconfig",
        "the CUDA runtime is in the linker cache",
        "quick",
        ("ldconfig_cudart",),
        linker_cache,
    ),
    Check(
        "cuda.no-13",
        "no CUDA 13 toolkit (it cannot build for sm_70)",
        "quick",
        ("cuda13_dirs", "dpkg"),
        no_cuda_13,
    ),
]
