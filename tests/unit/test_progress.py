"""Long steps: the wrapper shell run for real with /bin/sh (and bash), the probes against
files that grow while the step runs, pyinfra printing the lines live (@local), and
`make demo` streaming the deploy's output."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyinfra.connectors.util import CommandOutput, OutputLine

from gpubox.commands import demo
from gpubox.infra import progress

UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


@dataclass
class Run:
    rc: int
    lines: list[tuple[float, str]]  # (seconds since start, stdout line), as they arrived
    stderr: str
    seconds: float
    tmp: Path
    tmp_left: list[str] = field(default_factory=list)

    @property
    def stdout(self) -> list[str]:
        return [line for _, line in self.lines]

    def progress(self, label: str = "Step") -> list[str]:
        return [line for line in self.stdout if line.startswith(f"{label} [")]


def run_wrapper(
    tmp_path: Path,
    command: str,
    probe: str,
    every: int = 1,
    label: str = "Step",
    shell: str = "/bin/sh",
    stop_after: float | None = None,
) -> Run:
    """The wrapper run as pyinfra would run it (``sh -c TEXT``), its stdout read line by line
    with the time each line arrived; TMPDIR is a fresh folder, to see what it leaves."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    text = progress.wrapper_command(command, probe, every, label=label)
    start = time.monotonic()
    proc = subprocess.Popen(
        [shell, "-c", text],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp), "LC_ALL": "C"},
        cwd=tmp_path,
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    if stop_after is not None:
        timer = threading.Timer(stop_after, proc.send_signal, (signal.SIGTERM,))
        timer.start()
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
    rc = proc.wait(timeout=60)
    reader.join(10)
    return Run(rc, lines, "".join(err), time.monotonic() - start, tmp, sorted(os.listdir(tmp)))


def to_bytes(value: str, unit: str) -> float:
    return float(value) * UNITS[unit]


def slow_writer(path: Path, chunks: int, size: int, pause: float) -> str:
    return (
        f"i=0; while [ $i -lt {chunks} ]; do head -c {size} /dev/zero >>{path}; "
        f"sleep {pause}; i=$((i + 1)); done; echo written"
    )


DOWNLOAD_LINE = re.compile(
    r"^Step \[\d+ s\]: downloaded ([\d.]+) (B|KiB|MiB|GiB)"
    r"(?: of ([\d.]+) (B|KiB|MiB|GiB) \((\d+)%\))?, [\d.]+ (?:kB|MB)/s"
    r"(, ETA (\d+ s|\d+ min \d+ s))?$"
)


def test_a_growing_file_shows_growing_bytes_percent_rate_and_eta_while_it_runs(tmp_path):
    target = tmp_path / "model.bin"
    total = 10 * 200_000
    run = run_wrapper(
        tmp_path, slow_writer(target, 10, 200_000, 0.4), progress.download_probe(str(target), total)
    )
    assert run.rc == 0, run.stderr
    lines = run.progress()
    assert len(lines) >= 2, run.stdout
    parsed = [DOWNLOAD_LINE.match(line) for line in lines]
    assert all(parsed), lines
    sizes = [to_bytes(m.group(1), m.group(2)) for m in parsed if m]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0], lines
    assert all(m.group(3) == "1.9" and m.group(4) == "MiB" for m in parsed if m), lines
    assert any(m.group(7) for m in parsed if m), f"no ETA in {lines}"
    # live: the first line came well before the step ended, not all at the end
    first = next(t for t, line in run.lines if line.startswith("Step ["))
    assert first < run.seconds - 1.5, run.lines
    assert re.fullmatch(r"Step: done in \d+ s", run.stdout[-1]), run.stdout
    assert "written" not in run.stdout  # the command's own output goes to the log
    assert run.tmp_left == []


def test_a_line_every_interval_even_when_nothing_moves(tmp_path):
    run = run_wrapper(tmp_path, "sleep 4.5", progress.download_probe(str(tmp_path / "none")), 2)
    times = [t for t, line in run.lines if line.startswith("Step [")]
    assert len(times) >= 2, run.lines
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert max(gaps) < 2 + 1.5, gaps
    assert all(line.endswith("downloaded 0 B, 0 kB/s") for line in run.progress()), run.stdout


