"""The deploy's final checks (gpubox.stages.verify): which checks, and the runner that carries a
command's exit status through pyinfra's connection (here a real shell stands in for it)."""

from __future__ import annotations

import re
import subprocess
from types import SimpleNamespace

from gpubox import checks
from gpubox.stages import verify


class ShellHost:
    """pyinfra's host.run_shell_command, answered by a real local shell."""

    def run_shell_command(self, command: str, **_: object):
        proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
        return proc.returncode == 0, SimpleNamespace(
            stdout_lines=proc.stdout.splitlines(), stderr_lines=proc.stderr.splitlines()
        )


def test_the_runner_keeps_the_exit_status_and_the_output_exactly():
    run = verify.runner(ShellHost(), {})
    assert run("printf abc") == checks.Output(0, "abc\n", "", "printf abc")
    assert run("echo hi; echo there").stdout == "hi\nthere\n"
    assert run("false").rc == 1
    missing = run("gpubox-no-such-command")
    assert missing.rc == 127 and missing.missing and "not found" in missing.stderr
    failed = run("echo partial; cat /gpubox/nonexistent")
    assert failed.rc == 1 and failed.stdout == "partial\n"
    assert failed.stderr.endswith("No such file or directory")
    # an answer without a final newline (curl -w, then a body) keeps its lines apart
    assert run("printf 200; echo; printf '{}'").stdout == "200\n{}\n"


def test_the_deploy_runs_the_quick_passive_checks_but_not_the_burn_in():
    chosen = verify.deploy_checks()
    assert chosen and all(c.marker == "quick" and not c.active for c in chosen)
    assert "burnin.record" not in {c.id for c in chosen}
    assert {"driver.held", "driver.pins", "cuda.link", "backend.health"} <= {c.id for c in chosen}


def test_the_inventory_is_named_as_the_user_typed_it():
    argv = ["pyinfra", "-y", "--data", "x=1", "inventories/mybox.py", "deploy/full.py"]
    assert verify.inventory_argument(argv) == "inventories/mybox.py"
    assert verify.inventory_argument(["pyinfra", "@local", "deploy/full.py"]) == "INVENTORY"


def test_a_failure_names_the_check_what_it_found_and_the_fix():
    verdict = checks.Verdict("cuda.link", "box", "fail", "box: /usr/local/cuda ...", "pyinfra x")
    assert verify.failures([verdict]) == (
        "  [cuda.link] box: /usr/local/cuda ...\n      fix: pyinfra x"
    )


COMMANDS = [
    "printf abc",
    "echo hi; echo there",
    "false",
    "gpubox-no-such-command",
    "echo partial; cat /gpubox/nonexistent",
    "printf 200; echo; printf '{}'",
    "printf 'two words\\n\\nand a blank line\\n'",
    "cat",  # no input: it ends at once
]


def test_the_batch_reads_every_fact_in_one_round_trip_as_the_runner_would():
    class Counting(ShellHost):
        calls = 0

        def run_shell_command(self, command: str, **kw: object):
            Counting.calls += 1
            return super().run_shell_command(command, **kw)

    one = verify.runner(ShellHost(), {})
    batch = verify.Batch(Counting(), {})
    batch.read(COMMANDS)
    assert Counting.calls == 1
    for command in COMMANDS:
        got, want = batch(command), one(command)
        assert (got.rc, got.stdout, got.missing) == (want.rc, want.stdout, want.missing), command
        # the same message, but for the script's line number the shell names
        assert re.sub(r"^sh: \d+:", "sh:", got.stderr) == re.sub(r"^sh: \d+:", "sh:", want.stderr)
    assert Counting.calls == 1  # every answer came from the one round trip
    assert batch("echo later").stdout == "later\n" and Counting.calls == 2  # not read: alone
    # a command that exits keeps its status (alone, the status line after it is never printed)
    batch.read(["exit 3"])
    assert batch("exit 3").rc == 3


