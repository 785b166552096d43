"""One stage alone: pyinfra INVENTORY deploy/container_toolkit.py"""

from gpubox.stages.container_toolkit import container_toolkit

container_toolkit()
