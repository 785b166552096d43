"""gpubox bench --llama-bench: llama-bench's JSON read as its printer writes it (the field
names and order of llama-bench.cpp's test::get_fields in llama.cpp b11312), the command line
per split mode, the commands run for real with a stand-in llama-bench, the server stopped and
started again on every path (a fake runner), the best mode, the table and the kept record."""

from __future__ import annotations

import argparse
import json
import os
import signal
import string
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpubox import bench
from gpubox.base import layout
from gpubox.base.layout import BACKEND_UNITS
from gpubox.bench import health, llamabench, llamabench_host, llamabench_results
from gpubox.checks import Output
from gpubox.config import load_host_config

# test::get_fields() of tools/llama-bench/llama-bench.cpp, in its order, then the two arrays
# json_printer::print_test adds.
FIELDS = (
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename",
    "model_type", "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads",
    "cpu_mask", "cpu_strict", "poll", "type_k", "type_v", "n_gpu_layers", "n_cpu_moe",
    "split_mode", "main_gpu", "no_kv_offload", "flash_attn", "devices", "tensor_split",
    "tensor_buft_overrides", "load_mode", "lazy_mode", "embeddings", "no_op_offload", "no_host",
    "repack", "fit_target", "fit_min_ctx", "n_prompt", "n_gen", "n_depth", "test_time",
    "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
)  # fmt: skip
STRINGS = {
    "build_commit", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
    "cpu_mask", "type_k", "type_v", "split_mode", "devices", "tensor_split",
    "tensor_buft_overrides", "load_mode", "lazy_mode", "test_time",
}  # fmt: skip
BOOLS = {"cpu_strict", "no_kv_offload", "embeddings", "no_host", "repack"}


def printed(tests: list[dict[str, Any]], closed: bool = True) -> str:
    """Text as llama-bench's json_printer writes it: '[', each test an object with every field
    in order (strings quoted, bools as true/false, numbers bare), ',' between, ']' last."""
    out = "[\n"
    for i, test in enumerate(tests):
        if i:
            out += ",\n"
        out += "  {\n"
        for name in FIELDS:
            value = test[name]
            if name in STRINGS:
                text = json.dumps(str(value))
            elif name in BOOLS:
                text = "true" if value else "false"
            else:
                text = str(value)
            out += f'    "{name}": {text},\n'
        out += f'    "samples_ns": [ {", ".join(str(v) for v in test["samples_ns"])} ],\n'
        out += f'    "samples_ts": [ {", ".join(str(v) for v in test["samples_ts"])} ]\n'
        out += "  }"
    return out + ("\n]\n" if closed else "")


def v100_test(n_prompt: int, n_gen: int, avg_ts: float, split_mode: str = "layer") -> dict:
    """One test of a 2x V100 run of the served model, every field as llama-bench fills it."""
    tokens = n_prompt + n_gen
    samples_ns = [int(1e9 * tokens / (avg_ts * f)) for f in (0.99, 1.0, 1.01)]
    return {
        "build_commit": "0c1e570", "build_number": 11312,
        "cpu_info": "Intel(R) Xeon(R) CPU E5-2698 v4 @ 2.20GHz",
        "gpu_info": "Tesla V100-SXM2-32GB, Tesla V100-SXM2-32GB", "backends": "CUDA",
        "model_filename": "/srv/models/Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf",
        "model_type": "qwen3next 80B.A3B Q4_K - Medium", "model_size": 49392295936,
        "model_n_params": 79674391296, "n_batch": 2048, "n_ubatch": 512, "n_threads": 40,
        "cpu_mask": "0x0", "cpu_strict": False, "poll": 50,
        "type_k": "f16", "type_v": "f16", "n_gpu_layers": 999, "n_cpu_moe": 0,
        "split_mode": split_mode, "main_gpu": 0, "no_kv_offload": False, "flash_attn": 1,
        "devices": "auto", "tensor_split": "1.00/1.00", "tensor_buft_overrides": "none",
        "load_mode": "mmap", "lazy_mode": "auto", "embeddings": False, "no_op_offload": 0,
        "no_host": False, "repack": True, "fit_target": 0, "fit_min_ctx": 0,
        "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": 0, "test_time": "2026-03-01T12:00:00Z",
        "avg_ns": sum(samples_ns) // 3, "stddev_ns": 1000000, "avg_ts": avg_ts,
        "stddev_ts": round(avg_ts * 0.01, 6), "samples_ns": samples_ns,
        "samples_ts": [round(1e9 * tokens / ns, 3) for ns in samples_ns],
    }  # fmt: skip


