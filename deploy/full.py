"""Converge a box: pyinfra INVENTORY deploy/full.py (safe to re-run).

The inventory is validated first (every host, every problem at once), then each stage
preflights its host; a refused run changes nothing."""

from gpubox.stages import current_config
from gpubox.stages.cuda import cuda
from gpubox.stages.driver import driver

current_config()
driver()
cuda()
