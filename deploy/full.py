"""Converge a box: pyinfra INVENTORY deploy/full.py (safe to re-run).

The inventory is validated first (every host, every problem at once), then each stage
preflights its host; a refused run changes nothing. Among several hosts, a host refused by its
preflight fails alone and the others converge in the same run. Burn-in: deploy/burnin.py.
The run ends with the quick checks of gpubox.checks (verify_after_deploy, on by default)."""

from gpubox.stages import current_config, run_stages
from gpubox.stages.backend import backend
from gpubox.stages.container_toolkit import container_toolkit
from gpubox.stages.cuda import cuda
from gpubox.stages.dcgm import dcgm
from gpubox.stages.docker import docker
from gpubox.stages.driver import driver
from gpubox.stages.model import model_download
from gpubox.stages.tools import tools
from gpubox.stages.vllm_image import vllm_image_pull
from gpubox.verify import verify

current_config()
run_stages(
    # first: the model's download (the GGUF, or the vLLM checkpoint) starts in the background
    # (a systemd unit, enabled until it is complete, so the driver's reboot does not stop it);
    # the backend waits for it
    model_download,
    driver,
    cuda,
    docker,
    container_toolkit,
    # the vLLM image's pull in the background (after the toolkit's restart of Docker, which
    # would abort it); the vLLM stage waits for it
    vllm_image_pull,
    dcgm,
    tools,
    backend,
    verify,
)
