"""The CUDA stage's driver guard, run for real: its shell command under sh and bash, with
`apt-get` on PATH replaced by a script that prints a recorded `apt-get -s install` output.

The outputs below are real apt output, captured on the gpubox development machine (Debian 12,
apt 2.6.2, LC_ALL=C, 2026-12-01) with `apt-get -s install --no-install-recommends PACKAGE`
against a local flat repository (Release Origin "NVIDIA", Label "NVIDIA CUDA") carrying
NVIDIA's package names with their dependency shape: cuda-toolkit-12-8 on cuda-nvcc-12-8,
cuda-cudart-12-8 and cuda-toolkit-12-8-config-common; cuda-12-8 on cuda-runtime-12-8 and
cuda-toolkit-12-8; cuda-runtime-12-8 on cuda-drivers; cuda-drivers on nvidia-driver-cuda and
nvidia-kernel-dkms; nvidia-driver-cuda on libcuda1. CUDA_12_8_DRIVER_PRESENT was captured with
the driver and cuda-runtime-12-8 already in the dpkg status, so cuda-12-8 is its only
forbidden line; LIBCUDA_ONLY from a toolkit whose only driver dependency is libcuda1."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpubox.stages import cuda as cuda_stage

HEADER = "Reading package lists...\nBuilding dependency tree...\nReading state information...\n"

CLEAN_TOOLKIT = (
    HEADER
    + """The following additional packages will be installed:
  cuda-cudart-12-8 cuda-nvcc-12-8 cuda-toolkit-12-8-config-common
The following NEW packages will be installed:
  cuda-cudart-12-8 cuda-nvcc-12-8 cuda-toolkit-12-8
  cuda-toolkit-12-8-config-common
