"""NCCL for llama.cpp's multi-GPU CUDA build: which boxes get it, and at which version.

Only llama.cpp's tensor split (``-sm tensor``) uses NCCL: its meta backend is the one caller of
ggml-cuda's ``ggml_backend_cuda_comm_init`` (the pinned tree's src/llama.cpp creates it only
for LLAMA_SPLIT_MODE_TENSOR), whose all-reduces go through NCCL on Linux by default
(``GGML_CUDA_ALLREDUCE`` unset or ``nccl``). The layer split (the default) and the row split
never reduce across the GPUs through it, so a box with either gets no NCCL and builds with
``-DGGML_CUDA_NCCL=OFF``. A tensor build without NCCL would only warn ("NCCL not compiled in;
falling back to internal AllReduce") and reduce slower. NCCL does not come with the CUDA
toolkit: NVIDIA's CUDA repository
carries it as ``libnccl2`` (the library) and ``libnccl-dev`` (its header and link library),
one build per CUDA release, versioned ``<nccl>-<rev>+cuda<X.Y>`` (e.g. 2.26.2-1+cuda12.8).

The pin is a pattern, on purpose: the catalog's ``cuda.versions.<X.Y>.nccl_version`` is
``*+cuda12.8`` for CUDA 12.8. No NCCL version is recorded in this project and NVIDIA's
repository cannot be read from where it was written, so an exact version could only be a
guess. The pattern keeps NCCL to the build for the box's CUDA (the ``+cuda12.9`` and later
builds sort higher and are what a plain ``apt-get install libnccl2`` would take, built for a
CUDA newer than the toolkit and than what driver 570 supports), and preflight's repository
query checks that the repository offers a match. The CUDA stage then installs one exact
version and holds it, as every other NVIDIA package (gpubox.knowledge.apt_versions.resolve: the
version
already installed when it matches, so a re-run changes nothing; otherwise the newest the
repository offers for both packages). An exact version in the catalog (by catalog_overrides)
pins exactly.
"""

from __future__ import annotations

from gpubox.config import HostConfig

PACKAGES = ("libnccl2", "libnccl-dev")


def wanted(config: HostConfig) -> bool:
    """NCCL is installed and built in for llama.cpp with CUDA on more than one GPU split by
    tensor, the one split that all-reduces across the GPUs (vLLM's image carries its own NCCL;
    one GPU has nothing to reduce across)."""
    return (
        config.backend == "llamacpp"
        and bool(config.llamacpp_cuda)
        and config.gpu_count > 1
        and config.llamacpp_split_mode == "tensor"
    )


def pin(config: HostConfig) -> str:
    """The catalog's NCCL pin for the box's CUDA version (a pattern or an exact version)."""
    return str(config.cuda["nccl_version"])


def catalog_key(config: HostConfig) -> str:
    """Where a user overrides the pin."""
    return f"catalog_overrides 'cuda.versions.{config.cuda_version}.nccl_version'"
