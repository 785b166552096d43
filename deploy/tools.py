"""One stage alone: pyinfra INVENTORY deploy/tools.py"""

from gpubox.stages.tools import tools

tools()
