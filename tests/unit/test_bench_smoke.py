"""`gpubox bench --smoke`: the four vLLM configurations built from the deployed unit's own
`docker run`, the sequence on the box (the unit stopped, each configuration started, awaited
and removed, the unit started again however the run ends), the choice and the printed table.

The figures: the llama.cpp row is the smoke test's own output on the sandbox's tiny model
(llama-server b11312 on the CPU, tests/integration/test_doctor.py on 2026-12-02: its seven
tokens reach the client through the SSH tunnel nearly at once, hence the measured decode speed
far above llama.cpp's own); the vLLM rows use the decode speed the
project's first user measured (vLLM 0.15.0, GPTQ Int4, tensor parallel 2 on two V100s: 11.7
tok/s) for the deployed configuration, and figures around it for the others."""

from __future__ import annotations

import shlex

import pytest
from helpers import REFERENCE

from gpubox.base import layout
from gpubox.bench import smoke, smoke_host
from gpubox.bench.smoke import CONTAINER, ENV_FILE, Plan, Row, Variant
from gpubox.checks import Output
from gpubox.config import load_host_config

VLLM = load_host_config("box", {**REFERENCE, "backend": "vllm"})


def test_four_configurations_from_the_units_docker_run():
    from gpubox.plans import vllm as plan_vllm

    plan = smoke.host_plan("box", {**REFERENCE, "backend": "vllm"})
    assert plan.error is None and plan.backend == "vllm" and plan.unit == layout.VLLM
    assert [(v.enforce_eager, v.mamba_float32) for v in plan.variants] == [
        (False, False),
        (False, True),
        (True, False),
        (True, True),
    ]
    unit_argv, args = plan_vllm.docker_argv(VLLM), plan_vllm.vllm_args(VLLM)
    assert "--enforce-eager" not in args  # the deployed default: CUDA graphs on
    for variant in plan.variants:
        words = shlex.split(variant.start.split(" && ")[-1])
        assert words[:3] == ["/usr/bin/docker", "run", "-d"] and "--rm" not in words
        assert words[words.index("--name") + 1] == CONTAINER
        assert words[words.index("--env-file") + 1] == ENV_FILE
        image = VLLM.catalog["vllm"]["image"]
        # everything else as the unit runs it: image, port, volumes, caches
        assert words[3 : words.index(image) + 1] == [
            {layout.VLLM: CONTAINER, layout.VLLM_ENV_FILE: ENV_FILE}.get(w, w)
            for w in unit_argv[3 : unit_argv.index(image) + 1]
        ]
        tail = words[words.index(image) + 1 :]
        flags = (["--enforce-eager"] if variant.enforce_eager else []) + (
            ["--mamba-ssm-cache-dtype", "float32"] if variant.mamba_float32 else []
        )
        assert tail == args + flags
    # the key is read from its file on the box, never on a command line
    assert f"sed -n '1s/^/VLLM_API_KEY=/p' {VLLM.api_key_file} > {ENV_FILE}" in variant.start


def test_the_flags_are_set_whatever_the_deployed_arguments_hold():
    args = ["/models/m", "--dtype", "half", "--enforce-eager", "--mamba-ssm-cache-dtype", "auto"]
    assert smoke.variant_args(args, False, True) == [
        "/models/m",
        "--dtype",
        "half",
        "--mamba-ssm-cache-dtype",
        "float32",
    ]
    assert smoke.variant_args(args, True, False) == [
        "/models/m",
        "--dtype",
        "half",
        "--enforce-eager",
    ]
    with pytest.raises(ValueError, match="does not end with vLLM's arguments"):
        smoke.variant_argv(["docker", "run", "img", "a"], ["b"], False, False)


def test_llama_cpp_measures_the_served_configuration_only():
    plan = smoke.host_plan("box", dict(REFERENCE))
    assert (plan.backend, plan.unit, plan.variants) == ("llamacpp", layout.LLAMA_SERVER, [])
    assert plan.health_url == "http://127.0.0.1:8080/health"
    assert smoke.host_plan("box", {**REFERENCE, "backend": "none"}).error == (
        "backend is none: nothing is served"
    )


# --------------------------------------------------------------------------- the choice

