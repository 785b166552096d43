"""The product's verification suite: `pytest tests/host --inventory INVENTORY`.

Every host of the inventory is checked against its own configuration (the same validated
config the deploy uses), over SSH with testinfra's paramiko backend. Each test takes the
`box` fixture, parametrized by host, so a failure names the host in its id."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import testinfra

from gpubox import inventory, parsers
from gpubox.config import HostConfig, Target, load_host_config, target_for


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
    """One host under test: its name, its config and a testinfra connection."""

    name: str
    config: HostConfig
    host: Any
    _cache: dict[str, Any] = field(default_factory=dict)

    def run(self, command: str) -> Any:
        return self.host.run(command)

    def out(self, command: str) -> str:
        result = self.host.run(command)
        assert result.rc == 0, f"{self.name}: `{command}` failed ({result.rc}): {result.stderr}"
        return result.stdout

    @functools.cached_property
    def target(self) -> Target:
        os_release = parsers.parse_os_release(self.out("cat /etc/os-release"))
        target = target_for(os_release, self.config.catalog)
        assert target is not None, f"{self.name}: unsupported OS {os_release.get('PRETTY_NAME')}"
        return target

    @functools.cached_property
    def driver_packages(self):
        return self.config.driver_packages(self.target.family)

    def assert_service_up(self, unit: str) -> None:
        """The systemd unit is running and enabled."""
        service = self.host.service(unit)
        assert service.is_running and service.is_enabled, (
            f"{self.name}: {unit} running={service.is_running} enabled={service.is_enabled}"
        )

    def assert_pinned_and_held(self, what: str, packages: list[str], version: str) -> None:
        """Every package installed at ``version`` and held (apt-mark hold)."""
        wrong = {
            name: self.dpkg[name].version if name in self.dpkg else "not installed"
            for name in packages
            if name not in self.dpkg or self.dpkg[name].version != version
        }
        assert not wrong, f"{self.name}: {what} not at {version}: {wrong}"
        held = parsers.parse_showhold(self.out("apt-mark showhold"))
        unheld = sorted(set(packages) - held)
        assert not unheld, f"{self.name}: {what} not held: {unheld}"

    @functools.cached_property
    def dpkg(self) -> dict[str, Any]:
        return parsers.parse_dpkg_query(
            self.out("dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'")
        )


def _hosts(config: pytest.Config) -> list[tuple[str, dict[str, Any]]]:
    path = config.getoption("--inventory")
    if not path:
        raise pytest.UsageError("tests/host needs --inventory INVENTORY (a pyinfra inventory)")
    return inventory.load(path)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "box" in metafunc.fixturenames:
        names = [name for name, _ in _hosts(metafunc.config)]
        metafunc.parametrize("box", names, indirect=True, scope="session", ids=names)


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
        _boxes[name] = Box(name, config, host)
    return _boxes[name]
