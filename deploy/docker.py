"""One stage alone: pyinfra INVENTORY deploy/docker.py"""

from gpubox.stages import run_stages
from gpubox.stages.docker import docker

run_stages(docker)