SANDBOX_ROW = Row("served", "(as deployed)", short_ttft_ms=54.0, long_ttft_ms=230.0)
SANDBOX_ROW.decode_tps, SANDBOX_ROW.server_tps = 17633.2, 1464.8


def vllm_rows() -> list[Row]:
    def row(eager: bool, mamba: bool, tps: float | None, **kw) -> Row:
        v = Variant(eager, mamba)
        return Row(v.name, v.flags, eager, mamba, decode_tps=tps, **kw)

    return [
        row(False, False, 11.7, short_ttft_ms=310.0, long_ttft_ms=905.0),
        row(
            False,
            True,
            None,
            error="the container stopped (exited 1) before /health answered: CUDA error",
        ),
        row(
            True,
            False,
            13.2,
            short_ttft_ms=290.0,
            long_ttft_ms=880.0,
            problems=[
                "the short prompt's answer content is one character repeated ('!' 64 of 64 "
                "times): '!!!!'"
            ],
        ),
        row(True, True, 9.8, short_ttft_ms=330.0, long_ttft_ms=990.0),
    ]


def test_the_fastest_sane_configuration_is_kept():
    rows = vllm_rows()
    assert smoke.keep(rows) is rows[0]  # 13.2 tok/s answered !!!!; 9.8 is slower
    rows[0].problems.append("the long prompt failed: HTTP 500: boom")
    assert smoke.keep(rows) is rows[3]
    rows[3].error = "did not start"
    assert smoke.keep(rows) is None


def test_the_table_and_the_advice():
    rows = vllm_rows()
    assert smoke.format_table("box", "vllm", rows) == "\n".join(
        [
            "smoke test of box (vllm):",
            "  configuration        flags                                            "
            "answers        TTFT short  TTFT long  decode tok/s  server's tok/s",
            "  graphs, ssm half     (neither)                                        "
            "text           310 ms      905 ms     11.7          -",
            "  graphs, ssm float32  --mamba-ssm-cache-dtype float32                  "
            "did not start  -           -          -             -",
            "  eager, ssm half      --enforce-eager                                  "
            "GARBAGE        290 ms      880 ms     13.2          -",
            "  eager, ssm float32   --enforce-eager --mamba-ssm-cache-dtype float32  "
            "text           330 ms      990 ms     9.8           -",
            "  graphs, ssm float32: the container stopped (exited 1) before /health answered: "
            "CUDA error",
            "  eager, ssm half: the short prompt's answer content is one character repeated "
            "('!' 64 of 64 times): '!!!!'",
        ]
    )
    assert smoke.advice("vllm", False, rows) == (
        "keep: graphs, ssm half ((neither), 11.7 tok/s)\n"
        '  set in the inventory: "vllm_enforce_eager": False (the deployed value)\n'
        '  set in the inventory: "vllm_mamba_ssm_cache_dtype": "auto" (the deployed value)'
    )
    rows[0].error = "did not start"
    assert smoke.advice("vllm", False, rows) == (
        "keep: eager, ssm float32 (--enforce-eager --mamba-ssm-cache-dtype float32, 9.8 tok/s)\n"
        '  set in the inventory: "vllm_enforce_eager": True\n'
        '  set in the inventory: "vllm_mamba_ssm_cache_dtype": "float32"'
    )
    assert smoke.advice("vllm", False, rows, "float32").endswith(
        '"vllm_mamba_ssm_cache_dtype": "float32" (the deployed value)'
    )
    rows[3].problems.append("the long prompt's answer is empty")
    assert smoke.advice("vllm", False, rows).startswith("keep: none -- no configuration")


def test_llama_cpp_keeps_what_it_serves():
    assert smoke.advice("llamacpp", False, [SANDBOX_ROW]) == (
        "keep: served (the deployed configuration; nothing to set)"
    )
    assert smoke.format_table("gpubox-sandbox", "llamacpp", [SANDBOX_ROW]).splitlines()[2] == (
        "  served         (as deployed)  text     54 ms       230 ms     17633.2       1464.8"
    )


# --------------------------------------------------------------------------- on the box


