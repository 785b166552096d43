"""The errors a deploy refuses with, in a leaf module (nothing from gpubox is imported here), so
the preflight, the dpkg wait and the stages all raise the same type without importing each
other."""

from __future__ import annotations

from pyinfra.api.exceptions import PyinfraError

__all__ = ["DeployRefused", "HostRefused"]


class DeployRefused(PyinfraError):
    """Raised before any operation is added: the inventory or the host is not fit."""


class HostRefused(DeployRefused):
    """One host of several refused: it is marked failed and the others go on. Every deploy
    file runs its stages through gpubox.stages.run_stages, which catches it."""
