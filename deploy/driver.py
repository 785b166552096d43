"""One stage alone: pyinfra INVENTORY deploy/driver.py"""

from gpubox.stages import run_stages
from gpubox.stages.driver import driver

run_stages(driver)