def test_a_batch_line_that_does_not_parse_leaves_that_command_to_run_alone():
    found = verify.parse_batch(["a", "b"], ["@@gpubox-batch 0 0 aGk= -", "@@gpubox-batch 1 x - -"])
    assert found == {"a": checks.Output(0, "hi\n", "", "a")}


def test_in_turn_commands_run_one_by_one_after_the_others_which_run_side_by_side():
    """The API's requests and the process listing (Fact.in_turn) never run beside anything;
    the other facts run side by side."""
    side = [f"date +%s%N; sleep 0.5; date +%s%N; echo {i} >/dev/null" for i in range(3)]
    turn = [f"date +%s%N; sleep 0.2; date +%s%N; echo t{i} >/dev/null" for i in range(2)]
    batch = verify.Batch(ShellHost(), {})
    batch.read([turn[0], *side, turn[1]], in_turn=turn)

    def span(command: str) -> tuple[int, int]:
        start, end = (int(x) for x in batch(command).stdout.split())
        return start, end

    sides = [span(c) for c in side]
    assert max(s for s, _ in sides) < min(e for _, e in sides)  # they overlapped
    first, second = span(turn[0]), span(turn[1])
    assert first[0] >= max(e for _, e in sides)  # after every side-by-side one ended
    assert second[0] >= first[1]  # and one after the other


# --- gpubox-deploy.prom (issue 31 C5): the deploy's end, for the monitoring

NOW = 1764838800.0


def values(text: str) -> dict[str, float]:
    from gpubox.knowledge import metrics

    return metrics.read_values(text)


def test_a_passed_deploy_sets_every_time_and_a_failed_one_keeps_the_last_success():
    from gpubox.knowledge import metrics

    first = verify.status_text("", True, True, NOW)
    assert first == metrics.exposition(
        [
            (name, {}, NOW if name != "gpubox_deploy_last_run_success" else 1)
            for name in (
                "gpubox_deploy_last_run_timestamp_seconds",
                "gpubox_deploy_last_run_success",
                "gpubox_deploy_last_success_timestamp_seconds",
                "gpubox_checks_last_success_timestamp_seconds",
            )
        ],
        writer=metrics.DEPLOY,
    )
    failed = values(verify.status_text(first, False, True, NOW + 60))
    assert failed == {
        "gpubox_deploy_last_run_timestamp_seconds": NOW + 60,
        "gpubox_deploy_last_run_success": 0,
        "gpubox_deploy_last_success_timestamp_seconds": NOW,
        "gpubox_checks_last_success_timestamp_seconds": NOW,
    }
    # never a success: 0 (NoRecentSuccess fires on it)
    never = values(verify.status_text("", False, True, NOW))
    assert never["gpubox_deploy_last_success_timestamp_seconds"] == 0
    assert never["gpubox_checks_last_success_timestamp_seconds"] == 0
    # a deploy without its checks (verify_after_deploy false) leaves the checks' time
    unchecked = values(verify.status_text(first, True, False, NOW + 120))
    assert unchecked["gpubox_deploy_last_success_timestamp_seconds"] == NOW + 120
    assert unchecked["gpubox_checks_last_success_timestamp_seconds"] == NOW


def test_the_status_is_read_and_written_whole_through_the_connection(tmp_path):
    path = tmp_path / "textfile" / "gpubox-deploy.prom"
    assert verify.write_status(ShellHost(), {}, str(path), True, True) is None
    written = values(path.read_text())
    assert written["gpubox_deploy_last_run_success"] == 1
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in path.parent.iterdir()] == ["gpubox-deploy.prom"]  # no tmp left
    assert verify.write_status(ShellHost(), {}, str(path), False, True) is None
    again = values(path.read_text())
    assert again["gpubox_deploy_last_run_success"] == 0
    assert (
        again["gpubox_deploy_last_success_timestamp_seconds"]
        == (written["gpubox_deploy_last_success_timestamp_seconds"])
    )
    (tmp_path / "blocked").write_text("")
    assert verify.write_status(ShellHost(), {}, str(tmp_path / "blocked" / "x.prom"), True, True)
