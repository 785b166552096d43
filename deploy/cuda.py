"""One stage alone: pyinfra INVENTORY deploy/cuda.py"""

from gpubox.stages import run_stages
from gpubox.stages.cuda import cuda

run_stages(cuda)