0 upgraded, 4 newly installed, 0 to remove and 0 not upgraded.
Inst cuda-toolkit-12-8-config-common (12.8.90-1 NVIDIA CUDA:localhost [all])
Inst cuda-cudart-12-8 (12.8.90-1 NVIDIA CUDA:localhost [amd64])
Inst cuda-nvcc-12-8 (12.8.93-1 NVIDIA CUDA:localhost [amd64])
Inst cuda-toolkit-12-8 (12.8.1-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-toolkit-12-8-config-common (12.8.90-1 NVIDIA CUDA:localhost [all])
Conf cuda-cudart-12-8 (12.8.90-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-nvcc-12-8 (12.8.93-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-toolkit-12-8 (12.8.1-1 NVIDIA CUDA:localhost [amd64])
"""
)

CUDA_12_8_DRIVER_PRESENT = (
    HEADER
    + """The following additional packages will be installed:
  cuda-cudart-12-8 cuda-nvcc-12-8 cuda-toolkit-12-8
  cuda-toolkit-12-8-config-common
The following NEW packages will be installed:
  cuda-12-8 cuda-cudart-12-8 cuda-nvcc-12-8 cuda-toolkit-12-8
  cuda-toolkit-12-8-config-common
0 upgraded, 5 newly installed, 0 to remove and 3 not upgraded.
Inst cuda-toolkit-12-8-config-common (12.8.90-1 NVIDIA CUDA:localhost [all])
Inst cuda-cudart-12-8 (12.8.90-1 NVIDIA CUDA:localhost [amd64])
Inst cuda-nvcc-12-8 (12.8.93-1 NVIDIA CUDA:localhost [amd64])
Inst cuda-toolkit-12-8 (12.8.1-1 NVIDIA CUDA:localhost [amd64])
Inst cuda-12-8 (12.8.1-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-toolkit-12-8-config-common (12.8.90-1 NVIDIA CUDA:localhost [all])
Conf cuda-cudart-12-8 (12.8.90-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-nvcc-12-8 (12.8.93-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-toolkit-12-8 (12.8.1-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-12-8 (12.8.1-1 NVIDIA CUDA:localhost [amd64])
"""
)

CUDA_DRIVERS = (
    HEADER
    + """The following additional packages will be installed:
  libcuda1 nvidia-driver-cuda nvidia-kernel-dkms
The following NEW packages will be installed:
  cuda-drivers libcuda1 nvidia-driver-cuda nvidia-kernel-dkms
0 upgraded, 4 newly installed, 0 to remove and 0 not upgraded.
Inst libcuda1 (580.105.08-1 NVIDIA CUDA:localhost [amd64])
Inst nvidia-driver-cuda (580.105.08-1 NVIDIA CUDA:localhost [amd64])
Inst nvidia-kernel-dkms (580.105.08-1 NVIDIA CUDA:localhost [amd64])
Inst cuda-drivers (580.105.08-1 NVIDIA CUDA:localhost [amd64])
Conf libcuda1 (580.105.08-1 NVIDIA CUDA:localhost [amd64])
Conf nvidia-driver-cuda (580.105.08-1 NVIDIA CUDA:localhost [amd64])
Conf nvidia-kernel-dkms (580.105.08-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-drivers (580.105.08-1 NVIDIA CUDA:localhost [amd64])
"""
)

LIBCUDA_ONLY = (
    HEADER
    + """The following additional packages will be installed:
  cuda-cudart-12-8 cuda-nvcc-12-8 cuda-toolkit-12-8-config-common libcuda1
The following NEW packages will be installed:
  cuda-cudart-12-8 cuda-nvcc-12-8 cuda-toolkit-12-8-config-common
  cuda-toolkit-12-9 libcuda1
0 upgraded, 5 newly installed, 0 to remove and 0 not upgraded.
Inst cuda-toolkit-12-8-config-common (12.8.90-1 NVIDIA CUDA:localhost [all])
Inst cuda-cudart-12-8 (12.8.90-1 NVIDIA CUDA:localhost [amd64])
Inst cuda-nvcc-12-8 (12.8.93-1 NVIDIA CUDA:localhost [amd64])
Inst libcuda1 (580.105.08-1 NVIDIA CUDA:localhost [amd64])
Inst cuda-toolkit-12-9 (12.9.1-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-toolkit-12-8-config-common (12.8.90-1 NVIDIA CUDA:localhost [all])
Conf cuda-cudart-12-8 (12.8.90-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-nvcc-12-8 (12.8.93-1 NVIDIA CUDA:localhost [amd64])
Conf libcuda1 (580.105.08-1 NVIDIA CUDA:localhost [amd64])
Conf cuda-toolkit-12-9 (12.9.1-1 NVIDIA CUDA:localhost [amd64])
"""
)

UNKNOWN_PACKAGE = HEADER + "E: Unable to locate package nosuch\n"


def run_guard(tmp_path: Path, shell: str, output: str, rc: int = 0) -> subprocess.CompletedProcess:
    """The guard's command, run by ``shell`` with a fake apt-get that answers ``output``."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (tmp_path / "output").write_text(output)
    apt_get = shims / "apt-get"
    apt_get.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/argv\ncat {tmp_path}/output\nexit {rc}\n'
    )
    apt_get.chmod(0o755)
    command = cuda_stage.guard_command("cuda-toolkit-12-8=12.8.1-1")
    return subprocess.run(
        [shell, "-c", f'PATH={shims}:"$PATH"; {command}'],
        capture_output=True,
        text=True,
        timeout=30,
    )


SHELLS = ["sh", "bash"]


def refused(tmp_path: Path, shell: str, simulated: str) -> list[str]:
    """The packages the guard names as it refuses (it must refuse: exit 1)."""
    result = run_guard(tmp_path, shell, simulated)
    assert result.returncode == 1, result.stderr
    return result.stderr.split("would install driver packages: ")[1].split("; refusing")[0].split()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_clean_toolkit_install_passes(tmp_path, shell):
    result = run_guard(tmp_path, shell, CLEAN_TOOLKIT)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    argv = (tmp_path / "argv").read_text().split()
    assert argv == ["-s", "install", "--no-install-recommends", "cuda-toolkit-12-8=12.8.1-1"]


@pytest.mark.parametrize("shell", SHELLS)
def test_cuda_12_8_alone_is_refused(tmp_path, shell):
    """The `\\d` bug: `grep -E` has no \\d, so `cuda-12-8` slipped through."""
    assert refused(tmp_path, shell, CUDA_12_8_DRIVER_PRESENT) == ["cuda-12-8"]


@pytest.mark.parametrize("shell", SHELLS)
def test_cuda_drivers_and_the_driver_it_pulls_are_refused(tmp_path, shell):
    assert refused(tmp_path, shell, CUDA_DRIVERS) == [
        "libcuda1",
        "nvidia-driver-cuda",
        "nvidia-kernel-dkms",
        "cuda-drivers",
    ]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_driver_library_alone_is_refused(tmp_path, shell):
    assert refused(tmp_path, shell, LIBCUDA_ONLY) == ["libcuda1"]


@pytest.mark.parametrize("shell", SHELLS)
def test_apt_failing_stops_the_guard_with_its_message(tmp_path, shell):
    result = run_guard(tmp_path, shell, UNKNOWN_PACKAGE, rc=100)
    assert result.returncode == 1
    assert "E: Unable to locate package nosuch" in result.stderr


def test_the_pattern_is_posix_ere():
    """What `grep -E` would misread: Perl classes and escapes."""
    pattern = cuda_stage.DRIVER_PACKAGE.pattern
    for perl in ("\\d", "\\w", "\\s", "(?", "\\b"):
        assert perl not in pattern, perl
    for name in ("cuda-12-8", "cuda-13-0", "cuda", "cuda-drivers-570", "libcuda1"):
        assert cuda_stage.DRIVER_PACKAGE.match(name), name
    for name in ("cuda-toolkit-12-8", "cuda-nvcc-12-8", "cuda-cudart-12-8"):
        assert not cuda_stage.DRIVER_PACKAGE.match(name), name
