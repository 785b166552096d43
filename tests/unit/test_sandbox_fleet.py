"""The sandbox's pieces for watching its boxes as a fleet (issue 31 E), without a sandbox: the
bridges' ports, the monitoring inventory built on inventories/sandbox.py, the model volume's
fill, and the frozen-server fault's freezer (gpubox.sandbox.fleet, freeze_server)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

import gpubox.sandbox
from gpubox.sandbox import faults, fleet, freeze_server
from gpubox.sandbox.common import SandboxError
from gpubox.sandbox.identity import Box
from gpubox.sandbox.supervisor import nspawn_argv

ROOT = Path(__file__).resolve().parents[2]
MONITORING_INVENTORY = ROOT / "inventories" / "sandbox_monitoring.py"


def test_box_ks_exporters_are_ten_ports_up_per_box_in_box_1s_namespace():
    assert [fleet.fleet_port(9100, k) for k in (1, 2, 3, 4)] == [9100, 9110, 9120, 9130]
    assert fleet.monitoring_targets(2) == {
        "node": "127.0.0.1:9110",
        "dcgm": "127.0.0.1:9410",
        "backend": "127.0.0.1:9411",
    }
    assert fleet.monitoring_targets(3, backend=False) == {
        "node": "127.0.0.1:9120",
        "dcgm": "127.0.0.1:9420",
    }
    # no two bridges of any boxes listen on the same port of box 1's namespace
    ports = [fleet.fleet_port(p, k) for k in (2, 3, 4) for p in fleet.EXPORTER_PORTS.values()]
    ports += [Box.of(k).ssh_port for k in (1, 2, 3, 4)] + [9090, 9093, 9100, 9400, 9401]
    assert len(ports) == len(set(ports))


def test_every_bridge_of_box_k_is_recorded_and_stopped_by_down():
    assert fleet.bridge_names(1) == [] and fleet.process_names(1) == []
    names = fleet.process_names(3)
    assert {"ssh_bridge_box", "ssh_bridge_fleet"} <= set(names)
    assert {f"bridge_fleet_{p}" for p in (9100, 9400, 9401)} <= set(names)
    assert fleet.socket_names(2) == ["ssh.sock", "bridge-9100.sock", "bridge-9400.sock",
                                     "bridge-9401.sock"]  # fmt: skip
    box_py = (ROOT / "src" / "gpubox" / "sandbox" / "box.py").read_text()
    assert "*fleet.process_names(box.number)" in box_py  # what _down stops


def test_box_1_cannot_be_cut():
    with pytest.raises(SandboxError, match="box 1 is the fleet's own namespace"):
        fleet.cut(1)


def test_box_3_boots_with_its_model_volume_bound_at_model_dir(tmp_path: Path):
    argv = nspawn_argv(Box.of(3), tmp_path / "rootfs", tmp_path / "ccache", "/v/model-volume")
    assert "--bind=/v/model-volume:/srv/models" in argv
    assert not any("/srv/models" in a for a in nspawn_argv(Box.of(1), tmp_path, tmp_path))
    assert fleet.MODEL_VOLUMES == {3: 64}


def test_fill_takes_a_volume_over_90_percent_and_empty_takes_it_back(tmp_path: Path):
    """On any directory (the box's is a tmpfs of 64 MiB): filled to 95 % of its filesystem."""
    volume = tmp_path / "volume"
    volume.mkdir()
    info = {"name": "gpubox-sandbox-3", "model_volume": {"host_dir": str(volume)}}
    stat = os.statvfs(volume)
    free = stat.f_bavail * stat.f_frsize
    size = stat.f_blocks * stat.f_frsize
    if size * 0.95 - (size - free) > 2**30:
        pytest.skip("the test directory's filesystem is too large to fill here")
    got = fleet.fill_model_volume(info)
    assert got["used"] / got["size"] > 0.9
    assert (volume / fleet.FILL_FILE).exists()
    fleet.empty_model_volume(info)
    assert not (volume / fleet.FILL_FILE).exists()
    with pytest.raises(SandboxError, match="has no model volume"):
        fleet.fill_model_volume({"name": "gpubox-sandbox"})


def test_fill_reaches_95_percent_of_a_small_filesystem(tmp_path: Path, monkeypatch):
    """The arithmetic, against a filesystem of 64 MiB with 1 MiB used (statvfs faked)."""
    mib, blocks = 2**20, 64 * 256
    used = {"bytes": 1 * mib}

    class Stat:
        f_frsize = 4096
        f_blocks = blocks

        @property
        def f_bavail(self) -> int:
            return (blocks * 4096 - used["bytes"]) // 4096

    written: list[int] = []

    def fallocate(fd: int, offset: int, length: int) -> None:
        written.append(length)
        used["bytes"] += length

    monkeypatch.setattr(fleet.os, "statvfs", lambda path: Stat())
    monkeypatch.setattr(fleet.os, "posix_fallocate", fallocate)
    info = {"name": "b", "model_volume": {"host_dir": str(tmp_path)}}
    got = fleet.fill_model_volume(info)
    assert written == [int(64 * mib * 0.95) - mib]
    assert got["size"] == 64 * mib and 0.949 < got["used"] / got["size"] < 0.951


def test_the_freezer_freezes_each_new_start_once_it_answers_healthy():
    signals: list[tuple[int, int]] = []
    pids = iter([0, 100, 100, 100, 200, 200, 200])
    health = iter([False, True, True, False, True])

    def read_pid(unit: str) -> int:
        assert unit == "gpubox-llama-server"
        return next(pids)

    def is_healthy(base: str) -> bool:
        assert base == "http://127.0.0.1:8080"
        return next(health)

    frozen = 0
    for _ in range(7):
        frozen = freeze_server.step(
            "gpubox-llama-server",
            "http://127.0.0.1:8080",
            frozen,
            read_pid=read_pid,
            is_healthy=is_healthy,
            kill=lambda pid, sig: signals.append((pid, sig)),
        )
    # pid 0: not running; pid 100 not healthy yet, then healthy: frozen; frozen again
    # never; pid 200 (the watchdog's restart) unhealthy, then healthy: frozen
    assert signals == [(100, signal.SIGSTOP), (200, signal.SIGSTOP)]
    assert frozen == 200


def test_the_fleet_faults_are_known_and_each_has_an_off_switch():
    for name in ("server-frozen", "volume-full", "unreachable"):
        assert name in faults.FAULTS and name in faults.OFF
    assert {"gpu-missing", "nvlink-down"} <= set(faults.OFF)
    with pytest.raises(SandboxError, match="has no --off"):
        faults.clear_fault("desktop", info={"rootfs": "/nonexistent", "box": 1, "name": "x"})


# --- the monitoring inventory (loaded by pyinfra, the boxes' box.json faked)


def fake_info(k: int) -> dict[str, Any]:
    from test_sandbox_inventory_reuse import fake_info as reuse_fake_info

    info = reuse_fake_info(k)
    info["name"] = "gpubox-sandbox" if k == 1 else f"gpubox-sandbox-{k}"
    return info


def test_the_monitoring_inventory_makes_box_1_the_monitor_of_every_box(monkeypatch):
    from gpubox.remote import inventory

    infos = [fake_info(1), fake_info(2), fake_info(3)]
    monkeypatch.setattr(gpubox.sandbox, "box_info", lambda: infos[0])
    monkeypatch.setattr(gpubox.sandbox, "box_infos", lambda: infos)
    loaded = dict(inventory.load(str(MONITORING_INVENTORY)))
    plain = dict(inventory.load(str(ROOT / "inventories" / "sandbox.py")))
    assert list(loaded) == list(plain) == ["gpubox-sandbox", "gpubox-sandbox-2", "gpubox-sandbox-3"]
    box1, box2, box3 = loaded.values()
    assert box1["monitoring"] == "prometheus" and "monitoring_targets" not in box1
    assert "monitoring" not in box2 and "monitoring" not in box3
    assert all(
        d["dcgm_exporter"] is True and d["monitoring_interval"] == 3 for d in (box1, box2, box3)
    )
    assert box2["monitoring_targets"] == {"node": "127.0.0.1:9110", "dcgm": "127.0.0.1:9410"}
    assert box3["monitoring_targets"] == fleet.monitoring_targets(3)
    assert box3["watchdog_interval_s"] == 2 and box3["watchdog_failures"] == 2
    for name, data in loaded.items():  # the rest is inventories/sandbox.py's, unchanged
        added = set(data) - set(plain[name])
        assert added <= {"monitoring", "monitoring_targets", *MONITORING_KEYS}
        assert {k: v for k, v in data.items() if k not in added and k != "dcgm_exporter"} == {
            k: v for k, v in plain[name].items() if k != "dcgm_exporter"
        }


MONITORING_KEYS = {
    "dcgm_exporter",
    "monitoring_interval",
    "watchdog_interval_s",
    "watchdog_timeout_s",
    "watchdog_failures",
    "watchdog_grace_s",
    "watchdog_completion_every_s",
}


def test_the_cli_takes_one_fault_back_with_off_and_refuses_it_for_others(capsys):
    from gpubox.sandbox import cli

    assert cli.main(["fault", "desktop", "--off"]) == 1
    assert "fault desktop has no --off: take it back with clear" in capsys.readouterr().err
