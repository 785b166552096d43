"""Layer 11, entry points: gpubox deploy, demo, nvlink and outdated, one module each.

- ``deploying``: ``gpubox deploy`` (validate, probe each host, then pyinfra);
- ``canary``: ``gpubox deploy --canary N`` (canaries first, judged, then the rest);
- ``demo``: ``make demo`` (the whole thing on a local sandbox box);
- ``nvlink``: ``gpubox nvlink`` (NVLink traffic between the GPUs);
- ``outdated``: ``gpubox outdated`` (what the repositories offer newer in each pin's line).
"""
