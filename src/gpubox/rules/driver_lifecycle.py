"""A host's driver lifecycle note: its pinned branch, its GPUs' generation and its catalog
(with the host's overrides) given to ``gpubox.knowledge.driver_lifecycle.note``. `gpubox
check` and doctor print it; it is a note, never an error, and no check fails on it."""

from __future__ import annotations

import datetime

from gpubox.config.host import HostConfig
from gpubox.knowledge import driver_lifecycle


def host_note(config: HostConfig, today: datetime.date) -> driver_lifecycle.Note | None:
    """The note for ``config``'s pinned branch on ``today``, for its gpu_model's generation."""
    return driver_lifecycle.note(
        config.driver_branch,
        today,
        [config.gpu.architecture],
        config.catalog["driver"]["branches"],
    )
