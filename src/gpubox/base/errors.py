"""The errors a deploy refuses or stops with, in a leaf module (nothing from gpubox is imported
here). Everything that raises or catches them imports them from here: the configuration check
(gpubox.stages.current_config), the preflight (gpubox.preflight.gate), the dpkg wait
(gpubox.preflight.dpkg_ready), the stages and the tests; no other module re-exports them."""

from __future__ import annotations

from pyinfra.api.exceptions import PyinfraError

__all__ = ["DeployRefused", "HostRefused", "HostStopped"]


class DeployRefused(PyinfraError):
    """Raised before any operation is added: the inventory or the host is not fit."""


class HostRefused(DeployRefused):
    """One host of several refused: it is marked failed and the others go on. Every deploy
    file runs its stages through gpubox.stages.run_stages, which catches it."""


class HostStopped(PyinfraError):
    """The host's deploy ends here by design, not by refusal: the operations already added for
    it still run (e.g. creating the Secure Boot signing key), then an operation that fails
    with the owner's next step (gpubox.infra.operations.fail) stops it. No further stage is planned
    for the host; the other hosts go on. run_stages catches it."""
