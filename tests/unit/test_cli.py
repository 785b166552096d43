"""gpubox check: validates an inventory offline, every problem at once, exit 0 or 2."""

from __future__ import annotations

from pathlib import Path

from gpubox.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_example_inventory_is_valid(capsys):
    assert main(["check", str(ROOT / "inventories/example.py")]) == 0
    assert "1 host(s) valid" in capsys.readouterr().out


def test_every_problem_of_every_host_is_listed(tmp_path, capsys):
    inventory = tmp_path / "bad.py"
    inventory.write_text(
        "hosts = [\n"
        "  ('a', {'ssh_hostname': '192.0.2.1', 'driver_brach': '570', 'gpu_count': 'two'}),\n"
        "  ('b', {'ssh_hostname': '192.0.2.2', 'driver_kernel_modules': 'open',\n"
        "         'cuda_version': '13.0', 'driver_branch': '580'}),\n"
        "  ('c', {'ssh_hostname': '192.0.2.3', 'gpu_model': 'GeForce 256'}),\n"
        "]\n"
    )
    assert main(["check", str(inventory)]) == 2
    out = capsys.readouterr().out
    assert "error: a: driver_brach: unknown key; did you mean 'driver_branch'?" in out
    assert "error: a: gpu_count: must be int, got str 'two'" in out
    assert "error: b: driver_kernel_modules: open kernel modules do not work" in out
    assert "error: b: cuda_version: CUDA 13.0 cannot build for Tesla V100-SXM2-32GB" in out
    assert "error: c: gpu_model: unknown GPU model 'GeForce 256'; known models: " in out


def test_missing_inventory_file(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope.py")]) == 2
    assert "no inventory file" in capsys.readouterr().err
