"""Several sandbox boxes (gpubox sandbox up --boxes N): each box's identity, how a fleet run
reaches it (an ssh ProxyCommand through its network namespace), and the inventory that lists
them. The boxes themselves boot in tests/integration/test_fleet.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubox.remote import inventory
from gpubox.sandbox import box, box_ssh, identity, processes


@pytest.fixture(autouse=True)
def back_to_box_one():
    yield
    identity.use_box(1)


def test_each_box_has_its_own_name_namespace_port_and_state_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "sandbox"))
    seen = []
    for k in range(1, identity.MAX_BOXES + 1):
        identity.use_box(k)
        now = identity.current()
        seen.append((now.name, str(now.netns_path), now.ssh_port, identity.state_dir()))
    assert seen[0] == ("gpubox-sandbox", "/run/netns/gpubox-sandbox", 2222, tmp_path / "sandbox")
    assert seen[2] == (
        "gpubox-sandbox-3",
        "/run/netns/gpubox-sandbox-3",
        2224,
        tmp_path / "sandbox-3",
    )
    for i in range(4):  # nothing shared between two boxes
        assert len({row[i] for row in seen}) == identity.MAX_BOXES
    assert identity.state_dir(2) == tmp_path / "sandbox-2"


@pytest.mark.parametrize("k", [0, 5])
def test_a_box_outside_the_range_is_refused(k):
    with pytest.raises(identity.SandboxError, match="boxes 1 to 4"):
        identity.use_box(k)


def test_children_work_on_the_same_box():
    identity.use_box(3)
    assert processes.child_env(identity.current())[identity.BOX_ENV] == "3"


def test_ssh_enters_the_namespace_of_the_box_it_is_given():
    info = {"ssh_config": "/s/ssh_config", "netns": "gpubox-sandbox-2"}
    info["ssh_host_alias"] = "gpubox-sandbox-2"
    argv = box_ssh.ssh_argv(info, ["true"])
    assert argv[:4] == ["ip", "netns", "exec", "gpubox-sandbox-2"]
    assert argv[-3:] == ["gpubox-sandbox-2", "--", "true"]


def test_a_fleet_run_reaches_box_k_through_its_namespace(tmp_path: Path):
    identity.use_box(2)
    key = tmp_path / "id_ed25519"
    config = box_ssh.write_ssh_config(tmp_path, key, identity.current())
    data = {
        "ssh_hostname": "gpubox-sandbox-2.fleet",
        "ssh_config_file": str(config),
        "ssh_port": 2223,
        "ssh_user": "root",
    }
    entry = inventory.ssh_config_entry("gpubox-sandbox-2", data)
    assert "Host gpubox-sandbox-2\n" in entry and "  HostName 127.0.0.1\n" in entry
    assert "  ProxyCommand ip netns exec gpubox-sandbox-2 socat STDIO TCP:127.0.0.1:2223\n" in entry
    assert "  Port 2223\n" in entry


def test_a_host_without_an_ssh_config_file_has_no_proxy():
    entry = inventory.ssh_config_entry("a", {"ssh_hostname": "192.0.2.1"})
    assert "ProxyCommand" not in entry and "HostName 192.0.2.1" in entry


@pytest.mark.parametrize("count", [0, 5])
def test_up_refuses_a_box_count_outside_the_range(count):
    with pytest.raises(box.SandboxError, match="1 to 4 boxes"):
        box.up_boxes(count)
