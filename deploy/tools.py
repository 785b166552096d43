"""One stage alone: pyinfra INVENTORY deploy/tools.py"""

from gpubox.stages import run_stages
from gpubox.stages.tools import tools

run_stages(tools)
