"""`gpubox deploy INVENTORY --canary N` (issue 30 D): the canaries deployed first, their host
checks and their short bench against each one's own baseline, then the rest; a canary that
fails ends the run (exit 1) and the rest is not deployed. pyinfra, `gpubox verify` and the
bench are replaced by recording fakes at deploying.main's seams (``phases``, ``probe``,
``load_group``; pyinfra's subprocess.run where the command line itself is the point)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpubox.bench import canary as canary_bench
from gpubox.bench import records
from gpubox.bench.runner import Settings
from gpubox.commands import canary, deploying
from gpubox.hostchecks import command as verify_command
from gpubox.hostchecks import plugin
from gpubox.remote import reach
from gpubox.rules import canary as rules

HOSTS = ["gpu1", "gpu2", "gpu3", "gpu4"]


def record(tok_s: float, concurrency: int = 1, **extra: Any) -> dict[str, Any]:
    """A record as `gpubox bench` keeps it (records.summary_record's shape)."""
    return {
        "date": "2026-12-01T10:00:00+0000",
        "url": "http://gpu:8080",
        "model": "qwen3-next",
        "levels": [
            {
                "concurrency": concurrency,
                "output_throughput": tok_s,
                "median_ttft_ms": 100.0,
                "median_tpot_ms": 20.0,
                "completed": 8,
                "failed": 0,
            }
        ],
        "failed": 0,
        "settings": {"prompt_tokens": 64, "max_tokens": 32, "ignore_eos": True, "seed": 3},
        **extra,
    }


class Fleet:
    """The inventory, the probe and the canary's phases, each call recorded in order."""

    def __init__(
        self,
        data: dict[str, dict[str, Any]] | None = None,
        group: list[str] | None = None,
        deploy_rc: list[int] | None = None,
        checks_rc: dict[str, int] | None = None,
        measured: dict[str, dict[str, Any]] | None = None,
        baselines: dict[str, dict[str, Any] | None] | None = None,
    ) -> None:
        self.data = data or {name: {"ssh_hostname": f"10.0.0.{i}"} for i, name in enumerate(HOSTS)}
        self.group = group
        self.deploy_rc = list(deploy_rc or [])
        self.checks_rc = checks_rc or {}
        self.measured = measured or {}
        self.baselines = baselines or {}
        self.events: list[tuple[Any, ...]] = []

    # deploying.main's seams
    def load_hosts(self, *args: Any) -> list[tuple[str, dict[str, Any]]]:
        return list(self.data.items())

    def report(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def probe(self, name: str, data: dict[str, Any]) -> str | None:
        self.events.append(("probe", name))
        return None

    def load_group(self, path: str, group: str, group_data: list[str]) -> list[str] | None:
        assert group == "canary"
        return self.group

    def phases(self, deploy: Any, inventory: str, data: list[str], gd: list[str]) -> Any:
        return canary.Phases(self.deploy, self.checks, self.bench, self.record)

    # the phases
    def deploy(self, names: list[str]) -> tuple[int, list[str]]:
        self.events.append(("deploy", *names))
        rc = self.deploy_rc.pop(0) if self.deploy_rc else 0
        return rc, (names[:1] if rc == reach.DEVIATES else [])

    def checks(self, name: str) -> int:
        self.events.append(("checks", name))
        return self.checks_rc.get(name, 0)

    def bench(self, name: str, data: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
        self.events.append(("bench", name, settings["concurrency"], settings["max_tokens"]))
        return self.measured.get(name, {"output_throughput": 100.0})

    def record(self, name: str, data: dict[str, Any]) -> dict[str, Any] | None:
        return self.baselines.get(name, record(100.0))

    def main(self, *argv: str) -> int:
        return deploying.main(
            ["inventory.py", *argv],
            self.load_hosts,
            self.report,
            self.probe,
            phases=self.phases,
            load_group=self.load_group,
        )

    def after_probe(self) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] != "probe"]


def test_the_canary_is_deployed_checked_and_benched_before_the_rest(capsys):
    fleet = Fleet()
    assert fleet.main("--canary", "1", "-y") == 0
    assert [e for e in fleet.events if e[0] == "probe"] == [("probe", n) for n in HOSTS]
    assert fleet.events[: len(HOSTS)] == [("probe", n) for n in HOSTS]  # every host first
    assert fleet.after_probe() == [
        ("deploy", "gpu1"),
        ("checks", "gpu1"),
        ("bench", "gpu1", [1], 32),  # the baseline's concurrency and max tokens
        ("deploy", "gpu2", "gpu3", "gpu4"),
    ]
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "canary: deploying gpu1",
        "canary: checks on gpu1",
        "canary: bench on gpu1: 100.0 tok/s vs baseline 100.0 tok/s (+0.0%, tolerance 10%)",
        "canary: passed; deploying the rest: gpu2, gpu3, gpu4",
    ]


