"""One stage alone: pyinfra INVENTORY deploy/model.py"""

from gpubox.stages.model import model

model()
