"""`gpubox deploy ... --data KEY=VALUE` (issue 30 B): the validation sees the data pyinfra
will see. Each value is read by pyinfra's own parser, set over every host's own data and its
groups', and a bad one is refused before any host is probed or pyinfra runs, naming the key
and the --data that set it. `gpubox check` takes the same options and says the same."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpubox import cli
from gpubox.commands import deploying
from gpubox.remote import inventory, reach

ROOT = Path(__file__).resolve().parents[2]
LAB = str(ROOT / "inventories" / "lab.py")
FULL = str(ROOT / "src" / "gpubox" / "deploy" / "full.py")


class Recorder:
    """subprocess.run (pyinfra) and reach.probe (SSH) stand-ins that record their calls."""

    def __init__(self) -> None:
        self.pyinfra: list[list[str]] = []
        self.probed: list[tuple[str, dict[str, Any]]] = []

    def run(self, argv: list[str], env: dict[str, str], check: bool) -> Any:
        self.pyinfra.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    def probe(self, name: str, data: dict[str, Any]) -> str | None:
        self.probed.append((name, data))
        return None


@pytest.fixture
def box(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(deploying.subprocess, "run", recorder.run)
    monkeypatch.setattr(reach, "probe", recorder.probe)
    return recorder


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name  # a new name per inventory: pyinfra caches a file's code by its name
    path.write_text(text)
    return str(path)


PAIRS = [
    "model_ctx=4096",
    "a=true",
    "b=FALSE",
    "c=4.5",
    'd="570"',
    "e=[1, 2]",
    'f={"x": 1}',
    "g=text",
    "h=",
    "i=x=y",
    "j=null",
    "model_ctx=65536",  # a key given twice: the last wins
]


def test_the_values_are_pyinfras_own():
    # imported here, not at the module's top: importing pyinfra_cli monkey-patches the whole
    # test process with gevent, and test_bench's timings then skip (see test_bench.py)
    from pyinfra_cli.cli import _set_override_data

    found = inventory.data_overrides(PAIRS)
    # pyinfra's CLI itself (pyinfra_cli/cli.py) makes its --data into this dict
    assert found == _set_override_data(PAIRS, None, None, None, None, None)
    assert found["model_ctx"] == 65536 and type(found["model_ctx"]) is int
    assert found["a"] is True and found["b"] is False and found["c"] == 4.5
    assert found["d"] == "570" and found["e"] == [1, 2] and found["f"] == {"x": 1}
    assert found["g"] == "text" and found["h"] == "" and found["i"] == "x=y"
    assert found["j"] is None
    assert inventory.data_overrides(["model_ctx=4096"]) == {"model_ctx": 4096}
    with pytest.raises(ValueError, match="--data model_ctx: not KEY=VALUE"):
        inventory.data_overrides(["model_ctx"])


def test_data_is_over_every_hosts_own_and_its_groups():
    plain = dict(inventory.load(LAB))
    assert plain["gpu2"]["gpu_count"] == 1 and plain["gpu1"]["gpu_count"] == 2
    data = dict(inventory.load(LAB, {"gpu_count": 4, "backend": "vllm"}))
    assert {name: d["gpu_count"] for name, d in data.items()} == {"gpu1": 4, "gpu2": 4, "gpu3": 4}
    assert {d["backend"] for d in data.values()} == {"vllm"}  # gpu2's own "none" too
    assert data["gpu3"]["api_port"] == 8081  # what --data does not name stays


def test_a_bad_override_is_refused_naming_its_key_before_any_host_is_contacted(capsys, box):
    argv = ["deploy", LAB, "-y", "--data", "driver_branch=999"]
    assert cli.main(argv) == reach.BAD_INPUT
    out, err = capsys.readouterr()
    for host in ("gpu1", "gpu2", "gpu3"):
        assert (f"error: {host}: driver_branch: no catalog entry for branch '999'; known: ") in out
    assert all(line.endswith("(from --data driver_branch=999)") for line in out.splitlines())
    assert err.strip().endswith(f"in {LAB} --data driver_branch=999; no host was contacted")
    assert box.probed == [] and box.pyinfra == []  # no SSH, nothing run


def test_an_override_fixes_an_invalid_value_and_reaches_pyinfra(tmp_path, capsys, box):
    bad = write(
        tmp_path,
        "two.py",
        "hosts = [('a', {'ssh_hostname': '192.0.2.1', 'gpu_count': 'two'})]\n",
    )
    assert cli.main(["deploy", bad, "-y"]) == reach.BAD_INPUT
    assert "error: a: gpu_count: must be int, got str 'two'\n" in capsys.readouterr().out
    assert box.pyinfra == []
    assert cli.main(["deploy", bad, "-y", "--data", "gpu_count=2"]) == reach.OK
    ((name, data),) = box.probed
    assert (name, data["gpu_count"]) == ("a", 2)  # the probe sees pyinfra's data too
    assert box.pyinfra == [
        [deploying.pyinfra_executable(), "-y", "--data", "gpu_count=2", bad, FULL]
    ]


def test_a_value_is_typed_as_pyinfra_types_it(tmp_path, capsys, box):
    lab = write(tmp_path, "one.py", "hosts = [('a', {'ssh_hostname': '192.0.2.1'})]\n")
    # digits are an int for pyinfra, so model_ctx takes them
    assert cli.main(["deploy", lab, "-y", "--data", "model_ctx=65536"]) == reach.OK
    assert len(box.pyinfra) == 1
    # quoted, JSON's string: pyinfra passes the text, which model_ctx refuses
    assert cli.main(["deploy", lab, "-y", "--data", 'model_ctx="65536"']) == reach.BAD_INPUT
    assert capsys.readouterr().out.splitlines()[-1] == (
        "error: a: model_ctx: must be int, got str '65536' (from --data model_ctx=\"65536\")"
    )
    # a key of pyinfra's own is pyinfra's: passed, not judged
    assert cli.main(["deploy", lab, "-y", "--data", "ssh_port=2222"]) == reach.OK
    assert box.probed[-1][1]["ssh_port"] == 2222
    assert len(box.pyinfra) == 2


def test_a_data_without_a_value_is_one_line_and_nothing_runs(capsys, box):
    assert cli.main(["deploy", LAB, "--data", "driver_branch"]) == reach.BAD_INPUT
    assert capsys.readouterr().err == "gpubox deploy: --data driver_branch: not KEY=VALUE\n"
    assert cli.main(["check", LAB, "--data", "driver_branch"]) == reach.BAD_INPUT
    assert capsys.readouterr().err == "gpubox check: --data driver_branch: not KEY=VALUE\n"
    assert box.probed == [] and box.pyinfra == []


def test_group_data_files_are_validated_and_passed(tmp_path, capsys, box):
    lab = write(tmp_path, "grouped.py", "hosts = [('a', {'ssh_hostname': '192.0.2.1'})]\n")
    extra = tmp_path / "more"
    extra.mkdir()
    (extra / "all.py").write_text("gpu_count = 'two'\n")
    assert cli.main(["deploy", lab, "-y", "--group-data", str(extra)]) == reach.BAD_INPUT
    assert "error: a: gpu_count: must be int, got str 'two'\n" in capsys.readouterr().out
    assert box.pyinfra == []
    good = tmp_path / "good"  # a new file: pyinfra caches a file's code by its name
    good.mkdir()
    (good / "all.py").write_text("gpu_count = 2\n")
    argv = ["deploy", lab, "-y", "--group-data", str(good), "--data", "gpu_count=4"]
    assert cli.main(argv) == reach.OK
    assert box.probed[-1][1]["gpu_count"] == 4  # --data over the group's
    assert box.pyinfra[-1][2:6] == ["--data", "gpu_count=4", "--group-data", str(good)]


def test_check_sees_what_deploy_sees(capsys):
    assert cli.main(["check", LAB, "--data", "driver_branch=580"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{LAB} --data driver_branch=580: 3 host(s) valid"
    )
    assert cli.main(["check", LAB, "--data", "nvlink=yes"]) == reach.BAD_INPUT
    out = capsys.readouterr().out
    assert "error: gpu1: nvlink: must be bool, got str 'yes' (from --data nvlink=yes)" in out


def test_the_deploy_command_line_validates_data_in_a_real_process(tmp_path):
    """The installed command's path end to end (a child Python, no stand-in): refused."""
    gpubox = [sys.executable, "-c", "import sys; from gpubox.cli import main; sys.exit(main())"]
    proc = subprocess.run(
        [*gpubox, "deploy", LAB, "-y", "--data", "driver_branch=999"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == reach.BAD_INPUT, proc.stderr
    assert "gpu1: driver_branch: no catalog entry for branch '999'" in proc.stdout
    assert "no host was contacted" in proc.stderr


def free_port() -> int:
    """A loopback port nothing listens on (connecting is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_verify_judges_the_hosts_with_the_same_data(tmp_path, capsys, monkeypatch, box):
    import pytest as pytest_module

    ran: list[list[str]] = []
    monkeypatch.setattr(pytest_module, "main", lambda argv: ran.append(argv) or 0)
    assert cli.main(["verify", LAB, "--data", "driver_branch=999"]) == reach.BAD_INPUT
    out, err = capsys.readouterr()
    assert "error: gpu2: driver_branch: no catalog entry for branch '999'" in out
    assert "(from --data driver_branch=999)" in out and "no host was contacted" in err
    assert box.probed == [] and ran == []
    assert cli.main(["verify", LAB, "--data", "gpu_count=4", "-m", "quick"]) == reach.OK
    assert {data["gpu_count"] for _, data in box.probed} == {4}
    ((argv),) = ran
    assert argv[argv.index("--data") + 1] == "gpu_count=4"  # to the plugin's hosts too


def test_the_host_checks_plugin_reads_the_hosts_with_data(tmp_path):
    """`pytest tests/host --inventory INVENTORY --data KEY=VALUE`: the plugin's hosts carry
    the value (here the SSH port it connects to), and a --data without "=" is a usage error."""
    own, given = free_port(), free_port()
    while given == own:
        given = free_port()
    path = write(
        tmp_path,
        "ported.py",
        f"hosts = [('one', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {own}}})]\n",
    )
    pytest_host = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/host"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def run(*more: str) -> subprocess.CompletedProcess[str]:
        argv = [*pytest_host, "--inventory", path, "-m", "quick", *more]
        return subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
        )

    done = run("--data", f"ssh_port={given}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"one: unreachable: connection refused by 127.0.0.1:{given} " in done.stdout
    assert f"127.0.0.1:{own}" not in done.stdout
    done = run("--data", "ssh_port")
    assert done.returncode == 4 and "--data ssh_port: not KEY=VALUE" in done.stderr


def test_doctor_judges_the_hosts_with_the_same_data(capsys, monkeypatch):
    from gpubox.doctor import cli as doctor

    probed: list[str] = []
    monkeypatch.setattr(reach, "probe_all", lambda hosts: probed.extend(n for n, _ in hosts))
    assert doctor.main([LAB, "--data", "driver_branch=999"]) == reach.BAD_INPUT
    assert "driver_branch: no catalog entry for branch '999'" in capsys.readouterr().err
    assert doctor.main([LAB, "--data", "driver_branch"]) == reach.BAD_INPUT
    assert capsys.readouterr().err == "gpubox doctor: --data driver_branch: not KEY=VALUE\n"
    assert probed == []