def test_the_group_canary_goes_first_else_the_first_n():
    fleet = Fleet(group=["gpu2", "gpu4"])
    assert fleet.main("--canary", "2") == 0
    assert fleet.after_probe()[0] == ("deploy", "gpu2", "gpu4")
    assert fleet.after_probe()[-1] == ("deploy", "gpu1", "gpu3")
    fleet = Fleet(group=["gpu3", "gpu4"])
    assert fleet.main("--canary", "1") == 0
    assert fleet.after_probe()[0] == ("deploy", "gpu3")
    fleet = Fleet()
    assert fleet.main("--canary", "2") == 0
    assert fleet.after_probe()[0] == ("deploy", "gpu1", "gpu2")
    assert fleet.after_probe()[-1] == ("deploy", "gpu3", "gpu4")


def test_more_canaries_than_the_group_has_is_refused_before_any_host_is_contacted(capsys):
    fleet = Fleet(group=["gpu3"])
    assert fleet.main("--canary", "2") == reach.BAD_INPUT
    assert fleet.events == []
    err = capsys.readouterr().err
    assert "--canary 2: the inventory's group 'canary' has 1 host(s) (gpu3)" in err


def test_every_host_a_canary_leaves_nothing_to_deploy_after(capsys):
    fleet = Fleet()
    assert fleet.main("--canary", "9") == 0
    assert fleet.after_probe()[0] == ("deploy", *HOSTS)
    assert [e for e in fleet.after_probe() if e[0] == "deploy"] == [("deploy", *HOSTS)]
    assert "canary: passed; no host left to deploy" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fleet", "failed"),
    [
        (Fleet(deploy_rc=[reach.DEVIATES]), "gpu1: deploy: failed (exit 1"),
        (Fleet(checks_rc={"gpu1": reach.DEVIATES}), "gpu1: checks: gpubox verify --limit gpu1"),
        (
            Fleet(measured={"gpu1": {"output_throughput": 89.0}}),
            "gpu1: bench: 89.0 tok/s is 11.0% below its baseline 100.0 tok/s "
            "(canary_bench_tolerance 10%)",
        ),
        (Fleet(measured={"gpu1": {"error": "unreachable: refused"}}), "gpu1: bench: unreachable"),
    ],
    ids=["deploy", "checks", "bench-slow", "bench-error"],
)
def test_a_failed_canary_ends_the_run_and_the_rest_is_not_deployed(fleet, failed, capsys):
    assert fleet.main("--canary", "1") == reach.DEVIATES
    deploys = [e for e in fleet.after_probe() if e[0] == "deploy"]
    assert deploys == [("deploy", "gpu1")]
    out = capsys.readouterr().out
    assert f"canary: FAILED on {failed}" in out
    assert "canary: the rest was not deployed: gpu2, gpu3, gpu4" in out
    assert "deploying the rest" not in out


def test_a_failed_deploy_judges_nothing_and_names_the_failed_canary(capsys):
    fleet = Fleet(deploy_rc=[reach.DEVIATES])
    assert fleet.main("--canary", "2") == reach.DEVIATES
    assert fleet.after_probe() == [("deploy", "gpu1", "gpu2")]
    out = capsys.readouterr().out
    assert "FAILED on gpu1: deploy" in out and "FAILED on gpu2" not in out


def test_a_canary_stopped_for_its_owner_exits_4_and_deploys_nothing_more(capsys):
    fleet = Fleet(deploy_rc=[reach.WAITING])
    assert fleet.main("--canary", "1") == reach.WAITING
    assert fleet.after_probe() == [("deploy", "gpu1")]
    assert "canary: the rest was not deployed: gpu2, gpu3, gpu4" in capsys.readouterr().out


def test_the_rests_deploy_gives_the_exit_code():
    fleet = Fleet(deploy_rc=[0, reach.DEVIATES])
    assert fleet.main("--canary", "1") == reach.DEVIATES
    assert [e[0] for e in fleet.after_probe()] == ["deploy", "checks", "bench", "deploy"]


def test_a_hosts_own_tolerance_applies_to_it(capsys):
    data = {n: {"ssh_hostname": n} for n in HOSTS}
    data["gpu1"]["canary_bench_tolerance"] = 25
    fleet = Fleet(data=data, measured={"gpu1": {"output_throughput": 80.0}})
    assert fleet.main("--canary", "1") == 0
    assert "(-20.0%, tolerance 25%)" in capsys.readouterr().out