class FakeBox:
    """A runner that answers each command by its kind and logs the kinds in order."""

    def __init__(self, health: list[str], states: list[str] | None = None, active="active"):
        self.health, self.states, self.active = list(health), list(states or []), active
        self.log: list[str] = []

    def __call__(self, command: str) -> Output:
        if command.startswith("systemctl is-active"):
            return Output(0, self.active + "\n")
        if command.startswith(("systemctl stop", "systemctl start")):
            self.log.append(command)
            return Output(0, "")
        if "/health" in command:
            self.log.append("health")
            return Output(0, self.health.pop(0) if self.health else "200")
        if command.startswith("docker inspect"):
            return Output(0, (self.states.pop(0) if self.states else "running 0") + "\n")
        if command.startswith("docker logs"):
            return Output(0, "INFO loading\nRuntimeError: CUDA error: no kernel image\n")
        if command.startswith("docker rm"):
            self.log.append("remove")
            return Output(0, "")
        if CONTAINER in command and "docker run" in command:
            flags = [f for f in ("--enforce-eager", "float32") if f in command]
            self.log.append("start " + (" ".join(flags) or "plain"))
            return Output(0, "c0ffee\n")
        raise AssertionError(f"unexpected command {command}")


def vllm_plan() -> Plan:
    return smoke.host_plan("box", {**REFERENCE, "backend": "vllm"})


def test_each_configuration_runs_in_turn_and_the_unit_comes_back():
    box, said, measured = FakeBox(health=["000", "200"] + ["200"] * 10), [], []

    def measure(row: Row) -> None:
        measured.append(row.name)
        row.decode_tps = 10.0

    result = smoke_host.smoke_host(box, vllm_plan(), measure, said.append, lambda s: None)
    assert box.log == [
        f"systemctl stop {layout.VLLM}",
        "start plain",
        "health",
        "health",
        "remove",
        "start float32",
        "health",
        "remove",
        "start --enforce-eager",
        "health",
        "remove",
        "start --enforce-eager float32",
        "health",
        "remove",
        "remove",
        f"systemctl start {layout.VLLM}",
        "health",
    ]
    assert len(measured) == 4 and result.restart_error is None and result.error is None
    assert said[0].startswith("box: stopping gpubox-vllm for the smoke test")


def test_a_configuration_that_dies_is_named_with_its_log_and_the_others_still_run():
    box = FakeBox(health=["000"] * 2 + ["200"] * 10, states=["exited 1"])
    result = smoke_host.smoke_host(box, vllm_plan(), lambda row: None, lambda s: None)
    assert result.rows[0].error == (
        "the container stopped (exited 1) before /health answered: INFO loading | "
        "RuntimeError: CUDA error: no kernel image"
    )
    assert [r.error for r in result.rows[1:]] == [None] * 3
    assert box.log[-2:] == [f"systemctl start {layout.VLLM}", "health"]


@pytest.mark.parametrize("failure", [KeyboardInterrupt, ConnectionResetError])
def test_ctrl_c_or_a_failure_still_starts_the_unit(failure):
    box = FakeBox(health=["200"] * 10)

    def measure(row: Row) -> None:
        raise failure()

    result = smoke_host.smoke_host(box, vllm_plan(), measure, lambda s: None, lambda s: None)
    assert box.log[-3:] == ["remove", f"systemctl start {layout.VLLM}", "health"]
    assert result.interrupted == (failure is KeyboardInterrupt)
    assert result.restart_error is None


def test_a_stopped_unit_is_left_stopped_and_llama_cpp_is_never_stopped():
    box = FakeBox(health=["200"] * 10, active="inactive")
    smoke_host.smoke_host(box, vllm_plan(), lambda row: None, lambda s: None, lambda s: None)
    assert not any(c.startswith("systemctl") for c in box.log)
    box = FakeBox(health=["200"])
    plan = smoke.host_plan("box", dict(REFERENCE))
    result = smoke_host.smoke_host(box, plan, lambda row: None, lambda s: None)
    assert box.log == ["health"] and [r.name for r in result.rows] == ["served"]
    box = FakeBox(health=["000"], active="failed")
    result = smoke_host.smoke_host(box, plan, lambda row: None, lambda s: None)
    assert result.error == "gpubox-llama-server is failed and /health answers 000: deploy first"
