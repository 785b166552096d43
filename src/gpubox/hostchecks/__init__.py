"""Layer 11, entry points: the host checks as a pytest suite (gpubox verify).

The host checks as a pytest suite, shipped in the package: ``gpubox verify INVENTORY`` runs
it (``command.py``), and ``pytest tests/host --inventory INVENTORY`` in a checkout runs the
same through a thin conftest. ``plugin.py`` holds the hooks and fixtures, ``run.py`` the
one test."""