def run_output(pp: float, tg: float, mode: str = "layer") -> str:
    return printed([v100_test(512, 0, pp, mode), v100_test(0, 128, tg, mode)])


# A real run: llama-bench of b11312 (a CPU build) on the sandbox's tiny model, its stdout
# verbatim once put together: its two tests (pp512, then tg128) print alike but for the fields
# written $name here.
_REAL_CPU_TEST = string.Template(
    """  {
    "build_commit": "0c1e570",
    "build_number": 11312,
    "cpu_info": "AMD EPYC",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "/tmp/llamabench-tiny.gguf",
    "model_type": "llama ?B all F32",
    "model_size": 465664,
    "model_n_params": 116416,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "cpu_mask": "0x0",
    "cpu_strict": false,
    "poll": 50,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": 999,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": false,
    "flash_attn": 1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": false,
    "no_op_offload": 0,
    "no_host": false,
    "repack": true,
    "fit_target": 0,
    "fit_min_ctx": 0,
    "n_prompt": $n_prompt,
    "n_gen": $n_gen,
    "n_depth": 0,
    "test_time": "2026-12-01T06:10:28Z",
    "avg_ns": $avg_ns,
    "stddev_ns": $stddev_ns,
    "avg_ts": $avg_ts,
    "stddev_ts": $stddev_ts,
    "samples_ns": [ $samples_ns ],
    "samples_ts": [ $samples_ts ]
  }"""
)
_REAL_CPU_FIGURES = (
    {
        "n_prompt": "512", "n_gen": "0", "avg_ns": "18024278", "stddev_ns": "3348766",
        "avg_ts": "29100.044315", "stddev_ts": "5631.419135",
        "samples_ns": "18318448, 21216253, 14538134", "samples_ts": "27950, 24132.4, 35217.7",
    },
    {
        "n_prompt": "0", "n_gen": "128", "avg_ns": "26601217", "stddev_ns": "3008745",
        "avg_ts": "4855.373923", "stddev_ts": "578.273699",
        "samples_ns": "27534267, 23236493, 29032893", "samples_ts": "4648.75, 5508.58, 4408.79",
    },
)  # fmt: skip
REAL_CPU_RUN = "[\n" + ",\n".join(_REAL_CPU_TEST.substitute(f) for f in _REAL_CPU_FIGURES) + "\n]\n"
# The end of the same build's stderr with -v for -sm tensor (no GPU to split over), verbatim.
TENSOR_LOG = (
    "print_info: file size   = 0.44 MiB (32.00 BPW) \n"
    "llama_prepare_model_devices: skipping CPU (AMD EPYC) for tensor parallelism\n"
    "llama_prepare_model_devices: LLAMA_SPLIT_MODE_TENSOR needs >= 1 devices\n"
    "llama_model_load_from_file_impl: failed to load model\n"
    "llama_bench: error: failed to load model '/tmp/llamabench-tiny.gguf'\n"
)

PLAN = llamabench_host.Plan(
    name="box",
    binary="/opt/llama.cpp/b11312/bin/llama-bench",
    model="/srv/models/model.gguf",
    split_mode="layer",
    gpu_count=2,
    cuda=True,
    health_url="http://127.0.0.1:8080/health",
    health_timeout=60,
    url="http://box:8080",
)


# ---------------------------------------------------------------- parsing


