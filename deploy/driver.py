"""One stage alone: pyinfra INVENTORY deploy/driver.py"""

from gpubox.stages.driver import driver

driver()