def test_no_record_skips_the_bench_with_a_note_naming_the_box(capsys):
    fleet = Fleet(baselines={"gpu1": None})
    assert fleet.main("--canary", "1") == 0
    assert [e[0] for e in fleet.after_probe()] == ["deploy", "checks", "deploy"]
    out = capsys.readouterr().out
    assert "canary: no bench on gpu1: no gpubox bench recorded for it on this machine" in out
    assert "gpubox bench --inventory INVENTORY" in out


def test_a_box_that_serves_nothing_is_not_benched(capsys):
    data = {n: {"ssh_hostname": n} for n in HOSTS}
    data["gpu1"]["backend"] = "none"
    fleet = Fleet(data=data)
    assert fleet.main("--canary", "1") == 0
    assert [e[0] for e in fleet.after_probe()] == ["deploy", "checks", "deploy"]
    assert "canary: no bench on gpu1: its backend is none (it serves nothing)" in (
        capsys.readouterr().out
    )


def test_a_baseline_of_another_model_is_not_compared(capsys):
    fleet = Fleet(baselines={"gpu1": record(100.0, model="other")})
    assert fleet.main("--canary", "1") == 0
    assert not [e for e in fleet.events if e[0] == "bench"]
    assert "measured model 'other', it now serves 'qwen3-next'" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--canary", "1", "--limit", "gpu2"], "cannot be combined with --limit"),
        (["--canary", "1", "--dry"], "cannot be combined with --dry"),
    ],
)
def test_canary_with_limit_or_dry_is_refused_before_any_host_is_contacted(argv, says, capsys):
    fleet = Fleet()
    assert fleet.main(*argv) == reach.BAD_INPUT
    assert fleet.events == []
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("count", ["0", "-1", "two"])
def test_a_canary_count_below_one_is_bad_input(count):
    with pytest.raises(SystemExit) as exit_:
        Fleet().main("--canary", count)
    assert exit_.value.code == reach.BAD_INPUT


def test_an_unreachable_host_deploys_nothing_canary_or_not(capsys):
    fleet = Fleet()
    fleet.probe = lambda name, data: "timed out" if name == "gpu3" else None  # type: ignore
    assert fleet.main("--canary", "1") == reach.UNREACHABLE
    assert fleet.events == []


def test_each_phase_is_one_pyinfra_run_limited_to_its_hosts_with_the_same_options(monkeypatch):
    """The real pyinfra command lines (subprocess.run recorded): --limit per host, and the
    --stage, --data and pass-through options in both runs."""
    runs: list[tuple[list[str], str | None]] = []

    def run(argv: list[str], env: dict[str, str], check: bool) -> Any:
        runs.append((argv, env.get(deploying.STAGES_ENV)))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(deploying.subprocess, "run", run)
    fleet = Fleet()

    def phases(deploy: Any, inventory: str, data: list[str], gd: list[str]) -> Any:
        assert (inventory, data, gd) == ("inventory.py", ["driver_branch=580"], [])
        return canary.Phases(deploy, fleet.checks, fleet.bench, fleet.record)

    rc = deploying.main(
        ["inventory.py", "--canary", "1", "--stage", "driver", "--data", "driver_branch=580"]
        + ["--fail-percent", "0"],
        fleet.load_hosts,
        fleet.report,
        fleet.probe,
        phases=phases,
        load_group=fleet.load_group,
    )
    assert rc == 0
    assert [stages for _, stages in runs] == ["driver", "driver"]
    first, second = (argv for argv, _ in runs)
    assert [a for a in first if a.startswith("--limit")] == ["--limit=gpu1"]
    assert [a for a in second if a.startswith("--limit")] == [
        "--limit=gpu2",
        "--limit=gpu3",
        "--limit=gpu4",
    ]
    for argv in (first, second):
        assert argv[argv.index("--data") + 1] == "driver_branch=580"
        assert "--fail-percent" in argv and argv[-2:] == ["inventory.py", argv[-1]]