def test_the_printers_output_is_read_with_llama_benchs_names():
    records = llamabench_results.parse_json(run_output(3100.5, 72.25))
    assert [llamabench_results.name_of(r) for r in records] == ["pp512", "tg128"]
    tests = llamabench_results.figures(records)
    assert tests["pp512"]["avg_ts"] == 3100.5 and tests["tg128"]["avg_ts"] == 72.25
    assert tests["tg128"]["stddev_ts"] == pytest.approx(0.7225)
    assert tests["tg128"]["split_mode"] == "layer" and tests["tg128"]["n_gpu_layers"] == 999
    assert tests["tg128"]["model_type"] == "qwen3next 80B.A3B Q4_K - Medium"
    assert len(tests["tg128"]["samples_ts"]) == 3


def test_a_run_that_died_after_its_first_test_keeps_that_test():
    text = printed([v100_test(512, 0, 3000.0)], closed=False)
    with pytest.raises(ValueError):
        json.loads(text)  # what llama-bench leaves when the next test fails
    result = llamabench_results.mode_result(
        "row",
        Output(1, text, "llama_bench: error: failed to run gen\n"),
    )
    assert not result.ok and list(result.tests) == ["pp512"]
    assert result.error == "exit status 1: llama_bench: error: failed to run gen"


def test_a_real_run_is_read_and_printed_as_the_printer_does():
    records = llamabench_results.parse_json(REAL_CPU_RUN)
    assert [list(r) for r in records] == [[*FIELDS, "samples_ns", "samples_ts"]] * 2
    assert printed(records) == REAL_CPU_RUN  # the stand-in printer above writes the same bytes
    tests = llamabench_results.figures(records)
    assert list(tests) == ["pp512", "tg128"]
    assert tests["tg128"]["avg_ts"] == 4855.373923 and tests["tg128"]["backends"] == "CPU"
    assert tests["pp512"]["samples_ts"] == [27950, 24132.4, 35217.7]


def test_other_test_names():
    assert (
        llamabench_results.name_of({"n_prompt": 512, "n_gen": 128, "n_depth": 0}) == "pp512+tg128"
    )
    assert (
        llamabench_results.name_of({"n_prompt": 0, "n_gen": 128, "n_depth": 4096})
        == "tg128 @ d4096"
    )
    assert (
        llamabench_results.parse_json("") == [] and llamabench_results.parse_json("garbage") == []
    )


def test_a_refused_split_mode_names_llamas_reason():
    # llama_prepare_model_devices's message for a tensor split with no GPU (a CPU build),
    # then llama-bench's own line; the loader's info lines are not errors.
    stderr = (
        "llama_model_loader: loaded meta data with 25 key-value pairs\n"
        "llama_prepare_model_devices: LLAMA_SPLIT_MODE_TENSOR needs >= 1 devices\n"
        "llama_model_load_from_file_impl: failed to load model\n"
        "llama_bench: error: failed to load model '/srv/models/model.gguf'\n"
    )
    result = llamabench_results.mode_result("tensor", Output(1, "[\n", stderr))
    assert not result.ok and result.tests == {}
    assert result.error == (
        "exit status 1: llama_prepare_model_devices: LLAMA_SPLIT_MODE_TENSOR needs >= 1 devices"
        " | llama_model_load_from_file_impl: failed to load model"
        " | llama_bench: error: failed to load model '/srv/models/model.gguf'"
    )
    timed_out = llamabench_results.mode_result("layer", Output(124, "[\n", ""))
    assert timed_out.error == f"timed out after {llamabench_results.RUN_TIMEOUT} s"


def test_a_run_without_tg128_is_not_a_success():
    result = llamabench_results.mode_result(
        "layer", Output(0, printed([v100_test(512, 0, 3000.0)]), "")
    )
    assert not result.ok and result.error == "no tg128 in llama-bench's output"


# ---------------------------------------------------------------- command lines


