"""Test-only stand-in of hf_xet's memory growth (issue 29 B2), never on a box: Python imports
this module at start (``site``) when its directory is on PYTHONPATH, which only
tests/unit/test_vllm_checkpoint_hf.py's cgroup OOM test sets.

Why a stand-in: the sandbox's Hub speaks no Xet (no Xet CAS server, no xorb/reconstruction
API: sandbox/hub.py), so the real ``hf`` downloads from it over plain HTTP whether Xet is on or
off, and its memory never grows. What grows on a real Hub is hf_xet's reconstruction download
buffer (huggingface/xet-core ``xet_runtime/src/config/groups/reconstruction.rs``: base
HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_SIZE, ceiling ..._LIMIT, default 2gb / 8gb; hf_xet's RSS
was measured at about 15 GB uncapped next to a build). Guessed, not recorded: how fast it
grows and that it fills up to its ceiling during one transfer.

What it does, in the real ``hf`` process only (``sys.argv[0]`` ends in ``/hf``) and only while
Xet is on (``HF_HUB_DISABLE_XET`` unset, as hf_xet runs only then): a thread allocates and
touches 16 MiB every 20 ms up to the ceiling ``HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_LIMIT``
gives (gpubox.plans.checkpoint.XET_BOUNDS sets 1gb), then holds it. The real hf runs
meanwhile. Each start appends ``xet on`` or ``xet off`` to $GPUBOX_TEST_XET_LOG.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time

STEP = 16 << 20
UNITS = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}


def ceiling(text: str) -> int:
    """hf_xet's size words ("1gb", "512mb"); its default ceiling (8gb) when unreadable."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?b?)\s*", text.lower())
    return int(m[1]) * UNITS[m[2]] if m and m[2] in UNITS else 8 << 30


def grow(limit: int) -> None:
    held = []
    while len(held) * STEP < limit:
        held.append(bytearray(b"\x01") * STEP)  # written: every page is resident
        time.sleep(0.02)
    while True:
        time.sleep(60)


if sys.argv and sys.argv[0].endswith("/hf"):
    xet_on = not os.environ.get("HF_HUB_DISABLE_XET")
    log = os.environ.get("GPUBOX_TEST_XET_LOG")
    if log:
        with open(log, "a") as f:
            f.write("xet on\n" if xet_on else "xet off\n")
    if xet_on:
        limit = ceiling(os.environ.get("HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_LIMIT", "8gb"))
        threading.Thread(target=grow, args=(limit,), daemon=True).start()
