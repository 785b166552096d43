"""One stage alone: pyinfra INVENTORY deploy/watchdog.py"""

from gpubox.stages import run_stages
from gpubox.stages.watchdog import watchdog

run_stages(watchdog)
