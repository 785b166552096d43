"""One stage alone: pyinfra INVENTORY deploy/cuda.py"""

from gpubox.stages.cuda import cuda

cuda()
