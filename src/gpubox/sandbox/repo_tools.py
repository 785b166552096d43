"""The stand-in NVIDIA repositories' other packages: the CUDA toolkits (12.8, and 13.0 as a
second temptation), DCGM at the catalog's version and a newer one (NVIDIA's CUDA repository
carries both), the container toolkit's four packages with NVIDIA's dependency shape; and the
package lists of the two repositories (all_packages, all_toolkit_packages). Stand-ins built
from NVIDIA's packaging sources; STANDINS.md says what is recorded and what is guessed."""

from __future__ import annotations

from typing import Any

from gpubox import catalog
from gpubox.sandbox import debian_real, standin
from gpubox.sandbox.repo_debs import LIBDIR, Deb, _doc, _dummy_library, _template
from gpubox.sandbox.repo_driver import all_driver_packages

# Toolkit releases the stand-in knows, with the commit `nvidia-ctk --version` prints (git
# rev-parse of the tags v1.17.8 and v1.18.0 in NVIDIA/nvidia-container-toolkit); the catalog's
# version is served with a newer one beside it, as the temptation.
TOOLKIT_COMMITS = {
    "1.17.8": "f202b80a9b9d0db00d9b1d73c0128c8962c55f4d",
    "1.18.0": "f8daa5e26de9fd7eb79259040b6dd5a52060048c",
}
TOOLKIT_TEMPTATION = "1.18.0-1"
# DCGM: the catalog's version and a newer one (NVIDIA's CUDA repository carries both).
DCGM_TEMPTATION = "1:4.5.0-1"

# CUDA toolkit stand-ins: what `nvcc --version` prints, and the versions of the packages
# around the toolkit meta package (catalog.yml cuda.versions holds the meta package version).
#
# nvcc banners are verbatim transcripts of the real compilers, checked 2026-11 with the code
# search: CUDA 12.8 Update 1 (cuda-nvcc-12-8 12.8.93-1), e.g. gongyisheng/playground
# cuda/install.md and several other public install notes; CUDA 13.0 (cuda-nvcc-13-0
# 13.0.88-1, the nvcc that cuda-toolkit-13-0 13.0.2-1 installs: public Dockerfiles pin
# cuda-nvcc-13-0=13.0.88-1 beside cuda-cudart-dev-13-0=13.0.96-1), several public
# `nvcc --version` transcripts (WSL setup notes, llama.cpp benchmark logs).
CUDA_STANDINS: dict[str, dict[str, Any]] = {
    "12.8": {
        "nvcc_version": "12.8.93-1",
        "cudart_version": "12.8.90-1",
        "config_version": "12.8.90-1",
        "cudart_so": "12.8.90",
        "alternatives_priority": 128,
        "nvcc_banner": (
            "nvcc: NVIDIA (R) Cuda compiler driver\n"
            "Copyright (c) 2005-2025 NVIDIA Corporation\n"
            "Built on Fri_Feb_21_20:23:50_PST_2025\n"
            "Cuda compilation tools, release 12.8, V12.8.93\n"
            "Build cuda_12.8.r12.8/compiler.35583870_0\n"
        ),
    },
    "13.0": {
        "nvcc_version": "13.0.88-1",
        "cudart_version": "13.0.96-1",
        "config_version": "13.0.96-1",
        "cudart_so": "13.0.96",
        "alternatives_priority": 130,
        "nvcc_banner": (
            "nvcc: NVIDIA (R) Cuda compiler driver\n"
            "Copyright (c) 2005-2025 NVIDIA Corporation\n"
            "Built on Wed_Aug_20_01:58:59_PM_PDT_2025\n"
            "Cuda compilation tools, release 13.0, V13.0.88\n"
            "Build cuda_13.0.r13.0/compiler.36424714_0\n"
        ),
    },
}


