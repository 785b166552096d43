"""One stage alone: pyinfra INVENTORY deploy/burnin.py"""

from gpubox.stages.burnin import burnin

burnin()
