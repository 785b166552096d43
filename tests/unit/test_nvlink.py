"""gpubox nvlink: dcgmi dmon's rows grouped into samples and shown labelled, on the real dmon
capture and on the sandbox's stand-in dcgmi (which copies the real layout)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox import parsers
from gpubox.commands import nvlink
from gpubox.sandbox import standin
from gpubox.sandbox.standin import state as st

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
H800 = (FIXTURES / "dcgmi" / "dmon-i0-e1011,1012,1009,1010-c5_H800_llm-action.txt").read_text()
NOT_LOADED = (FIXTURES / "dcgmi" / "dmon-e1002_module-not-loaded_3.x_dcgm-issue50.txt").read_text()
NO_HOSTENGINE = (FIXTURES / "dcgmi" / "error_no-hostengine_dcgm-exporter-issue193.txt").read_text()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "warming up"),
        (0, "0 B/s"),
        (0.0, "0 B/s"),
        (999, "999 B/s"),
        (999.7, "1.0 kB/s"),
        (1500, "1.5 kB/s"),
        (549_740, "550 kB/s"),
        (12_345_678, "12.3 MB/s"),
        (999_999, "1.0 MB/s"),
        (25_781_000_000, "25.8 GB/s"),
        (150_000_000_000, "150 GB/s"),
        (3_000_000_000_000, "3000 GB/s"),
    ],
)
def test_format_rate(value, text):
    assert nvlink.format_rate(value) == text


def test_the_real_capture_gives_five_samples_two_warming_up():
    got = list(nvlink.samples(H800.splitlines()))
    assert [s.number for s in got] == [1, 2, 3, 4, 5]
    assert all([r.entity for r in s.rows] == ["GPU 0"] for s in got)
    first, third = nvlink.render(got[0], "h800"), nvlink.render(got[2], "h800")
    assert first.splitlines() == [
        "NVLink traffic on h800, sample 1",
        "               TX          RX       TX+RX",
        "GPU 0  warming up  warming up  warming up",
    ]
    assert third.splitlines()[2] == "GPU 0  0 B/s  0 B/s  0 B/s"
    assert "all" not in third  # one GPU: no sum line


def test_a_live_sample_shows_as_soon_as_it_is_complete():
    """Once the number of GPUs is known (the second sample began), each sample is emitted by
    its last row, not by the next sample's first."""
    header = "#Entity   NBWLT       NVLTX       NVLRX"
    reader = nvlink.Samples()
    assert reader.feed(header) == [] and reader.feed("ID        MB/s        B/s  B/s") == []
    assert reader.feed("GPU 0     0     N/A    N/A") == []
    assert reader.feed("GPU 1     0     N/A    N/A") == []
    [first] = reader.feed("GPU 0     0     N/A    N/A")
    assert first.number == 1 and len(first.rows) == 2
    [second] = reader.feed("GPU 1     0     N/A    N/A")
    assert second.number == 2
    assert reader.feed("GPU 0     2   1000    2000") == []
    [third] = reader.feed("GPU 1     2   2000    1000")
    assert third.number == 3 and reader.close() == []


def test_dcgmi_errors_are_refused_and_explained():
    reader = nvlink.Samples()
    with pytest.raises(parsers.ParseError) as caught:
        for line in NOT_LOADED.splitlines():
            reader.feed(line)
    message = nvlink.explain(str(caught.value))
    assert "module of DCGM that is not currently loaded" in message
    assert "datacenter-gpu-manager-4-proprietary" in message
    with pytest.raises(parsers.ParseError) as caught:
        list(nvlink.samples(NO_HOSTENGINE.splitlines()))
    assert "sudo systemctl start nvidia-dcgm" in nvlink.explain(str(caught.value))


def test_dmon_command():
    assert nvlink.dmon_command(None, 1.0) == "dcgmi dmon -e 449,1011,1012 -c 0 -d 1000"
    assert nvlink.dmon_command(3, 0.25) == "dcgmi dmon -e 449,1011,1012 -c 3 -d 250"


def test_main_refuses_bad_arguments(capsys):
    for argv in ([], ["inv.py", "--count", "0"], ["inv.py", "--interval", "0"]):
        with pytest.raises(SystemExit) as exit_:
            nvlink.main(argv)
        assert exit_.value.code == 2


# --------------------------------------------------------------------------- the stand-in


@pytest.fixture
def dcgmi(tmp_path: Path):
    """Run the stand-in dcgmi (DCGM 4.4.1 layout) on a state with NVLink traffic."""
    state = st.default_state()
    st.set_gpu_nvlink_traffic(state, 0, 25_000_000_000, 24_500_000_000)
    st.set_gpu_nvlink_traffic(state, 1, 24_500_000_000, 25_000_000_000)
    state_file = st.save_state(state, tmp_path / "state.json")
    run = tmp_path / "run"
    run.mkdir()
    (run / st.LOADED_DRIVER_FILE).write_text("570.211.01\n")
    (run / st.HOSTENGINE_FILE).write_text(f"{os.getpid()} 127.0.0.1:5555\n")
    profiling = tmp_path / "libdcgmmoduleprofiling.so.4"
    profiling.touch()
    script = tmp_path / "dcgmi"
    script.write_text(standin.dcgm_source(standin.DCGMI, "4.4.1"))
    env = {
        **os.environ,
        st.STATE_ENV: str(state_file),
        st.RUN_ENV: str(run),
        st.PROFILING_MODULE_ENV: str(profiling),
    }

    def call(command: str) -> str:
        args = command.split()[1:]
        result = subprocess.run(
            [sys.executable, str(script), *args], env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    return call


def test_the_stand_in_stream_labelled(dcgmi):
    out = dcgmi(nvlink.dmon_command(3, 0.001))
    got = list(nvlink.samples(out.splitlines()))
    assert len(got) == 3
    warm = nvlink.render(got[0], "gpubox-sandbox").splitlines()
    assert warm[1].split() == ["TX", "RX", "TX+RX", "NVLink", "total", "(449)"]
    assert "warming up" in warm[2] and warm[2].rstrip().endswith("49.5 GB/s")
    assert warm[4].startswith("all") and warm[4].rstrip().endswith("99.0 GB/s")
    table = nvlink.render(got[2], "gpubox-sandbox").splitlines()
    assert table[0] == "NVLink traffic on gpubox-sandbox, sample 3"
    assert table[2] == "GPU 0  25.0 GB/s  24.5 GB/s  49.5 GB/s           49.5 GB/s"
    assert table[3] == "GPU 1  24.5 GB/s  25.0 GB/s  49.5 GB/s           49.5 GB/s"
    assert table[4] == "all    49.5 GB/s  49.5 GB/s  99.0 GB/s           99.0 GB/s"


def test_a_host_that_does_not_resolve_is_one_line_and_exit_3(capsys) -> None:
    from gpubox.commands.nvlink import main

    assert main(["--host", "gpubox-no-such-host.invalid", "--count", "1"]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("gpubox-no-such-host.invalid: unreachable: DNS: ")
    assert len(err.splitlines()) == 1
