"""Converge a box: `gpubox deploy INVENTORY` runs this file (shipped in the package, so an
installed gpubox has it); `pyinfra INVENTORY deploy/full.py` in a checkout runs the same.

The inventory is validated first (every host, every problem at once), then each stage
preflights its host; a refused run changes nothing. Among several hosts, a host refused by its
preflight fails alone and the others converge in the same run. Burn-in: deploy/burnin.py.
The run ends with the quick checks of gpubox.checks (verify_after_deploy, on by default).
The stages' order is gpubox.commands.deploying.FULL_STAGES; $GPUBOX_STAGES (gpubox deploy --stage)
runs some of them."""

from gpubox.commands.deploying import chosen
from gpubox.stages import current_config, run_stages
from gpubox.stages.backend import backend
from gpubox.stages.container_toolkit import container_toolkit
from gpubox.stages.cuda import cuda
from gpubox.stages.dcgm import dcgm
from gpubox.stages.docker import docker
from gpubox.stages.driver import driver
from gpubox.stages.grafana import grafana
from gpubox.stages.model import model_download
from gpubox.stages.monitoring import monitoring
from gpubox.stages.panel import panel
from gpubox.stages.tools import tools
from gpubox.stages.verify import verify
from gpubox.stages.vllm_image import vllm_image_pull
from gpubox.stages.watchdog import watchdog

STAGES = {
    getattr(stage, "__name__", ""): stage
    for stage in (
        model_download,
        driver,
        cuda,
        docker,
        container_toolkit,
        vllm_image_pull,
        dcgm,
        tools,
        backend,
        watchdog,
        monitoring,
        grafana,
        panel,
        verify,
    )
}

current_config()
run_stages(*chosen(STAGES))
