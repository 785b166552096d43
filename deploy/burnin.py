"""One stage alone: pyinfra INVENTORY deploy/burnin.py"""

from gpubox.stages import run_stages
from gpubox.stages.burnin import burnin

run_stages(burnin)
