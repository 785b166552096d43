"""One stage alone: pyinfra INVENTORY deploy/container_toolkit.py"""

from gpubox.stages import run_stages
from gpubox.stages.container_toolkit import container_toolkit

run_stages(container_toolkit)
