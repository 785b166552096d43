"""One stage alone: pyinfra INVENTORY deploy/monitoring.py"""

from gpubox.stages import run_stages
from gpubox.stages.monitoring import monitoring

run_stages(monitoring)