def cuda_packages(cuda: str, cat: dict[str, Any]) -> list[Deb]:
    """A CUDA toolkit as stand-ins: meta package, nvcc, cudart and the config packages."""
    info = cat["cuda"]["versions"][cuda]
    extra = CUDA_STANDINS[cuda]
    dash = cuda.replace(".", "-")
    major = cuda.split(".")[0]
    prefix = info["prefix"].strip("/")  # usr/local/cuda-12.8
    values = {
        "cuda": cuda,
        "prefix": "/" + prefix,
        "major": major,
        "priority": extra["alternatives_priority"],
    }
    cfg = extra["config_version"]

    common = Deb(
        "cuda-toolkit-config-common",
        cfg,
        "Common config package for CUDA Toolkit",
        section="multiverse/devel",
    )
    common.add("etc/ld.so.conf.d/000_cuda.conf", _template("cuda/000_cuda.conf", **values))
    major_cfg = Deb(
        f"cuda-toolkit-{major}-config-common",
        cfg,
        f"Common config package for CUDA Toolkit {major}",
        section="multiverse/devel",
    )
    major_cfg.add(
        f"etc/ld.so.conf.d/988_cuda-{major}.conf", _template("cuda/988_cuda-major.conf", **values)
    )
    ver_cfg = Deb(
        f"cuda-toolkit-{dash}-config-common",
        cfg,
        f"Common config package for CUDA Toolkit {cuda}",
        section="multiverse/devel",
    )
    ver_cfg.scripts["postinst"] = _template("cuda/config-common-postinst", **values)
    ver_cfg.scripts["prerm"] = _template("cuda/config-common-prerm", **values)

    cudart = Deb(
        f"cuda-cudart-{dash}",
        extra["cudart_version"],
        "CUDA Runtime native Libraries",
        depends=[
            f"cuda-toolkit-{dash}-config-common",
            f"cuda-toolkit-{major}-config-common",
            "cuda-toolkit-config-common",
        ],
        section="multiverse/devel",
    )
    lib = f"{prefix}/targets/x86_64-linux/lib"
    cudart.add(
        f"{lib}/libcudart.so.{extra['cudart_so']}",
        _dummy_library(f"libcudart.so.{extra['cudart_so']}", cudart.name),
    )
    cudart.links[f"{lib}/libcudart.so.{major}"] = f"libcudart.so.{extra['cudart_so']}"
    cudart.links[f"{prefix}/lib64"] = "targets/x86_64-linux/lib"

    nvcc = Deb(
        f"cuda-nvcc-{dash}",
        extra["nvcc_version"],
        "CUDA nvcc",
        depends=[f"cuda-cudart-{dash}"],
        section="multiverse/devel",
    )
    nvcc.add(
        f"{prefix}/bin/nvcc",
        _template("cuda/nvcc", banner=extra["nvcc_banner"].rstrip("\n"), **values),
        0o755,
    )

    meta = Deb(
        info["package"],
        info["package_version"],
        f"CUDA Toolkit {cuda} meta-package (does not include the driver)",
        depends=[
            f"{nvcc.name} (>= {nvcc.version.split('-')[0]})",
            f"{cudart.name} (>= {cudart.version.split('-')[0]})",
            f"{ver_cfg.name} (>= {cfg.split('-')[0]})",
        ],
        section="multiverse/metapackages",
    )
    debs = [common, major_cfg, ver_cfg, cudart, nvcc, meta]
    for d in debs:
        _doc(d)
    return debs


def dcgm_packages(version: str) -> list[Deb]:
    """DCGM 4 as NVIDIA's CUDA repository ships it (DCGM cmake/packaging.cmake, scripts/deb), as
    stand-ins: -core carries nv-hostengine, dcgmi and nvidia-dcgm.service; -proprietary the
    profiling module that the NVLink fields 1011/1012 need (the dcgmi stand-in looks for it)."""
    upstream = version.split(":")[-1].split("-")[0]  # 4.4.1
    major = upstream.split(".")[0]
    same = f"(= {version})"
    values = {"version": version, "upstream": upstream}
    prefix = f"datacenter-gpu-manager-{major}"

    core = Deb(
        f"{prefix}-core",
        version,
        "NVIDIA Datacenter GPU Management Tools - core",
        depends=["libc6 (>= 2.27)", "lshw"],
        pre_depends=["passwd", "login"],
        conflicts=["datacenter-gpu-manager"],
        section="multiverse/devel",
    )
    # the other stand-ins' home: standin/STATE.md
    core.add("usr/bin/nv-hostengine", standin.dcgm_source(standin.NV_HOSTENGINE, upstream), 0o755)
    core.add("usr/bin/dcgmi", standin.dcgm_source(standin.DCGMI, upstream), 0o755)
    core.add(
        "usr/lib/systemd/system/nvidia-dcgm.service",
        _template("dcgm/nvidia-dcgm.service", **values),
    )
    core.add(f"{LIBDIR}/libdcgm.so.{upstream}", _dummy_library(f"libdcgm.so.{major}", core.name))
    core.links[f"{LIBDIR}/libdcgm.so.{major}"] = f"libdcgm.so.{upstream}"
    core.scripts["postinst"] = _template("dcgm/core-postinst", **values)

    cuda12 = Deb(
        f"{prefix}-cuda12",
        version,
        "NVIDIA Datacenter GPU Management Tools - CUDA 12 support",
        depends=[f"{core.name} {same}"],
        provides=[f"{prefix} {same}"],
        recommends=["libnuma1"],
        section="multiverse/devel",
    )
    plugins = f"usr/libexec/{prefix}/plugins/cuda12"
    cuda12.add(
        f"{plugins}/libpluginr.so.{major}", _dummy_library(f"libpluginr.so.{major}", cuda12.name)
    )

    proprietary = Deb(
        f"{prefix}-proprietary",
        version,
        "NVIDIA Datacenter GPU Management Tools - proprietary modules",
        depends=[f"{core.name} {same}"],
        section="multiverse/devel",
    )
    profiling = f"libdcgmmoduleprofiling.so.{major}"
    proprietary.add(
        f"{LIBDIR}/libdcgmmoduleprofiling.so.{upstream}",
        _dummy_library(profiling, proprietary.name),
    )
    proprietary.links[f"{LIBDIR}/{profiling}"] = f"libdcgmmoduleprofiling.so.{upstream}"

    proprietary_cuda12 = Deb(
        f"{prefix}-proprietary-cuda12",
        version,
        "NVIDIA Datacenter GPU Management Tools - proprietary CUDA 12 modules",
        depends=[f"{proprietary.name} {same}", f"{cuda12.name} {same}"],
        section="multiverse/devel",
    )
    proprietary_cuda12.add(
        f"{plugins}/libpluginprofiling.so.{major}",
        _dummy_library(f"libpluginprofiling.so.{major}", proprietary_cuda12.name),
    )
    debs = [core, cuda12, proprietary, proprietary_cuda12]
    for d in debs:
        _doc(d)
    return debs


