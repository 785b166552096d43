"""One stage alone: pyinfra INVENTORY deploy/dcgm.py"""

from gpubox.stages.dcgm import dcgm

dcgm()
