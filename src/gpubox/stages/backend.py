"""Stage: the OpenAI-compatible API: llama.cpp built on the box for its GPUs (the default on
Volta; gpubox.stages.llamacpp) or vLLM in Docker (gpubox.stages.vllm), serving the configured
model with an API key, or none. Switching the backend stops and disables the other one."""

from __future__ import annotations

from pyinfra.api import deploy

from gpubox.base import layout
from gpubox.ops.serving import stop_other
from gpubox.stages import current_config
from gpubox.stages.llamacpp import llamacpp
from gpubox.stages.model import model as model_stage
from gpubox.stages.vllm import vllm


@deploy("Backend")
def backend() -> None:
    config = current_config()
    for name, unit in layout.BACKEND_UNITS.items():
        if name != config.backend:
            stop_other(unit)
    if config.backend == "llamacpp":
        # the GGUF downloads in the background (started by the first stage): llama.cpp builds
        # meanwhile, and the model stage waits for the file only where the server needs it
        llamacpp(config, model_stage)
    elif config.backend == "vllm":
        vllm(config, model_stage())
