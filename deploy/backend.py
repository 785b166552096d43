"""One stage alone: pyinfra INVENTORY deploy/backend.py"""

from gpubox.stages.backend import backend

backend()
