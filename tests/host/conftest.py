"""The product's verification suite from a checkout: `pytest tests/host --inventory INVENTORY`.

The hooks and fixtures ship in the package (gpubox.hostchecks.plugin, what `gpubox verify`
runs); this conftest takes them from there, so the two are one suite."""

from gpubox.hostchecks.plugin import (  # noqa: F401 (pytest finds hooks and fixtures by name)
    _ssh_config,
    box,
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_generate_tests,
)