def test_a_directory_counts_partial_and_nested_files_without_a_total(tmp_path):
    folder = tmp_path / "model"
    command = (
        f"mkdir -p {folder}/.cache/download; "
        f"head -c 300000 /dev/zero >{folder}/.cache/download/a.incomplete; sleep 1.2; "
        f"head -c 300000 /dev/zero >{folder}/b.part; sleep 1.2; "
        f"head -c 300000 /dev/zero >{folder}/c; sleep 1.2"
    )
    run = run_wrapper(tmp_path, command, progress.download_probe(str(folder)))
    sizes = [
        to_bytes(m.group(1), m.group(2))
        for m in map(DOWNLOAD_LINE.match, run.progress())
        if m and not m.group(3)  # no total: no "of", no percent, no ETA
    ]
    assert len(sizes) == len(run.progress()) >= 2, run.stdout
    assert sizes[-1] >= 600_000 and sizes[-1] > sizes[0], run.stdout


def test_a_file_download_counts_its_part_file(tmp_path):
    target = tmp_path / "w.gguf"
    command = f"head -c 500000 /dev/zero >{target}.part; sleep 2.5; mv {target}.part {target}"
    run = run_wrapper(tmp_path, command, progress.download_probe(str(target), 1_000_000))
    assert any("downloaded 488.3 KiB of 976.6 KiB (50%)" in line for line in run.progress())


def test_a_failure_keeps_its_status_shows_the_log_tail_on_stderr_and_leaves_nothing(tmp_path):
    command = (
        "i=1; while [ $i -le 100 ]; do echo line $i; i=$((i + 1)); done; echo boom >&2; exit 7"
    )
    run = run_wrapper(tmp_path, command, progress.apt_probe(str(tmp_path), str(tmp_path / "l")))
    assert run.rc == 7
    assert "Step: failed (exit status 7) after" in run.stderr
    tail = run.stderr.splitlines()[1:]
    assert tail[-1] == "boom" and tail[0] == "line 62" and len(tail) == progress.TAIL_LINES
    assert "line 61" not in tail
    assert not [line for line in run.stdout if "line" in line]
    assert run.tmp_left == []


def test_a_stopped_step_stops_its_command_and_removes_its_log(tmp_path):
    pid_file = tmp_path / "pid"
    run = run_wrapper(
        tmp_path,
        f"sleep 60 & echo $! >{pid_file}; wait",
        progress.download_probe(str(tmp_path / "x")),
        stop_after=2.5,
    )
    assert run.rc == 143 and run.seconds < 10
    assert run.tmp_left == []
    pid = int(pid_file.read_text())
    for _ in range(50):
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split(") ")[1].startswith("Z"):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's sleep {pid} still runs")


NINJA = re.compile(r"^Step \[\d+ s\]: (\d+) of 10 targets built \((\d+)%\)(, ETA \d+ s)?$")


def test_ninja_probe_counts_targets_of_the_steps_own_output(tmp_path):
    command = (
        "echo '-- Configuring done'; sleep 1.6; "
        'for n in 1 2 3 4 5 6; do echo "[$n/10] Building CXX object src/f$n.o"; '
        "echo 'warning: [-Wunused] nothing to see'; sleep 0.6; done"
    )
    run = run_wrapper(tmp_path, command, progress.ninja_probe())
    lines = run.progress()
    assert lines[0].endswith(": configuring"), lines
    counts = [NINJA.match(line) for line in lines[1:]]
    assert len(counts) >= 2 and all(counts), lines
    built = [int(m.group(1)) for m in counts if m]
    assert built == sorted(built) and built[-1] > built[0], lines
    assert all(int(m.group(2)) == 10 * int(m.group(1)) for m in counts if m)
    assert any(m.group(3) for m in counts if m), f"no ETA in {lines}"


