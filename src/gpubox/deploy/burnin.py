"""The burn-in deploy that `gpubox burnin INVENTORY` runs (shipped in the package, so an
installed gpubox has it); deploy/burnin.py in a checkout does the same."""

from gpubox.stages import run_stages
from gpubox.stages.burnin import burnin

run_stages(burnin)
