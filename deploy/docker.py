"""One stage alone: pyinfra INVENTORY deploy/docker.py"""

from gpubox.stages.docker import docker

docker()