def test_argv_per_mode():
    base = [
        PLAN.binary, "-m", PLAN.model, "-p", "512", "-n", "128", "-ngl", "999", "-fa", "on",
    ]  # fmt: skip
    tail = ["-r", "3", "-o", "json", "-ts", "1/1"]
    assert llamabench_host.argv_for(PLAN, "layer") == base + ["-sm", "layer"] + tail
    assert llamabench_host.argv_for(PLAN, "row") == base + ["-sm", "row"] + tail
    tensor = llamabench_host.argv_for(PLAN, "tensor")
    assert tensor == base + ["-sm", "tensor"] + tail + ["-ctk", "f16", "-ctv", "f16"]
    assert llamabench_host.env_for("tensor") == {"GGML_CUDA_P2P": "1"}
    assert llamabench_host.env_for("layer") == llamabench_host.env_for("row") == {}
    verbose = llamabench_host.argv_for(PLAN, "layer", verbose=True)
    assert verbose == base + ["-sm", "layer", "-r", "1", "-o", "json", "-ts", "1/1", "-v"]
    cpu = llamabench_host.Plan(**{**PLAN.__dict__, "cuda": False})
    assert "-ts" not in llamabench_host.argv_for(cpu, "layer")  # no GPUs to weigh


@pytest.fixture
def fake_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> llamabench_host.Plan:
    """A stand-in llama-bench (a shell script) and a PIDFILE under tmp_path."""
    monkeypatch.setattr(layout, "LLAMA_BENCH_PIDFILE", str(tmp_path / "llama-bench.pid"))
    script = tmp_path / "llama-bench"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$$ $*" > {tmp_path}/args\n'
        f'echo "P2P=${{GGML_CUDA_P2P:-unset}}" >> {tmp_path}/args\n'
        'case "$*" in\n'
        '  *"-sm tensor"*) echo "["; echo "llama_bench: error: failed to load model" >&2;'
        "    exit 1;;\n"
        '  *"-sm row"*) echo started >&2; exec sleep 30;;\n'
        "esac\n"
        f"cat {tmp_path}/out.json\n"
    )
    script.chmod(0o755)
    (tmp_path / "out.json").write_text(run_output(3000.0, 70.0))
    return llamabench_host.Plan(**{**PLAN.__dict__, "binary": str(script)})


def sh(command: str) -> Output:
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    return Output(proc.returncode, proc.stdout, proc.stderr, command)


def test_the_run_command_brings_back_json_errors_and_the_status(fake_bench, tmp_path):
    out = sh(llamabench_host.run_command(fake_bench, "layer"))
    assert out.rc == 0 and llamabench_results.mode_result("layer", out).ts("tg128") == 70.0
    args = (tmp_path / "args").read_text()
    assert "-sm layer" in args and "P2P=unset" in args
    assert not Path(layout.LLAMA_BENCH_PIDFILE).exists()  # removed once the run ended

    out = sh(llamabench_host.run_command(fake_bench, "tensor"))
    assert out.rc == 1 and "P2P=1" in (tmp_path / "args").read_text()
    assert llamabench_results.mode_result("tensor", out).error == (
        "exit status 1: llama_bench: error: failed to load model"
    )