def test_ninja_probe_reads_a_log_of_its_own(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("[3/7] Building a\n[4/7] Linking b\nFAILED: c\nerror [x/y] here\n")
    run = run_wrapper(tmp_path, "sleep 1.5", progress.ninja_probe(str(log)))
    assert run.progress() and all(
        line.endswith("4 of 7 targets built (57%)") for line in run.progress()
    ), run.stdout


def test_apt_probe_follows_the_download_then_dpkg(tmp_path):
    archives = tmp_path / "archives"
    (archives / "partial").mkdir(parents=True)
    (archives / "old.deb").write_bytes(b"x" * 50_000)  # cached before: not this step's bytes
    dpkg_log = tmp_path / "dpkg.log"
    dpkg_log.write_text("2025-01-01 00:00:00 configure old-package:amd64 1 1\n")
    line = "2025-01-02 00:00:00 {} {}:amd64 <none> 1.0"
    command = (
        "echo 'The following NEW packages will be installed:'; echo '  foo bar'; "
        "echo '0 upgraded, 2 newly installed, 0 to remove and 3 not upgraded.'; "
        "echo 'Need to get 1,024 kB of archives.'; "
        "for i in 1 2 3 4; do head -c 256000 /dev/zero >"
        f"{archives}/partial/p$i.deb; sleep 0.6; done; "
        f"echo '{line.format('install', 'foo')}' >>{dpkg_log}; sleep 1.5; "
        f"echo '{line.format('install', 'bar')}' >>{dpkg_log}; "
        f"echo '{line.format('configure', 'foo')}' >>{dpkg_log}; sleep 1.5"
    )
    run = run_wrapper(tmp_path, command, progress.apt_probe(str(archives), str(dpkg_log)))
    assert run.rc == 0, run.stderr
    lines = run.progress()
    downloads = [m for m in map(DOWNLOAD_LINE.match, lines) if m]
    assert downloads and all(m.group(3) == "1000.0" for m in downloads), lines
    assert downloads[0].group(1) != "0"
    assert any(line.endswith(": unpacking foo (1 of 2 packages)") for line in lines), lines
    assert lines[-1].endswith(": setting up foo (1 of 2 packages)"), lines
    assert not [line for line in lines if "old-package" in line]


def test_docker_pull_probe_counts_bytes_and_layers(tmp_path):
    command = (
        "echo 'v1: Pulling from org/image'; echo 'aaa: Already exists'; "
        "echo 'bbb: Pulling fs layer'; echo 'ccc: Pulling fs layer'; echo 'bbb: Pull complete'; "
        "sleep 2.5"
    )
    run = run_wrapper(tmp_path, command, progress.docker_pull_probe("org/image:v1", 9 * 10**9))
    lines = run.progress()
    pattern = (
        r"^Step \[\d+ s\]: pulling org/image:v1: [\d.]+ (B|KiB|MiB|GiB) of 8\.4 GiB \(\d+%\), "
        r"[\d.]+ (kB|MB)/s, (ETA .+|nothing new in the last \d+ s), 2 of 3 layers done$"
    )
    assert lines and all(re.match(pattern, line) for line in lines), lines


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_every_probe_parses_in_dash_and_bash(shell):
    for probe in (
        progress.download_probe("/srv/m o'del", 5),
        progress.ninja_probe(),
        progress.ninja_probe("/tmp/b.log"),
        progress.apt_probe(),
        progress.docker_pull_probe('img"$x`', None),
    ):
        text = progress.wrapper_command("echo hi", probe, 10, label="it's a step")
        check = subprocess.run([shell, "-n", "-c", text], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_bash_runs_the_wrapper_too(tmp_path):
    run = run_wrapper(tmp_path, "sleep 2.5; exit 3", progress.ninja_probe(), shell="bash")
    assert run.rc == 3 and run.progress() and run.tmp_left == []


def test_the_interval_is_bounded_and_the_command_kept_verbatim():
    for every in (0, 15, 30):
        with pytest.raises(ValueError):
            progress.wrapper_command("true", "", every)
    with pytest.raises(ValueError):
        progress.wrapper_command("cat <<_GB_STEP_EOF\nx\n_GB_STEP_EOF", "", 10)
    text = progress.wrapper_command("apt-get install 'a b' \"$HOME\"", "", 10)
    assert text.endswith("<<'_GB_STEP_EOF'\napt-get install 'a b' \"$HOME\"\n_GB_STEP_EOF\n")
    assert text.count(" install ") == 1  # the plan tests find a step's packages after it


# pyinfra ------------------------------------------------------------------------------------


class FakeHost:
    def __init__(self, status: bool, output: CommandOutput) -> None:
        self.calls: list[tuple[object, dict]] = []
        self.result = (status, output)

    def run_shell_command(self, command, **kwargs):
        self.calls.append((command, kwargs))
        return self.result


class FakeState:
    print_input = False
    print_output = False


def test_the_command_asks_the_connector_to_print_its_output_live():
    output = CommandOutput([OutputLine("stdout", "Step [10 s]: x"), OutputLine("stderr", "boom")])
    command = progress.StreamingCommand("echo hi", _sudo_user="root")
    ok = FakeHost(True, output)
    assert command.execute(FakeState(), ok, {"_sudo": True}) == (True, output)
    ((sent, kwargs),) = ok.calls
    assert sent is command
    assert kwargs == {"print_output": True, "print_input": False, "_sudo": True,
                      "_sudo_user": "root"}  # fmt: skip
    # a failure: pyinfra prints the output again, so only stderr (the tail) goes back
    failed = FakeHost(False, output)
    status, back = command.execute(FakeState(), failed, {})
    assert status is False and back.stdout_lines == [] and back.stderr_lines == ["boom"]


DEPLOY = """
from gpubox.infra import progress
progress.long_step(
    name="Slow step",
    command="for i in 1 2 3 4 5; do head -c 1000 /dev/zero >>{target}; sleep 0.8; done",
    probe=progress.download_probe("{target}", 5000),
    every=1,
)
progress.long_step(name="Failing step", command="echo boom; exit 3", probe="", every=1)
"""


def test_pyinfra_prints_the_progress_lines_live_with_the_host_name(tmp_path):
    deploy = tmp_path / "deploy.py"
    deploy.write_text(DEPLOY.format(target=tmp_path / "f"))
    argv = [str(Path(sys.executable).parent / "pyinfra"), "-y", "@local", str(deploy)]
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines = [(time.monotonic() - start, line.rstrip()) for line in proc.stdout]
    rc = proc.wait(timeout=120)
    text = "\n".join(line for _, line in lines)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    steps = [(t, re.sub(r"\x1b\[[0-9;]*m", "", line)) for t, line in lines if "Slow step [" in line]
    assert len(steps) >= 2, plain
    assert all(
        re.match(r"^\[@local\]\s+Slow step \[\d+ s\]: downloaded .* of 4\.9 KiB", line)
        for _, line in steps
    ), plain
    done = next(t for t, line in lines if "Slow step: done in" in line)
    assert steps[0][0] < done - 1.5, lines  # shown as it ran, not at the end
    assert rc != 0
    assert "Failing step: failed (exit status 3)" in plain and "boom" in plain


# make demo ----------------------------------------------------------------------------------

FAKE_PYINFRA = """
import json, sys, time
for i in range(3):
    print(f"[box] step {i}", file=sys.stderr, flush=True)
    time.sleep(0.4)
ops = [{"name": "Stage | op a", "success": True}, {"name": "Stage | op b", "success": False}]
print(json.dumps({"results": {"operations": ops, "failed_hosts": []}}))
"""


class Clock(io.StringIO):
    """A stream that notes when each line was written."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.monotonic()
        self.times: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        self.times.append((time.monotonic() - self.start, text))
        return super().write(text)


def test_demo_streams_the_deploy_as_it_runs_and_still_sums_it_up(monkeypatch, capsys):
    monkeypatch.setattr(demo, "in_netns", lambda argv: [sys.executable, "-c", FAKE_PYINFRA])
    clock = Clock()
    rc, stdout, stderr = demo.stream(demo.in_netns([]), echo=clock)
    assert rc == 0 and json.loads(stdout)["results"]["operations"]
    assert [text for _, text in clock.times] == [f"[box] step {i}\n" for i in range(3)]
    assert clock.times[0][0] < clock.times[-1][0] - 0.6  # line by line, not at the end
    assert stderr == "".join(text for _, text in clock.times)

    run = demo.deploy()
    assert (run.rc, run.operations, run.changed, run.stages) == (0, 2, 1, ["Stage"])
    assert "[box] step 2" in run.output and "[box] step 2" in capsys.readouterr().err


def test_demo_stream_can_merge_stdout(monkeypatch):
    clock = Clock()
    code = "import sys; print('out', flush=True); print('err', file=sys.stderr, flush=True)"
    rc, stdout, both = demo.stream([sys.executable, "-c", code], echo=clock, merged=True)
    assert rc == 0 and stdout == "" and sorted(both.split()) == ["err", "out"]
