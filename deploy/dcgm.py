"""One stage alone: pyinfra INVENTORY deploy/dcgm.py"""

from gpubox.stages import run_stages
from gpubox.stages.dcgm import dcgm

run_stages(dcgm)
