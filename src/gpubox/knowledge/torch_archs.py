"""What the torch inside an image can run on: the GPU architectures it is compiled for, as
``torch._C._cuda_getArchFlags()`` prints them, judged against a GPU's compute capability.
Pure: the vLLM stage runs TORCH_ARCH_COMMAND in the pulled image (no GPU needed) and
``gpubox check`` judges the catalog's record of the pinned image (gpubox.knowledge.vllm_rules)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpubox.base import compat

# What the image's torch is compiled for, as torch._C._cuda_getArchFlags() prints it: one
# word per -gencode target, "sm_XY" (a binary for compute capability X.Y) or "compute_XY"
# (PTX for X.Y, which the driver compiles just in time for the GPU at hand). torch's own
# torch.cuda.get_arch_list() is the same words, but [] while CUDA is not initialised.
TORCH_ARCH_COMMAND = (
    "import torch; print(torch.__version__, torch.version.cuda, torch._C._cuda_getArchFlags())"
)
_ARCH = re.compile(r"(?P<kind>sm|compute)_(?P<major>\d+)(?P<minor>\d)(?P<suffix>[af]?)")


def runs_on(arch: str, cc: tuple[int, int]) -> bool:
    """Whether a compiled target runs on a GPU of compute capability ``cc``. A binary
    (sm_XY) runs on X.Y and the later GPUs of the same major only (sm_70 on 7.0 and 7.5, never
    on 8.0; sm_75 not on 7.0). PTX (compute_XY) is compiled by the driver for any GPU of X.Y
    or later, so compute_70 or older PTX serves a 7.0 GPU (slowly at first: the driver
    compiles every kernel once). The "a" targets (sm_90a) run on exactly X.Y; the "f" ones
    (sm_100f) on X.Y and later GPUs of the same major."""
    m = _ARCH.fullmatch(arch)
    if not m:
        return False
    target = (int(m["major"]), int(m["minor"]))
    if m["suffix"] == "a":
        return target == cc
    if m["kind"] == "sm" or m["suffix"] == "f":
        return target[0] == cc[0] and target[1] <= cc[1]
    return target <= cc


@dataclass(frozen=True)
class TorchBuild:
    version: str
    cuda: str | None  # None: not a CUDA build
    archs: tuple[str, ...]

    def runs_on(self, cc: tuple[int, int]) -> bool:
        return self.cuda is not None and any(runs_on(a, cc) for a in self.archs)

    def text(self) -> str:
        cuda = f"CUDA {self.cuda}" if self.cuda else "no CUDA"
        return f"torch {self.version} ({cuda}) built for {' '.join(self.archs) or 'nothing'}"


def torch_build(line: str) -> TorchBuild:
    """TORCH_ARCH_COMMAND's line ("2.10.0+cu129 12.9 sm_70 ... compute_120"); ValueError when
    the text is not that line."""
    words = line.split()
    if len(words) < 2 or not words[0][:1].isdigit():
        raise ValueError(f"not torch's version, CUDA and architectures: {line.strip()!r}")
    cuda = None if words[1] == "None" else words[1]
    archs = tuple(w for w in words[2:] if w != "None")
    return TorchBuild(words[0], cuda, archs)


def cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def image_arch_problem(image: str, line: str, gpu: compat.GpuModel) -> str | None:
    """Why the image cannot run on the GPU, from TORCH_ARCH_COMMAND's output; None if it can."""
    cc = gpu.compute_capability
    try:
        build = torch_build(line)
    except ValueError as e:
        return f"cannot read the torch of {image}: {e}"
    if build.runs_on(cc):
        return None
    return (
        f"{image} cannot run on {gpu.name} (compute capability {cc_text(cc)}): its "
        f"{build.text()} has no sm_{cc[0]}{cc[1]} binary (sm_{cc[0]}x up to x = {cc[1]}) and no "
        f"PTX of compute_{cc[0]}{cc[1]} or older to compile; the image says: {line.strip()}. "
        "Use an image whose torch carries it (vllm/vllm-openai:v0.19.1 for Volta)"
    )