def test_the_checks_are_gpubox_verify_on_the_one_host_with_the_same_data(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(
        canary.subprocess,
        "run",
        lambda argv, check: calls.append(argv) or subprocess.CompletedProcess(argv, 1),
    )
    phases = canary.real_phases(lambda names: (0, []), "inv.py", ["a=1"], ["gd"])
    assert phases.checks("gpu2") == 1
    assert calls[0][1:] == [
        "-m",
        "gpubox.cli",
        "verify",
        "inv.py",
        "--data",
        "a=1",
        "--group-data",
        "gd",
        "--limit=gpu2",
    ]


def test_verify_limit_checks_only_the_named_hosts():
    hosts = [(n, {}) for n in HOSTS]
    assert plugin.limited(hosts, ["gpu2,gpu4"]) == ([("gpu2", {}), ("gpu4", {})], [])
    assert plugin.limited(hosts, ["gpu*"])[0] == hosts
    assert plugin.limited(hosts, []) == (hosts, [])
    assert plugin.limited(hosts, ["nope"]) == ([], ["nope"])
    args = verify_command.parser().parse_args(["inv.py", "--limit", "gpu2"])
    assert "--limit=gpu2" in verify_command.pytest_argv(args)


def test_verify_limit_naming_no_host_is_bad_input(capsys):
    fleet = Fleet()
    rc = verify_command.main(
        ["inv.py", "--limit", "nope"], fleet.load_hosts, fleet.report, fleet.probe
    )
    assert rc == reach.BAD_INPUT and fleet.events == []
    assert "--limit nope names no host" in capsys.readouterr().err


# the pure rules (gpubox.rules.canary)


def test_the_tolerance_arithmetic():
    assert rules.judge(90.0, 100.0, 10).passed  # exactly at the tolerance
    assert not rules.judge(89.9, 100.0, 10).passed
    assert rules.judge(130.0, 100.0, 0).passed  # faster always passes
    verdict = rules.judge(45.0, 50.0, 5)
    assert (round(verdict.change_pct, 6), verdict.passed) == (-10.0, False)
    assert rules.bench_line("b", verdict) == (
        "canary: bench on b: 45.0 tok/s vs baseline 50.0 tok/s (-10.0%, tolerance 5%)"
    )
    with pytest.raises(ValueError):
        rules.judge(1.0, 0.0, 10)


def test_the_short_bench_repeats_the_baselines_kind_of_measurement():
    base = rules.baseline(
        record(40.0, concurrency=4)
        | {"levels": [record(80.0, 2)["levels"][0], record(40.0, 4)["levels"][0]]}
    )
    assert base is not None and (base.concurrency, base.output_throughput) == (2, 80.0)
    assert rules.short_bench(base) == {
        "concurrency": [2],
        "requests": 4,
        "prompt_tokens": 64,
        "max_tokens": 32,
        "warmup": 1,
        "seed": 3,
        "ignore_eos": True,
    }
    old = {k: v for k, v in record(50.0).items() if k != "settings"}  # before settings were kept
    base = rules.baseline(old)
    assert base is not None and base.assumed
    assert rules.short_bench(base)["max_tokens"] == rules.short_bench(base)["prompt_tokens"] == 256
    assert rules.baseline(None) is None
    assert rules.baseline(record(0.0)) is None  # nothing measured: nothing to compare with


def test_a_record_keeps_the_settings_it_was_measured_with(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path))
    report = {
        "endpoint": {"url": "http://gpu1:8080", "model": "m"},
        "levels": [record(10.0)["levels"][0] | {"max_concurrency": 1}],
    }
    settings = Settings([1], None, 128, 64, 1, 7, False, 60.0)
    records.save_record(records.summary_record(report, settings=settings), "gpu1")
    kept = records.load_record("gpu1")
    assert kept is not None and kept["settings"] == {
        "prompt_tokens": 128,
        "max_tokens": 64,
        "ignore_eos": False,
        "seed": 7,
    }


def test_the_short_bench_gets_the_keys_it_needs_with_defaults():
    data = canary_bench.bench_data({"ssh_hostname": "h", "ssh_port": 2222, "gpu_count": 2})
    assert data["ssh_port"] == 2222 and "gpu_count" not in data
    assert (data["api_port"], data["model_alias"]) == (8080, "qwen3-next")


def test_the_group_canary_is_read_from_the_inventory_as_pyinfra_reads_it(tmp_path: Path):
    """In a child process: pyinfra's CLI patches the process it is imported in with gevent, and
    test_bench's timings would skip after it."""
    path = tmp_path / "fleet.py"
    path.write_text(
        'hosts = [("gpu1", {}), ("gpu2", {}), ("gpu3", {})]\ncanary = ["gpu3", "gpu1"]\n'
    )
    code = (
        "import sys\nfrom gpubox.remote import inventory\n"
        "print(inventory.group_members(sys.argv[1], 'canary'), "
        "inventory.group_members(sys.argv[1], 'other'))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    assert found.stdout.strip() == "['gpu1', 'gpu3'] None"  # inventory order; no such group
