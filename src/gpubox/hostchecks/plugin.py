"""The host checks' pytest plugin: `pytest tests/host --inventory INVENTORY` or
`gpubox verify INVENTORY`.

Every host of the inventory is checked against its own configuration (the same validated
config the deploy uses), over SSH with testinfra's paramiko backend, by the checks of
gpubox.checks: the same checks doctor renders. One test per host and check, its id
``HOST:CHECK`` (``sandbox:driver.held``), marked quick, gpu, slow or burn as the check is.

Each host is probed first (``gpubox.remote.reach.probe``, every host at once, within the SSH
timeout). A host that cannot be reached gets one test, ``HOST:unreachable``, that fails with
``HOST: unreachable: WHY`` whatever ``-m`` or ``-k`` select, and no check is judged on it.
``--collect-only`` probes nothing (every check is listed)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import testinfra

from gpubox import checks
from gpubox.commands.deploying import probe_all
from gpubox.config import HostConfig, load_host_config
from gpubox.remote import inventory, reach

MARKERS = {
    "quick": "fast host checks (a few seconds per host)",
    "gpu": "host checks that ask the GPUs themselves (nvidia-smi)",
    "slow": "host checks that take long",
    "burn": "host checks that load the GPUs (opt in with --burn)",
}
UNREACHABLE = "unreachable"

# Set by `gpubox verify`: hosts it has probed already ({name: why or None}); those it found
# unreachable it reported itself, and they are left out of the run.
PROBED: dict[str, str | None] = {}
REPORTED: set[str] = set()

_probed = pytest.StashKey[dict[str, str | None]]()
_held = pytest.StashKey[list[pytest.Item]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--inventory",
        action="store",
        default=None,
        help="pyinfra inventory file whose hosts are checked",
    )
    parser.addoption(
        "--data",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="pyinfra's --data: a host data value over every host's own, as a deploy given it",
    )
    parser.addoption(
        "--group-data",
        action="append",
        default=[],
        metavar="PATH",
        help="pyinfra's --group-data: more group data files or directories",
    )
    parser.addoption(
        "--limit",
        action="append",
        default=[],
        metavar="NAME",
        help="only these hosts, by name (comma separated or repeated; fnmatch patterns)",
    )
    parser.addoption(
        "--burn",
        action="store_true",
        default=False,
        help="also run the checks that load the GPUs (marked burn)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if config.getoption("--inventory"):
        _hosts(config)  # an inventory that cannot be read is a usage error, before collecting
    if not config.pluginmanager.has_plugin("gpubox-hostchecks-put-back"):
        config.pluginmanager.register(_PutBack(), "gpubox-hostchecks-put-back")


def _hosts(config: pytest.Config) -> list[tuple[str, dict[str, Any]]]:
    path = config.getoption("--inventory")
    if not path:
        raise pytest.UsageError("the host checks need --inventory INVENTORY (a pyinfra inventory)")
    try:
        overrides = inventory.data_overrides(config.getoption("--data") or [])
        hosts = inventory.load(path, overrides, config.getoption("--group-data") or [])
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    except inventory.InventoryError as exc:
        raise pytest.UsageError(f"cannot read {path}: {exc}") from None
    hosts, unmatched = limited(hosts, config.getoption("--limit") or [])
    if unmatched:
        raise pytest.UsageError(f"--limit {', '.join(unmatched)} names no host")
    return [h for h in hosts if h[0] not in REPORTED]


def limited(
    hosts: list[tuple[str, dict[str, Any]]], limits: list[str]
) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The hosts ``limits`` name (fnmatch patterns, comma separated; all hosts when none),
    and the patterns that name no host."""
    patterns = [p for limit in limits for p in limit.split(",") if p]
    if not patterns:
        return hosts, []
    unmatched = [p for p in patterns if not any(fnmatch.fnmatch(n, p) for n, _ in hosts)]
    return [h for h in hosts if any(fnmatch.fnmatch(h[0], p) for p in patterns)], unmatched


def unreachable(config: pytest.Config) -> dict[str, str]:
    """{host: why} for each host that cannot be reached (probed once per session; nothing
    is probed for --collect-only)."""
    if _probed not in config.stash:
        if config.option.collectonly:
            config.stash[_probed] = {}
        else:
            hosts = _hosts(config)
            todo = [h for h in hosts if h[0] not in PROBED]
            found = {**{n: PROBED[n] for n, _ in hosts if n in PROBED}, **probe_all(todo)}
            config.stash[_probed] = found
    return {n: why for n, why in config.stash[_probed].items() if why is not None}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per host and check, named ``HOST:CHECK`` and carrying the check's marker; one
    test ``HOST:unreachable`` for a host that cannot be reached."""
    if {"box", "check"} <= set(metafunc.fixturenames):
        down = unreachable(metafunc.config)
        params = []
        for name, _ in _hosts(metafunc.config):
            if name in down:
                params.append(pytest.param(name, None, id=f"{name}:{UNREACHABLE}"))
                continue
            params.extend(
                pytest.param(
                    name,
                    check,
                    id=f"{name}:{check.id}",
                    marks=[getattr(pytest.mark, check.marker)] if check.marker else [],
                )
                for check in checks.ALL
            )
        metafunc.parametrize(("box", "check"), params, indirect=["box"], scope="session")


def _is_unreachable_item(item: pytest.Item) -> bool:
    return item.name.endswith(f":{UNREACHABLE}]")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Set an unreachable host's one test aside before -m and -k select (it is put back
    after them), and mark the burn checks skipped unless --burn."""
    config.stash[_held] = [item for item in items if _is_unreachable_item(item)]
    items[:] = [item for item in items if not _is_unreachable_item(item)]
    if config.getoption("--burn"):
        return
    opt_in = pytest.mark.skip(reason="loads the GPUs: opt in with --burn")
    for item in items:
        if "burn" in item.keywords:
            item.add_marker(opt_in)


class _PutBack:
    """After -m and -k have selected: an unreachable host's test first, whatever they chose."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        held: list[pytest.Item] = config.stash.get(_held, [])
        items[:0] = held


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


@pytest.fixture(scope="session")
def _ssh_config(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    path = tmp_path_factory.mktemp("ssh") / "config"
    path.write_text("".join(inventory.ssh_config_entry(n, d) for n, d in _hosts(request.config)))
    return path


_boxes: dict[str, Box] = {}


@pytest.fixture(scope="session")
def box(request: pytest.FixtureRequest, _ssh_config: Path) -> Box | str:
    """The host's Box, or for an unreachable host the line that says so."""
    name = request.param
    down = unreachable(request.config)
    if name in down:
        return reach.unreachable_line(name, down[name])
    if name not in _boxes:
        data = dict(_hosts(request.config))[name]
        config = load_host_config(name, data)
        host = testinfra.get_host(
            f"paramiko://{name}", ssh_config=str(_ssh_config), sudo=inventory.uses_sudo(data)
        )
        _boxes[name] = Box(name, config, host, request.config.getoption("--inventory"))
    return _boxes[name]
