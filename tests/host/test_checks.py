"""Each check of gpubox.checks on each host of the inventory (gpubox.hostchecks.run)."""

from gpubox.hostchecks.run import test_check  # noqa: F401 (pytest collects it from here)
