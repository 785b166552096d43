"""The product's verification suite: `pytest tests/host --inventory INVENTORY`.

Every host of the inventory is checked against its own configuration (the same validated
config the deploy uses), over SSH with testinfra's paramiko backend, by the checks of
gpubox.checks: the same checks doctor renders. One test per host and check, its id
``HOST:CHECK`` (``sandbox:driver.held``), marked quick, gpu, slow or burn as the check is."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import testinfra

from gpubox import checks, inventory
from gpubox.config import HostConfig, load_host_config


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--inventory",
        action="store",
        default=None,
        help="pyinfra inventory file whose hosts are checked",
    )
    parser.addoption(
        "--burn",
        action="store_true",
        default=False,
        help="also run the checks that load the GPUs (marked burn)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--burn"):
        return
    opt_in = pytest.mark.skip(reason="loads the GPUs: opt in with --burn")
    for item in items:
        if "burn" in item.keywords:
            item.add_marker(opt_in)


@dataclass
class Box:
    """One host under test: its name, its config, a testinfra connection, and its facts (each
    command run once, on first use, shared by every check of the host)."""

    name: str
    config: HostConfig
    host: Any
    inventory: str
    facts: checks.Facts = field(init=False)

    def __post_init__(self) -> None:
        self.facts = checks.Facts(self.run, self.config)

    def run(self, command: str) -> checks.Output:
        result = self.host.run(command)
        return checks.Output(result.rc, result.stdout, result.stderr, command)


def _hosts(config: pytest.Config) -> list[tuple[str, dict[str, Any]]]:
    path = config.getoption("--inventory")
    if not path:
        raise pytest.UsageError("tests/host needs --inventory INVENTORY (a pyinfra inventory)")
    return inventory.load(path)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per host and check, named ``HOST:CHECK`` and carrying the check's marker."""
    if {"box", "check"} <= set(metafunc.fixturenames):
        params = [
            pytest.param(
                name,
                check,
                id=f"{name}:{check.id}",
                marks=[getattr(pytest.mark, check.marker)] if check.marker else [],
            )
            for name, _ in _hosts(metafunc.config)
            for check in checks.ALL
        ]
        metafunc.parametrize(("box", "check"), params, indirect=["box"], scope="session")


@pytest.fixture(scope="session")
def _ssh_config(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    path = tmp_path_factory.mktemp("ssh") / "config"
    path.write_text("".join(inventory.ssh_config_entry(n, d) for n, d in _hosts(request.config)))
    return path


_boxes: dict[str, Box] = {}


@pytest.fixture(scope="session")
def box(request: pytest.FixtureRequest, _ssh_config: Path) -> Box:
    name = request.param
    if name not in _boxes:
        data = dict(_hosts(request.config))[name]
        config = load_host_config(name, data)
        host = testinfra.get_host(
            f"paramiko://{name}", ssh_config=str(_ssh_config), sudo=inventory.uses_sudo(data)
        )
        _boxes[name] = Box(name, config, host, request.config.getoption("--inventory"))
    return _boxes[name]
