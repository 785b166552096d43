"""What more than one test file uses: the reference box's host data, a real capture's columns,
a model plan for the tiny test model, the sandbox's Hub served in this process, and a venv with
the real huggingface_hub.

Importable as ``helpers`` from every tier (tests/conftest.py puts tests/ on sys.path)."""

from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpubox.sandbox import hub
from gpubox.stages import model as model_stage

# The reference box: two V100s joined by NVLink, the 570 driver, CUDA 12.8.
REFERENCE = {
    "gpu_model": "Tesla V100-SXM2-32GB",
    "gpu_count": 2,
    "nvlink": True,
    "driver_branch": "570",
    "cuda_version": "12.8",
}

# The columns of tests/fixtures/nvidia-smi/query-gpu_csv-noheader_8xV100-SXM2-32GB_580.173.02.txt
V100_QUERY = [
    "index",
    "name",
    "memory.total",
    "compute_cap",
    "driver_version",
    "pci.bus_id",
    "pcie.link.gen.max",
    "pcie.link.gen.current",
    "pcie.link.width.max",
    "pcie.link.width.current",
    "power.limit",
    "persistence_mode",
    "ecc.mode.current",
]


def model_plan(directory: Path, **fields: Any) -> model_stage.ModelPlan:
    """The model stage's plan of tiny.gguf into ``directory``: from hf's gpubox/tiny-GGUF, with
    no URL, sha256 or size, but for what ``fields`` say."""
    values: dict[str, Any] = {
        "source": "hf",
        "repo": "gpubox/tiny-GGUF",
        "file": "tiny.gguf",
        "url": None,
        "sha256": None,
        "size": None,
        "directory": str(directory),
    }
    return model_stage.ModelPlan(**{**values, **fields})


@contextmanager
def serving(
    handler: type[Any], serve: Callable[..., int] = hub.serve, **extra: Any
) -> Iterator[int]:
    """``handler`` (gpubox.sandbox.hub.handler_class; or another sandbox server's, with its
    ``serve`` and that function's ``extra`` arguments) served on a free loopback port by a
    thread of this process: yields the port. Stopped when the block ends (and in any case
    within 60 s); the thread must be gone 5 s later."""
    stop = threading.Event()
    deadline = time.monotonic() + 60
    port: list[int] = []
    thread = threading.Thread(
        target=serve,
        args=(handler, "127.0.0.1", 0),
        kwargs={
            **extra,
            "should_stop": lambda: stop.is_set() or time.monotonic() > deadline,
            "ready": port.append,
        },
        daemon=True,
    )
    thread.start()
    while not port and thread.is_alive():
        time.sleep(0.01)
    try:
        yield port[0]
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


def bench_level(n: int, tps: float, ttft: float, tpot: float | None, failed: int = 0) -> dict:
    """One concurrency level of a bench report, with fixed figures (8 requests)."""
    return {
        "max_concurrency": n,
        "output_throughput": tps,
        "median_ttft_ms": ttft,
        "median_tpot_ms": tpot,
        "completed": 8 - failed,
        "failed": failed,
    }


_HF_VENV: list[Path] = []


def hf_venv() -> Path:
    """A venv with the catalog's huggingface_hub (the real ``hf`` and HfApi), from the wheels
    the sandbox's PyPI mirror serves (cached under the gpubox cache dir; pip downloads them
    from PyPI the first time). Built once per test process, removed when it exits."""
    if _HF_VENV:
        return _HF_VENV[0]
    from gpubox import catalog
    from gpubox.sandbox import pypi
    from gpubox.sandbox.common import cache_dir

    requirement = catalog.load()["hf"]["hub_requirement"]
    wheels = pypi.ensure_wheels(cache_dir() / "pypi", [requirement], lambda message: None)
    scratch = Path(tempfile.mkdtemp(prefix="gpubox-hf-venv-"))
    atexit.register(shutil.rmtree, scratch, True)
    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "--no-index",
         "--find-links", str(wheels), requirement],
        check=True,
        timeout=300,
    )  # fmt: skip
    _HF_VENV.append(venv)
    return venv
