"""One stage alone: pyinfra INVENTORY deploy/panel.py"""

from gpubox.stages import run_stages
from gpubox.stages.panel import panel

run_stages(panel)
