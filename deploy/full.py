"""Converge a box: pyinfra INVENTORY deploy/full.py (safe to re-run), from a checkout.

The deploy itself ships inside the package (src/gpubox/deploy/full.py, what `gpubox deploy`
runs); this file runs it, so the two are one deploy."""

import runpy

from gpubox.commands import deploying

runpy.run_path(str(deploying.DEPLOY_DIR / "full.py"))