def test_the_cleanup_ends_an_interrupted_run(fake_bench, tmp_path):
    # The row run sleeps: as a client's Ctrl-C leaves it, running on with nobody reading.
    proc = subprocess.Popen(["sh", "-c", llamabench_host.run_command(fake_bench, "row")])
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "args").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int(Path(layout.LLAMA_BENCH_PIDFILE).read_text())
        assert os.getpgid(pid) == pid  # its own process group (setsid)
        start = time.monotonic()
        assert sh(llamabench_host.cleanup_command()).rc == 0
        assert proc.wait(timeout=20) != 0
        assert time.monotonic() - start < 10  # TERM ended it: no 30 s sleep, no KILL wait
        assert not Path(layout.LLAMA_BENCH_PIDFILE).exists()
        worker = int((tmp_path / "args").read_text().split()[0])
        with pytest.raises(ProcessLookupError):
            os.kill(worker, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_cleanup_kills_nothing_that_is_not_llama_bench(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "LLAMA_BENCH_PIDFILE", str(tmp_path / "pid"))
    other = subprocess.Popen(["sleep", "30"])
    try:
        Path(layout.LLAMA_BENCH_PIDFILE).write_text(f"{other.pid}\n")  # a stale file, a reused pid
        assert sh(llamabench_host.cleanup_command()).rc == 0
        assert other.poll() is None and not Path(layout.LLAMA_BENCH_PIDFILE).exists()
    finally:
        other.kill()
        other.wait()


# ---------------------------------------------------------------- stop, run, start


class FakeBox:
    """A runner: answers each command by its kind and records the kinds in order."""

    def __init__(
        self,
        active: str = "active",
        binary: bool = True,
        runs: dict[str, Any] | None = None,
        health: list[str] | None = None,
        verbose: dict[str, Output] | None = None,
    ) -> None:
        self.active, self.binary = active, binary
        self.runs = runs or {}
        self.verbose = verbose or {}
        self.health = list(health or ["200"])
        self.log: list[str] = []

    def __call__(self, command: str) -> Output:
        if command == llamabench_host.preflight_command(PLAN):
            self.log.append("preflight")
            binary = "yes" if self.binary else "no"
            return Output(0, f"binary={binary}\nmodel=yes\nactive={self.active}\n")
        if command == f"systemctl stop {layout.LLAMA_SERVER}":
            self.log.append("stop")
            return Output(0, "")
        if command == f"systemctl start {layout.LLAMA_SERVER}":
            self.log.append("start")
            return Output(0, "")
        if command == llamabench_host.cleanup_command():
            self.log.append("cleanup")
            return Output(0, "")
        if command == health.health_command(PLAN):
            self.log.append("health")
            return Output(0, self.health.pop(0) if len(self.health) > 1 else self.health[0])
        for mode in llamabench.SPLIT_MODES:
            if command == llamabench_host.run_command(PLAN, mode, verbose=True):
                self.log.append(f"verbose {mode}")
                return self.verbose.get(mode, Output(1, "[\n", TENSOR_LOG))
            if command == llamabench_host.run_command(PLAN, mode):
                self.log.append(f"run {mode}")
                answer = self.runs.get(mode, Output(0, run_output(3000.0, 70.0, mode)))
                if isinstance(answer, BaseException):
                    raise answer
                return answer
        raise AssertionError(f"unexpected command: {command}")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def bench_host(box: FakeBox, modes: list[str], said: list[str] | None = None, clock=None):
    clock = clock or Clock()
    said = said if said is not None else []
    return llamabench_host.bench_host(box, PLAN, modes, said.append, clock.sleep, clock)


def test_the_server_is_stopped_then_started_and_awaited():
    box = FakeBox(health=["000", "503", "200"])
    said: list[str] = []
    result = bench_host(box, ["layer"], said)
    assert box.log == [
        "preflight", "stop", "run layer", "cleanup", "start", "health", "health", "health",
    ]  # fmt: skip
    assert result.modes[0].ok and result.stopped and result.restart_error is None
    assert said[0] == (
        "box: stopping gpubox-llama-server for llama-bench (it holds the GPU memory); it is "
        "started again afterwards, however the run ends"
    )
    assert said[-1] == "box: gpubox-llama-server healthy again after 4 s"


def test_a_failing_mode_is_reported_with_llamas_reason_and_the_others_still_run():
    failed = Output(1, "[\n", "llama_bench: error: failed to load model '/srv/models/x.gguf'\n")
    box = FakeBox(runs={"tensor": failed, "layer": failed})
    said: list[str] = []
    result = bench_host(box, ["layer", "row", "tensor"], said)
    assert box.log[1:7] == ["stop", "run layer", "verbose layer", "run row", "run tensor"] + [
        "verbose tensor"
    ]
    assert box.log[7:] == ["cleanup", "start", "health"]
    assert [m.ok for m in result.modes] == [False, True, False]
    assert "box: -sm tensor failed; once more with -v, for llama.cpp's reason" in said
    assert result.modes[2].error == (
        "exit status 1: llama_prepare_model_devices: LLAMA_SPLIT_MODE_TENSOR needs >= 1 devices"
        " | llama_model_load_from_file_impl: failed to load model"
        " | llama_bench: error: failed to load model '/tmp/llamabench-tiny.gguf'"
    )


def test_a_mode_that_passes_with_the_log_keeps_its_first_error_and_a_timeout_is_not_rerun():
    failed = Output(1, "[\n", "llama_bench: error: failed to run gen\n")
    box = FakeBox(
        runs={"layer": failed, "row": Output(124, "[\n", "")},
        verbose={"layer": Output(0, run_output(3000.0, 70.0))},
    )
    result = bench_host(box, ["layer", "row"])
    assert box.log[1:5] == ["stop", "run layer", "verbose layer", "run row"]
    assert result.modes[0].error == "exit status 1: llama_bench: error: failed to run gen"
    assert result.modes[1].error == f"timed out after {llamabench_results.RUN_TIMEOUT} s"


@pytest.mark.parametrize(
    "failure", [KeyboardInterrupt(), ConnectionResetError("connection reset by peer")]
)
def test_ctrl_c_or_a_lost_command_still_starts_the_server(failure):
    box = FakeBox(runs={"row": failure})
    result = bench_host(box, ["layer", "row", "tensor"])
    assert box.log == ["preflight", "stop", "run layer", "run row", "cleanup", "start", "health"]
    assert result.restart_error is None and [m.mode for m in result.modes] == ["layer"]
    if isinstance(failure, KeyboardInterrupt):
        assert result.interrupted and result.error == "interrupted"
    else:
        assert result.error == "ConnectionResetError: connection reset by peer"


def test_a_second_ctrl_c_does_not_cut_the_restart_short():
    class Pressing(FakeBox):
        def __call__(self, command: str) -> Output:
            out = super().__call__(command)
            if self.log[-1] == "cleanup":
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the restart begins
            return out

    box = Pressing(runs={"layer": KeyboardInterrupt()})
    before = signal.getsignal(signal.SIGINT)
    result = bench_host(box, ["layer"])
    assert box.log == ["preflight", "stop", "run layer", "cleanup", "start"]
    assert result.restart_error == "gpubox-llama-server started, /health not awaited (interrupted)"
    assert signal.getsignal(signal.SIGINT) is before


def test_a_server_that_does_not_come_back_is_named():
    clock = Clock()
    result = bench_host(FakeBox(health=["000"]), ["layer"], clock=clock)
    assert result.restart_error == (
        "gpubox-llama-server did not answer /health within 60 s (health_timeout): "
        "journalctl -u gpubox-llama-server -n 50"
    )
    assert clock.now == 60


def test_a_stopped_server_is_not_started():
    box = FakeBox(active="inactive")
    said: list[str] = []
    result = bench_host(box, ["layer"], said)
    assert box.log == ["preflight", "run layer", "cleanup"]
    assert result.modes[0].ok and not result.stopped
    assert said[-1] == "box: gpubox-llama-server was not running before; it is left stopped"


def test_nothing_is_stopped_without_llama_bench_on_the_box():
    box = FakeBox(binary=False)
    result = bench_host(box, ["layer"])
    assert box.log == ["preflight"] and not result.modes
    assert result.error == (
        "no llama-bench at /opt/llama.cpp/b11312/bin/llama-bench: deploy again (gpubox builds "
        "it beside llama-server)"
    )


# ---------------------------------------------------------------- the best mode, the table


def modes(**tg: float | None) -> list[llamabench_results.ModeResult]:
    out = []
    for mode, value in tg.items():
        if value is None:
            out.append(llamabench_results.ModeResult(mode, False, {}, "exit status 1: refused"))
        else:
            text = run_output(3000.0, value, mode)
            out.append(llamabench_results.mode_result(mode, Output(0, text, "")))
    return out


def test_the_fastest_decode_wins():
    results = modes(layer=65.04, row=81.25, tensor=None)
    assert llamabench_results.best_mode(results).mode == "row"
    assert llamabench_results.advice(results, "layer") == (
        'set "llamacpp_split_mode": "row" (tg128 81.2 tok/s vs layer 65.0, tensor failed) '
        "(now layer)"
    )
    same = modes(layer=70.0, row=70.0)
    assert llamabench_results.best_mode(same).mode == "layer"  # the first of equals
    assert llamabench_results.advice(same, "layer").endswith("(already set)")
    noisy = modes(layer=70.0, row=71.0)  # a lead of 1.0 within 0.70 + 0.71 of stddev
    assert llamabench_results.best_mode(noisy, "layer").mode == "layer"
    assert llamabench_results.best_mode(noisy, "row").mode == "row"
    assert llamabench_results.advice(noisy, "layer") == (
        'set "llamacpp_split_mode": "layer" (tg128 70.0 tok/s vs row 71.0) (already set); row is '
        "faster by less than the runs' noise"
    )
    assert llamabench_results.best_mode(modes(layer=70.0, row=71.5), "layer").mode == "row"
    assert llamabench_results.advice(modes(row=None, tensor=None), "layer") == (
        'no split mode ran: keep "llamacpp_split_mode": "layer"'
    )


def served_report(decode_tps: float) -> dict[str, Any]:
    """A served report as bench_endpoint returns it: 4 requests of 256 prompt tokens with a
    median TTFT of 0.2 s at one stream."""
    gap = 1 / decode_tps
    results = [
        bench.RequestResult(
            ok=True, start=1.0, ttft=0.2, latency=0.2 + 127 * gap, output_tokens=128,
            prompt_tokens=256, server_decode_tps=decode_tps * 1.05,
        )
        for _ in range(4)
    ]  # fmt: skip
    return {"endpoint": {}, "levels": [bench.level_metrics(results, 10.0, 1)]}


def test_one_table_beside_the_served_figures():
    result = llamabench_results.HostResult(
        "box", "layer", modes(layer=65.04, row=81.25, tensor=None)
    )
    table = llamabench_results.format_table(result, served_report(60.0))
    lines = table.splitlines()
    assert lines[0] == (
        "box: llama-bench (qwen3next 80B.A3B Q4_K - Medium, CUDA, Tesla V100-SXM2-32GB, "
        "Tesla V100-SXM2-32GB, build 11312 (0c1e570))"
    )
    assert lines[1].split() == ["tok/s", "-sm", "layer", "-sm", "row", "-sm", "tensor"] + [
        "served,", "1", "stream",
    ]  # fmt: skip
    assert lines[2].split() == ["prompt", "(pp512)"] + ["3000.0", "±", "30.0"] * 2 + [
        "failed", "1280.0",
    ]  # fmt: skip
    assert lines[3].split() == [
        "decode", "(tg128)", "65.0", "±", "0.7", "81.2", "±", "0.8", "failed", "60.0",
    ]  # fmt: skip
    assert lines[4].split() == ["decode,", "server", "timing", "63.0"]
    assert "  -sm tensor failed: exit status 1: refused" in lines


def test_the_table_without_served_figures_and_with_wide_cells():
    result = llamabench_results.HostResult("box", "layer", modes(layer=65.0))
    table = llamabench_results.format_table(result, None)
    assert "served" not in table and "65.0 ± 0.7" in table
    wide = modes(layer=123456.0, row=123456.0)
    lines = llamabench_results.format_table(
        llamabench_results.HostResult("box", "layer", wide), None
    )
    assert lines.splitlines()[3].split() == ["decode", "(tg128)"] + ["123456.0", "±", "1234.6"] * 2


# ---------------------------------------------------------------- the record, the plan, the CLI


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def test_the_figures_join_the_hosts_bench_record(state_dir):
    bench.save_record(bench.summary_record(served_report(60.0) | {"endpoint": {
        "url": "http://box:8080", "model": "qwen3-next"}}, "2026-03-01"), "box")  # fmt: skip
    result = llamabench_results.HostResult("box", "layer", modes(layer=65.0, tensor=None))
    llamabench.save(result, PLAN, date="2026-03-02")
    record = bench.load_record("box", "http://box:8080")
    assert record is not None and record["date"] == "2026-03-01" and record["levels"]
    assert record["llama_bench"] == {
        "date": "2026-03-02",
        "split_mode": "layer",
        "modes": {
            "layer": {
                "pp512": {"avg_ts": 3000.0, "stddev_ts": 30.0},
                "tg128": {"avg_ts": 65.0, "stddev_ts": 0.65},
            },
            "tensor": {"error": "exit status 1: refused"},
        },
        "best": "layer",
        "model_type": "qwen3next 80B.A3B Q4_K - Medium",
    }
    # no served record yet: one is made for the llama-bench figures alone
    other = llamabench_host.Plan(**{**PLAN.__dict__, "name": "box2", "url": "http://box2:8080"})
    llamabench.save(result, other, date="2026-03-02")
    alone = bench.load_record("box2", "http://box2:8080")
    assert alone is not None and alone["levels"] == [] and "llama_bench" in alone


def test_the_plan_is_what_the_deploy_installs_and_serves():
    from gpubox.base.layout import LLAMA_SERVER as LLAMA_UNIT
    from gpubox.plans.llamacpp import llama_build
    from gpubox.plans.model import plan as model_plan

    data = {"ssh_hostname": "gpu1.example", "ssh_user": "admin", "_sudo": True}
    plan = llamabench.host_plan("box", data)
    config = load_host_config("box", data)
    assert plan.error is None
    assert plan.binary == llama_build(config).bench
    assert plan.model == model_plan(config).path
    assert plan.split_mode == "layer" and plan.gpu_count == 2 and plan.cuda and plan.sudo
    assert plan.health_url == "http://127.0.0.1:8080/health"
    assert plan.url == "http://gpu1.example:8080"
    assert "HostName gpu1.example" in plan.ssh_config and "User admin" in plan.ssh_config
    assert layout.LLAMA_SERVER == LLAMA_UNIT == BACKEND_UNITS["llamacpp"]
    vllm = llamabench.host_plan("box", {"backend": "vllm"})
    assert vllm.error == "backend is vllm: llama-bench measures llama.cpp only"


@pytest.mark.parametrize("mode", llamabench.SPLIT_MODES)
def test_each_mode_runs_as_the_server_would(mode):
    """The server's unit and flags for the mode (stages/llamacpp.py) and llama-bench's agree:
    the same split, -ngl, -fa, even GPU weights, KV cache types and environment."""
    from gpubox.stages.llamacpp import llama_args, llama_environment

    config = load_host_config("box", {"llamacpp_split_mode": mode})
    plan = llamabench.host_plan("box", {"llamacpp_split_mode": mode})
    server = llama_args(config, plan.model)
    mine = llamabench_host.argv_for(plan, mode)

    def value(args: list[str], flag: str) -> str | None:
        return args[args.index(flag) + 1] if flag in args else None

    for flag in ("-m", "-sm", "-ngl", "-fa", "-ctk", "-ctv"):
        assert value(mine, flag) == value(server, flag), flag
    assert value(mine, "-ts") == value(server, "-ts").replace(",", "/")
    env = llamabench_host.env_for(mode)
    assert [f"{k}={v}" for k, v in env.items()] == llama_environment(config)


def test_the_plan_reads_the_split_mode_key():
    plan = llamabench.host_plan("box", {"llamacpp_split_mode": "row"})
    assert plan.error is None and plan.split_mode == "row"


def test_the_options(capsys):
    parser = bench.build_parser()
    args = parser.parse_args(["--inventory", "inv.py", "--split-modes", "layer,tensor,layer"])
    assert args.split_modes == ["layer", "tensor"] and not args.llama_bench
    with pytest.raises(SystemExit):
        parser.parse_args(["--inventory", "inv.py", "--split-modes", "layer,rows"])
    assert "split modes are layer, row, tensor, comma separated (not rows)" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as exit_:
        bench.main(["http://box:8080", "--model", "m", "--llama-bench"])
    assert exit_.value.code == 2
    assert "--llama-bench and --split-modes need --inventory" in capsys.readouterr().err
    quiet = argparse.Namespace(llama_bench=False, split_modes=None)
    assert llamabench.main_hook(quiet, {}) == (0, None)


def test_the_records_line_for_doctor():
    result = llamabench_results.HostResult(
        "box", "layer", modes(layer=65.04, row=81.25, tensor=None)
    )
    entry = llamabench_results.record_entry(result, date="2026-03-02T10:00:00+0000")
    assert llamabench_results.summary_line(entry) == (
        "llama-bench 2026-03-02 -sm layer: pp512 3000 tok/s, tg128 65.0 tok/s; "
        "-sm row: pp512 3000 tok/s, tg128 81.2 tok/s; -sm tensor failed (best: row)"
    )
