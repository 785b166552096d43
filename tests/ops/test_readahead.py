"""The read-ahead (gpubox.infra.readahead): a run keeps the fact commands it ran; the next run runs
them in one round trip and answers reads of them until something is changed on the box. On
this machine, through pyinfra's @local connector, with read-only commands."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import spy_commands
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import MaskString, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.connectors.local import LocalConnector
from pyinfra.context import ctx_host, ctx_inventory, ctx_state

from gpubox.infra import readahead
from gpubox.infra.host_facts import (
    CommandOutput,
    KernelModuleLoaded,
    OsRelease,
    UserId,
    prefetch,
    read_once,
)

READS = [
    (OsRelease, {}),
    (UserId, {}),
    (KernelModuleLoaded, {"module": "gpubox-no-such-module"}),
    (CommandOutput, {"command": "printf 'a  b\\n\\nc'"}),
]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("GPUBOX_READAHEAD", "1")
    commands = spy_commands(monkeypatch, LocalConnector)
    readahead.install()
    try:
        yield commands
    finally:
        readahead.uninstall()


@contextmanager
def run() -> Iterator[object]:
    """One pyinfra run on @local (a new state, as a new `pyinfra` command has)."""
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    (local,) = list(inventory)
    with ctx_state.use(state), ctx_inventory.use(inventory), ctx_host.use(local):
        yield local


def read_all(host: object) -> list[object]:
    return [host.get_fact(cls, **kwargs) for cls, kwargs in READS]  # type: ignore[attr-defined]


def test_the_next_run_reads_the_last_runs_facts_in_one_round_trip(sent, tmp_path):
    with run() as host:
        assert readahead.fill() == 0  # no earlier run: nothing to read ahead
        first = read_all(host)
        assert len(sent) == len(READS)
    readahead.save_all()
    kept = readahead.cache_file("@local")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert len(json.loads(kept.read_text())["commands"]) == len(READS)

    sent.clear()
    with run() as host:
        assert readahead.fill() == len(READS)
        assert len(sent) == 1 and readahead.MARK in sent[0]
        again = read_all(host)
        assert len(sent) == 1  # every read answered from the one round trip
        assert readahead.report(host)["served"] == len(READS)
    assert again == first
    assert again[3] == "a  b\n\nc"


def test_a_command_that_is_not_a_fact_read_ends_the_answers(sent):
    with run() as host:
        read_all(host)
    readahead.save_all()
    sent.clear()
    with run() as host:
        readahead.fill()
        host.get_fact(OsRelease)
        assert len(sent) == 1
        host.run_shell_command("true")  # what an operation does: the box may have changed
        host.get_fact(OsRelease)
        assert len(sent) == 3  # read on the box again
        assert readahead.report(host)["ended_by"] == "true"


def test_a_command_that_failed_in_the_read_ahead_is_read_alone(sent):
    failing = (CommandOutput, {"command": "exit 3", "_ignore_errors": True})
    with run() as host:
        host.get_fact(failing[0], **failing[1])
        host.get_fact(OsRelease)
    readahead.save_all()
    sent.clear()
    with run() as host:
        assert readahead.fill() == 1
        host.get_fact(OsRelease)
        assert len(sent) == 1
        host.get_fact(failing[0], **failing[1])
        assert len(sent) == 2 and sent[1].startswith("exit 3")


def test_prefetch_and_read_once_use_the_read_ahead_and_do_not_end_it(sent):
    with run() as host:
        read_all(host)
    readahead.save_all()
    sent.clear()
    with run() as host:
        readahead.fill()
        prefetch(*READS)  # everything it asks is held: no round trip of its own
        assert [read_once(cls, **kwargs) for cls, kwargs in READS] == read_all(host)
        assert len(sent) == 1
        assert readahead.report(host)["ended_by"] == ""


@pytest.mark.parametrize("text", ["{not json", '{"format": 99, "commands": []}', "[]"])
def test_an_unreadable_list_reads_nothing_ahead(sent, tmp_path, text):
    kept = readahead.cache_file("@local")
    kept.parent.mkdir(parents=True)
    kept.write_text(text)
    with run():
        assert readahead.fill() == 0
    assert sent == []


def test_off_with_gpubox_readahead_0(sent, monkeypatch):
    readahead.uninstall()
    monkeypatch.setenv("GPUBOX_READAHEAD", "0")
    readahead.install()
    with run() as host:
        read_all(host)
        assert readahead.report(host) == {}
    readahead.save_all()
    assert not readahead.cache_dir().exists()


def test_a_command_with_a_secret_or_a_password_is_neither_kept_nor_answered():
    secret = StringCommand("curl", "-H", MaskString("Authorization: Bearer hunter2"), "x")
    assert readahead._raw(secret) is None
    assert readahead._raw(StringCommand("cat", "/etc/os-release")) == "cat /etc/os-release"
    assert readahead._executor({"_sudo": True, "_use_sudo_password": "hunter2"}) is None
    assert readahead._executor({"_env": {"TOKEN": "x"}}) is None
    assert readahead._executor({"_sudo": True, "_timeout": 30, "print_output": False}) == {
        "_sudo": True
    }


def test_a_fact_that_asks_a_server_or_costs_much_is_never_read_ahead(sent):
    from pyinfra.facts.server import Users

    from gpubox.infra.host_facts import NetworkOutput
    from gpubox.preflight.answers import RepoOffers

    asks = (NetworkOutput, {"command": "echo from-the-hub"})
    with run() as host:
        host.get_fact(asks[0], **asks[1])
        host.get_fact(OsRelease)
    readahead.save_all()
    kept = json.loads(readahead.cache_file("@local").read_text())["commands"]
    assert len(kept) == 1 and "os-release" in kept[0]["command"]
    sent.clear()
    with run() as host:
        assert readahead.fill() == 1
        host.get_fact(asks[0], **asks[1])  # read on the box, and the answers go on
        host.get_fact(OsRelease)
        assert len(sent) == 2 and "from-the-hub" in sent[1]
        assert readahead.report(host)["ended_by"] == ""
    assert not readahead.ahead(RepoOffers) and not readahead.ahead(Users)
    assert readahead.ahead(OsRelease)
