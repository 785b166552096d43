"""Layer 4, pure rules: decisions from a host's configuration and facts; no I/O.

- ``apt_sources``: a catalog repository's source line and its placeholders;
- ``offers``: the repositories' query (its command and parser), the pinned sets, what they miss;
- ``outdated``: each pin's line and what its repository offers newer in it (gpubox outdated);
- ``nccl``: which boxes get NCCL and its pin;
- ``desktop``: what a desktop is and what the deploy tells its owner;
- ``driver_lifecycle``: a host's driver lifecycle note (its branch's end of life, where to move);
- ``driver_rollback``: did a driver move hold (the driver state before and after, compared).
- ``canary``: the canaries of `gpubox deploy --canary`, their short bench and its verdict.
"""
