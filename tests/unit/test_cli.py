"""gpubox check: validates an inventory offline, every problem at once, exit 0 or 2."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    # the check ends with one line per host
    tail = out.splitlines()[-3:]
    assert [line.split()[0] for line in tail] == ["a", "b", "c"]
    assert all("error(s)" in line for line in tail), tail


def test_the_check_ends_with_a_line_per_host(tmp_path, capsys):
    inventory = tmp_path / "lab.py"
    inventory.write_text(
        "hosts = [\n"
        "  ('gpu1', {'ssh_hostname': '192.0.2.1'}),\n"
        "  ('gpu2-long-name', {'ssh_hostname': '192.0.2.2', 'gpu_count': 0}),\n"
        "]\n"
    )
    assert main(["check", str(inventory)]) == 2
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    # gpu1's default pin, R570, is past its end of life: a note, not an error (issue 30 A)
    assert lines[-2:] == ["gpu1            valid, 1 note", "gpu2-long-name  1 error(s)"]
    assert "1 problem(s) on 1 of 2 host(s)" in captured.err


def test_missing_inventory_file(tmp_path, capsys):
    path = tmp_path / "nope.py"
    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().err == f"gpubox check: cannot read {path}: no such file\n"


def test_out_of_range_numbers_fail_the_check(tmp_path, capsys):
    inventory = tmp_path / "ranges.py"
    inventory.write_text(
        "hosts = [('a', {'ssh_hostname': '192.0.2.1', 'api_port': 70000,\n"
        "                'model_parallel': 0, 'reboot_timeout': 0, 'gpu_count': 0})]\n"
    )
    assert main(["check", str(inventory)]) == 2
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("error: ")] == [
        "error: a: api_port: must be 1 to 65535, got 70000",
        "error: a: model_parallel: must be at least 1, got 0",
        "error: a: reboot_timeout: must be at least 1, got 0",
        "error: a: gpu_count: must be at least 1, got 0",
    ]


BROKEN_INVENTORIES = [
    ("hosts = ['a']\nraise RuntimeError('boom')\n", "RuntimeError: boom (line 2)"),
    ("hosts = [undefined_name]\n", "NameError: name 'undefined_name' is not defined (line 1)"),
    ("hosts = [\n", "SyntaxError: '[' was never closed ("),
    ("import sys\nsys.exit(3)\n", "SystemExit: 3 (line 2)"),
]


def _broken_inventory(tmp_path, body):
    path = tmp_path / "broken.py"
    path.write_text(body)
    return path


@pytest.mark.parametrize(("body", "expected"), BROKEN_INVENTORIES)
@pytest.mark.parametrize("command", ["check", "burnin", "doctor"])
def test_an_inventory_that_raises_is_one_line(
    tmp_path, capsys, monkeypatch, command, body, expected
):
    """Names the file and the exception; exit 2; no traceback (pyinfra's wrapper of the
    file's exception cannot even be printed: str() of it raised AttributeError)."""
    monkeypatch.setattr("os.execv", _no_exec)
    path = _broken_inventory(tmp_path, body)
    assert main([command, str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"gpubox {command}: cannot read {path}: {expected}")


def test_bench_names_the_inventory_and_its_exception(tmp_path, capsys):
    path = _broken_inventory(tmp_path, BROKEN_INVENTORIES[0][0])
    assert main(["bench", "--inventory", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"gpubox bench: cannot read {path}: ")
    assert line.endswith("RuntimeError: boom (line 2)")


def _no_exec(*argv):
    raise AssertionError(f"pyinfra was started: {argv}")


def test_burnin_checks_the_inventory_and_seconds_before_pyinfra(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.execv", _no_exec)
    inventory = tmp_path / "inv.py"
    inventory.write_text("hosts = [('a', {'ssh_hostname': '192.0.2.1', 'burnin_dcgm_level': 5})]\n")
    assert main(["burnin", str(inventory)]) == 2
    assert (
        "error: a: burnin_dcgm_level: must be one of 1, 2, 3, 4, got 5" in capsys.readouterr().out
    )
    inventory = tmp_path / "good.py"  # (pyinfra caches a file's code by its name)
    inventory.write_text("hosts = [('a', {'ssh_hostname': '192.0.2.1'})]\n")
    assert main(["burnin", str(inventory), "--seconds", "0"]) == 2
    assert capsys.readouterr().out == (
        "error: a: burnin_seconds: must be at least 1, got 0 (from --seconds 0)\n"
    )


def test_burnin_runs_pyinfra_on_a_valid_inventory(capsys, monkeypatch, tmp_path):
    started = []

    def execv(path, argv):
        started.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr("os.execv", execv)
    inventory = tmp_path / "local.py"  # pyinfra's @local connector: nothing to probe
    inventory.write_text("hosts = [('@local', {})]\n")
    with pytest.raises(SystemExit):
        main(["burnin", str(inventory), "--seconds", "5"])
    (argv,) = started
    assert argv[1:5] == ["-y", "--data", "burnin_seconds=5", str(inventory)]
    assert argv[5].endswith("deploy/burnin.py")
    assert capsys.readouterr().out == ""  # warnings are check's to print, not burnin's


def test_burnin_of_an_unreachable_host_is_one_line_and_exit_3(capsys, monkeypatch):
    monkeypatch.setattr("os.execv", lambda *a: pytest.fail("pyinfra started"))
    inventory = str(ROOT / "inventories/example.py")  # 192.0.2.10: a documentation address
    assert main(["burnin", inventory]) == 3
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("v100box: unreachable: ")


def test_burnin_runs_the_hosts_it_can_reach_and_exits_3(capsys, monkeypatch, tmp_path):
    import subprocess

    ran = []
    monkeypatch.setattr("os.execv", lambda *a: pytest.fail("exec with a host unreachable"))
    monkeypatch.setattr(
        subprocess,
        "run",
        lambda argv, check: ran.append(argv) or subprocess.CompletedProcess(argv, 0),
    )
    inventory = tmp_path / "two.py"
    inventory.write_text(
        "hosts = [('@local', {}), ('lost', {'ssh_hostname': 'gpubox-no-such-host.invalid'})]\n"
    )
    assert main(["burnin", str(inventory)]) == 3
    assert capsys.readouterr().out.startswith("lost: unreachable: DNS: ")
    (argv,) = ran
    assert argv[1:4] == ["-y", "--exclude", "lost"] and argv[4] == str(inventory)


def test_the_lab_inventory_shares_group_data_and_lets_a_host_override_it(capsys):
    from gpubox.remote import inventory

    assert main(["check", str(ROOT / "inventories/lab.py")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("note: ")]
    assert lines[:3] == ["gpu1  valid, 1 note", "gpu2  valid, 1 note", "gpu3  valid, 1 note"]
    data = dict(inventory.load(str(ROOT / "inventories/lab.py")))
    assert {name: (d["gpu_model"], d["gpu_count"], d["nvlink"]) for name, d in data.items()} == {
        "gpu1": ("Tesla V100-SXM2-32GB", 2, True),  # the group's
        "gpu2": ("Tesla T4", 1, False),  # its own, over the group's
        "gpu3": ("Tesla V100-SXM2-32GB", 2, True),
    }
    assert data["gpu2"]["backend"] == "none" and "backend" not in data["gpu1"]
    assert {d["ssh_user"] for d in data.values()} == {"root"}
