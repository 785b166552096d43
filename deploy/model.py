"""One stage alone: pyinfra INVENTORY deploy/model.py"""

from gpubox.stages import run_stages
from gpubox.stages.model import model

run_stages(model)