def toolkit_packages(version: str) -> list[Deb]:
    """The NVIDIA Container Toolkit's four packages at one version, as stand-ins, with the
    files where NVIDIA's packaging puts them (packaging/debian/*.install)."""
    upstream = version.split("-")[0]  # 1.17.8
    values = {"version": upstream, "commit": TOOLKIT_COMMITS.get(upstream, "")}

    lib = Deb(
        "libnvidia-container1",
        version,
        "NVIDIA container runtime library",
        section="libs",
    )
    lib.add(
        f"{LIBDIR}/libnvidia-container.so.{upstream}",
        _dummy_library("libnvidia-container.so.1", lib.name),
    )
    lib.links[f"{LIBDIR}/libnvidia-container.so.1"] = f"libnvidia-container.so.{upstream}"

    tools = Deb(
        "libnvidia-container-tools",
        version,
        "NVIDIA container runtime library (command-line tools)",
        depends=[f"libnvidia-container1 (>= {version})"],
        section="utils",
    )
    tools.add(
        "usr/bin/nvidia-container-cli",
        _template("container-toolkit/nvidia-container-cli", **values),
        0o755,
    )

    base = Deb(
        "nvidia-container-toolkit-base",
        version,
        "NVIDIA Container Toolkit Base",
        breaks=[
            "nvidia-container-runtime (<= 3.5.0-1)",
            "nvidia-container-runtime-hook",
            "nvidia-container-toolkit (<= 1.10.0-1)",
        ],
        replaces=["nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook"],
        section="utils",
    )
    for name in ("nvidia-ctk", "nvidia-container-runtime"):
        base.add(f"usr/bin/{name}", _template(f"container-toolkit/{name}", **values), 0o755)

    toolkit = Deb(
        "nvidia-container-toolkit",
        version,
        "NVIDIA Container toolkit",
        depends=[
            f"nvidia-container-toolkit-base (= {version})",
            f"libnvidia-container-tools (>= {version})",
            "libnvidia-container-tools (<< 2.0.0)",
        ],
        breaks=["nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook"],
        replaces=["nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook"],
        section="utils",
    )
    toolkit.add(
        "usr/bin/nvidia-container-runtime-hook",
        _template("container-toolkit/nvidia-container-runtime-hook", **values),
        0o755,
    )
    # as NVIDIA's postinst/postrm: nvidia-container-toolkit is a link to the hook
    toolkit.scripts["postinst"] = (
        'if [ "$1" = configure ] && [ -f /usr/bin/nvidia-container-runtime-hook ] '
        "&& [ ! -e /usr/bin/nvidia-container-toolkit ]; then\n"
        "    ln -s /usr/bin/nvidia-container-runtime-hook /usr/bin/nvidia-container-toolkit\n"
        "fi\n"
    )
    toolkit.scripts["postrm"] = (
        'if [ "$1" = purge ] && [ -L /usr/bin/nvidia-container-toolkit ]; then\n'
        "    rm /usr/bin/nvidia-container-toolkit\n"
        "fi\n"
    )
    debs = [lib, tools, base, toolkit]
    for d in debs:
        _doc(d)
    return debs


def all_packages(
    cat: dict[str, Any] | None = None, real: debian_real.RealArchive | None = None
) -> list[Deb]:
    """The stand-in NVIDIA CUDA repository's packages (drivers, CUDA toolkits, DCGM); the
    drivers are derived from Debian's real packages (``real``: the cache, fetched if missing)."""
    cat = cat or catalog.load()
    real = real or debian_real.ensure()
    debs = all_driver_packages(cat, real)
    seen: set[tuple[str, str]] = set()
    for cuda in CUDA_STANDINS:
        for d in cuda_packages(cuda, cat):
            if (d.name, d.version) not in seen:  # config-common is shared between toolkits
                seen.add((d.name, d.version))
                debs.append(d)
    for version in dict.fromkeys([cat["dcgm"]["version"], DCGM_TEMPTATION]):
        debs.extend(dcgm_packages(version))
    return debs


def all_toolkit_packages(cat: dict[str, Any] | None = None) -> list[Deb]:
    """The stand-in container toolkit repository's packages: the catalog's version and newer."""
    cat = cat or catalog.load()
    versions = dict.fromkeys([cat["container_toolkit"]["version"], TOOLKIT_TEMPTATION])
    return [d for version in versions for d in toolkit_packages(version)]
