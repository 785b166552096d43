"""Layer 9, stage operations: the pyinfra helpers the stages share.

The stages' shared pyinfra helpers, one layer below the stages: `packages.py`
(`install_pinned`), `units.py` (`restart_on_change`), `apt_repo.py` (third-party repositories
and their keys), `serving.py` (the API key, `/health`, a backend's unit)."""
