"""One stage alone: pyinfra INVENTORY deploy/backend.py"""

from gpubox.stages import run_stages
from gpubox.stages.backend import backend

run_stages(backend)
