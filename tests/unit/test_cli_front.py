"""The installed command's front door: gpubox deploy, gpubox verify, gpubox keys, --version.

A host that cannot be reached is one line, "NAME: unreachable: WHY", and exit 3
(gpubox.remote.reach);
bad input is exit 2 before any host is contacted."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from gpubox import checks, cli
from gpubox.commands import deploying
from gpubox.hostchecks import command, plugin
from gpubox.remote import reach

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "inventories" / "example.py")
GPUBOX = [sys.executable, "-c", "import sys; from gpubox.cli import main; sys.exit(main())"]


def lab(tmp_path: Path, names: list[str], port: int = 22) -> str:
    path = tmp_path / "lab.py"
    rows = "".join(
        f"  ({n!r}, {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}}}),\n" for n in names
    )
    path.write_text(f"hosts = [\n{rows}]\n")
    return str(path)


def refused_port() -> int:
    """A loopback port nothing listens on (connecting is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NoPyinfra:
    """subprocess.run stand-in that records the command; the test says whether it may run."""

    def __init__(self, rc: int = 0) -> None:
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        self.rc = rc

    def __call__(self, argv: list[str], env: dict[str, str], check: bool) -> Any:
        self.calls.append((argv, env))
        return subprocess.CompletedProcess(argv, self.rc)


@pytest.fixture
def pyinfra(monkeypatch: pytest.MonkeyPatch) -> NoPyinfra:
    run = NoPyinfra()
    monkeypatch.setattr(deploying.subprocess, "run", run)
    return run


def probes(answers: dict[str, str | None], seen: list[str]) -> Any:
    def probe(name: str, data: dict[str, Any]) -> str | None:
        seen.append(name)
        return answers[name]

    return probe


def test_version_is_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpubox {metadata.version('gpubox')}"


def test_the_help_lists_deploy_verify_and_keys(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for name in ("deploy", "verify", "keys", "check", "doctor"):
        assert f"\n    {name} " in out, name
    for argv in (["deploy", "--help"], ["verify", "--help"]):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 0
    assert "--stage NAME" in capsys.readouterr().out


def test_an_unknown_stage_is_bad_input_naming_the_valid_ones(capsys, monkeypatch, pyinfra):
    seen: list[str] = []
    monkeypatch.setattr(reach, "probe", probes({}, seen))
    assert cli.main(["deploy", EXAMPLE, "--stage", "drivr"]) == reach.BAD_INPUT
    err = capsys.readouterr().err
    assert "unknown stage(s) drivr" in err and ", ".join(deploying.FULL_STAGES) in err
    assert seen == [] and pyinfra.calls == []


def test_a_bad_inventory_is_exit_2_and_no_host_is_probed(tmp_path, capsys, monkeypatch, pyinfra):
    seen: list[str] = []
    monkeypatch.setattr(reach, "probe", probes({}, seen))
    bad = tmp_path / "bad.py"
    bad.write_text("hosts = [('a', {'ssh_hostname': '192.0.2.1', 'gpu_count': 'two'})]\n")
    for verb in ("deploy", "verify"):
        assert cli.main([verb, str(bad)]) == reach.BAD_INPUT
        assert "gpu_count" in capsys.readouterr().out
        assert cli.main([verb, str(tmp_path / "missing.py")]) == reach.BAD_INPUT
    assert seen == [] and pyinfra.calls == []


def test_an_unreachable_host_stops_the_deploy_before_pyinfra(
    tmp_path, capsys, monkeypatch, pyinfra
):
    seen: list[str] = []
    answers = {"a": None, "b": "connection refused by 127.0.0.1:22 (is sshd running?)"}
    monkeypatch.setattr(reach, "probe", probes(answers, seen))
    assert cli.main(["deploy", lab(tmp_path, ["a", "b"]), "-y"]) == reach.UNREACHABLE
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "b: unreachable: connection refused by 127.0.0.1:22 (is sshd running?)"
    ]
    assert "nothing was deployed; to deploy the others: --limit a" in err
    assert sorted(seen) == ["a", "b"] and pyinfra.calls == []


def test_a_reachable_inventory_runs_pyinfra_on_the_packaged_deploy(tmp_path, monkeypatch, pyinfra):
    seen: list[str] = []
    monkeypatch.setattr(reach, "probe", probes({"a": None, "b": None}, seen))
    monkeypatch.setenv(deploying.STAGES_ENV, "tools")  # a stale one from the caller's shell
    inventory = lab(tmp_path, ["a", "b"])
    argv = ["deploy", inventory, "--dry", "--limit", "a", "--stage", "cuda", "--stage", "driver"]
    assert cli.main([*argv, "--data", "model_ctx=65536"]) == reach.OK
    assert seen == ["a"]  # only the host the limit selects
    ((command_line, env),) = pyinfra.calls
    assert command_line[0] == str(Path(sys.executable).parent / "pyinfra")
    assert command_line[1:] == [
        "--dry",
        "--limit=a",
        "--data",
        "model_ctx=65536",
        inventory,
        str(ROOT / "src" / "gpubox" / "deploy" / "full.py"),
    ]
    assert env[deploying.STAGES_ENV] == "cuda,driver"
    pyinfra.calls.clear()
    assert cli.main(["deploy", inventory, "-y"]) == reach.OK
    ((command_line, env),) = pyinfra.calls
    assert command_line[1] == "-y" and deploying.STAGES_ENV not in env
    pyinfra.rc = 1
    assert cli.main(["deploy", inventory, "-y"]) == reach.DEVIATES
    pyinfra.rc = 2  # click's usage error: an option pyinfra does not take
    assert cli.main(["deploy", inventory, "--no-such-option"]) == reach.BAD_INPUT


def test_a_limit_naming_no_host_is_a_group_and_every_host_is_probed():
    hosts = [("a", {}), ("b", {}), ("gpu-1", {})]
    assert deploying.targeted(hosts, []) == hosts
    assert deploying.targeted(hosts, ["gpu-*"]) == [("gpu-1", {})]
    assert deploying.targeted(hosts, ["a,b"]) == hosts[:2]
    assert deploying.targeted(hosts, ["lab_group"]) == hosts


def test_the_stages_chosen_keep_the_full_deploys_order():
    stages = {name: name.upper() for name in deploying.FULL_STAGES}
    assert deploying.chosen(stages, {}) == [n.upper() for n in deploying.FULL_STAGES]
    assert deploying.chosen(stages, {deploying.STAGES_ENV: "verify,driver"}) == [
        "DRIVER",
        "VERIFY",
    ]
    with pytest.raises(ValueError, match="unknown stage.*nope.*the stages are: model_download"):
        deploying.chosen(stages, {deploying.STAGES_ENV: "driver,nope"})


def test_the_packaged_deploy_runs_exactly_the_full_stages_and_the_checkout_file_runs_it(
    monkeypatch,
):
    packaged = deploying.DEPLOY_DIR / "full.py"
    tree = ast.parse(packaged.read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpubox.")
        for alias in node.names
    }
    assert set(deploying.FULL_STAGES) <= imported
    (stages,) = [n for n in ast.walk(tree) if isinstance(n, ast.Tuple) and len(n.elts) > 5]
    assert [e.id for e in stages.elts if isinstance(e, ast.Name)] == list(deploying.FULL_STAGES)
    ran: list[str] = []
    monkeypatch.setattr("runpy.run_path", lambda path: ran.append(path))
    checkout = ROOT / "deploy" / "full.py"
    exec(compile(checkout.read_text(), str(checkout), "exec"), {"__name__": "deploy"})
    assert ran == [str(packaged)]


def test_verify_reports_an_unreachable_host_once_and_checks_the_others(
    tmp_path, capsys, monkeypatch
):
    answers = {"a": "timed out after 10 s connecting to 127.0.0.1:22", "b": None}
    seen: list[str] = []
    monkeypatch.setattr(reach, "probe", probes(answers, seen))
    runs: list[tuple[list[str], dict[str, str | None], set[str]]] = []
    pytest_rc = [0]

    def fake_main(argv: list[str]) -> int:
        runs.append((argv, dict(plugin.PROBED), set(plugin.REPORTED)))
        return pytest_rc[0]

    import pytest as pytest_module

    monkeypatch.setattr(pytest_module, "main", fake_main)
    inventory = lab(tmp_path, ["a", "b"])
    for pytest_rc[0], expected in ((0, reach.UNREACHABLE), (1, reach.UNREACHABLE)):
        assert cli.main(["verify", inventory, "-m", "quick", "-k", "driver"]) == expected
    out = capsys.readouterr().out
    assert (
        out.splitlines() == ["a: unreachable: timed out after 10 s connecting to 127.0.0.1:22"] * 2
    )
    argv, probed, reported = runs[0]
    assert argv[0] == str(Path(command.__file__).parent / "run.py")
    assert argv[argv.index("--inventory") + 1] == inventory
    assert argv[argv.index("-m") + 1] == "quick" and argv[argv.index("-k") + 1] == "driver"
    assert probed == answers and reported == {"a"}
    assert not plugin.PROBED and not plugin.REPORTED  # nothing left for a later run
    answers["a"] = None
    for pytest_rc[0], expected in ((0, reach.OK), (1, reach.DEVIATES), (5, reach.BAD_INPUT)):
        assert cli.main(["verify", inventory]) == expected


def test_verify_with_every_host_unreachable_runs_no_check(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(reach, "probe", probes({"a": "DNS: x does not resolve"}, []))
    import pytest as pytest_module

    monkeypatch.setattr(pytest_module, "main", lambda argv: pytest.fail("pytest ran"))
    assert cli.main(["verify", lab(tmp_path, ["a"])]) == reach.UNREACHABLE
    assert capsys.readouterr().out == "a: unreachable: DNS: x does not resolve\n"


def run(argv: list[str], timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    start = time.monotonic()
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    return done, time.monotonic() - start


def test_pytest_tests_host_fails_once_per_unreachable_host_whatever_is_selected(tmp_path):
    inventory = lab(tmp_path, ["one", "two"], port=refused_port())
    for selection in ([], ["-m", "quick"], ["-k", "driver and held"]):
        done, _ = run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/host"]
            + ["--inventory", inventory, *selection]
        )
        out = done.stdout
        assert done.returncode == 1, out
        assert "2 failed" in out and "passed" not in out and "error" not in out, out
        for name in ("one", "two"):
            assert f"test_check[{name}:unreachable]" in out
            assert f"{name}: unreachable: connection refused by 127.0.0.1:" in out
        assert "Traceback" not in out + done.stderr


def test_collect_only_probes_nothing_and_lists_every_check(tmp_path):
    inventory = lab(tmp_path, ["one"], port=refused_port())
    done, _ = run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["tests/host", "--inventory", inventory, "-m", "quick"]
    )
    quick = [c for c in checks.ALL if c.marker == "quick"]
    assert f"{len(quick)}/{len(checks.ALL)} tests collected" in done.stdout, done.stdout
    assert "unreachable" not in done.stdout


def test_gpubox_verify_against_a_refusing_host_is_one_line_and_exit_3(tmp_path):
    inventory = lab(tmp_path, ["one"], port=refused_port())
    done, took = run([*GPUBOX, "verify", inventory])
    assert done.returncode == reach.UNREACHABLE, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"one: unreachable: connection refused by 127.0.0.1:{inventory_port(inventory)} "
        "(is sshd running?)"
    ]
    assert "Traceback" not in done.stderr and took < 60


def inventory_port(path: str) -> int:
    text = Path(path).read_text()
    return int(text.split("'ssh_port': ", 1)[1].split("}", 1)[0])


def test_keys_lists_every_key(capsys):
    from gpubox.config.keys import KEYS

    assert cli.main(["keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [k.name for k in KEYS]
    assert cli.main(["keys", "--markdown"]) == 0
    table = capsys.readouterr().out
    assert (
        "| `gpu_count` | int | `2` | how many GPUs of gpu_model the box has; at least 1 |" in table
    )
    assert 'one of `"refuse"`, `"uninstall"`' in table


def test_pytest_tests_host_with_an_inventory_it_cannot_read_is_one_usage_line(tmp_path):
    done, _ = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/host"]
        + ["--inventory", str(tmp_path / "missing.py")]
    )
    assert done.returncode == 4  # pytest's usage error
    assert f"ERROR: cannot read {tmp_path / 'missing.py'}: no such file" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
