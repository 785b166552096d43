"""One stage alone: pyinfra INVENTORY deploy/grafana.py"""

from gpubox.stages import run_stages
from gpubox.stages.grafana import grafana

run_stages(grafana)
