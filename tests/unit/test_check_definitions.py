"""gpubox.checks on recorded outputs: every check passes on a converged box (or says why it does
not apply), one planted fault in its facts fails exactly that check, a missing tool is an error
naming its command, and the API-key check never shows the key.

The outputs are test_doctor.py's converged box (the stand-in nvidia-smi, lspci and dcgmi, and
every other command in its real format), plus those of the facts that act on the box: a
container's `nvidia-smi -L` and `dcgmi dmon` from the stand-ins, gpu-burn from
tests/fixtures/gpu-burn, tool-call answers in the shape llama-server gives the sandbox's tiny
model (gpubox.knowledge.openai_shape reads them)."""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REFERENCE
from test_doctor import (
    TARGET,
    StandinHost,
    converged_outputs,
    fixture,
    http,
    pin_files,
    pins_output,
    section,
    systemctl_show,
)

from gpubox import checks, parsers
from gpubox.base import layout
from gpubox.checks import tools
from gpubox.checks.core import FACTS, Output, Reading, Recorded
from gpubox.config import HostConfig, load_host_config, target_for
from gpubox.sandbox import tinymodel
from gpubox.sandbox.standin import state as st

INVENTORY = "inventories/box.py"
CONFIGS = {
    # the reference box: llama.cpp on both GPUs
    "llamacpp": load_host_config("box", {**REFERENCE, "nvlink_links": 2}),
    # vLLM, with dcgm-exporter and a user in the docker group
    "vllm": load_host_config(
        "box",
        {
            **REFERENCE,
            "nvlink_links": 2,
            "backend": "vllm",
            "dcgm_exporter": True,
            "docker_users": ["alice"],
            "panel": "1panel",
            "monitoring": "prometheus",
        },
    ),
}
# What does not apply to each, and why (the checks' own reasons are asserted as given).
SKIPPED = {
    "llamacpp": {
        "docker.users",
        "dcgm.exporter",
        "dcgm.exporter-hostname",
        "vllm.container",
        "vllm.caches",
        "vllm.warm",
        "vllm.compat",
        "panel.services",
        "panel.socket",
        "panel.login",
        "panel.settings",
        "monitoring.node-exporter",
        "monitoring.services",
        "monitoring.targets",
        "monitoring.rules",
    },
    "vllm": {
        "backend.slots",
        "backend.build",
        "backend.metrics",
        "model.verified",
        "model.checksum",
    },
}


@functools.cache
def standin_outputs() -> dict[str, str]:
    """What the sandbox's stand-ins print for the GPU facts (and a container's nvidia-smi -L),
    and for dcgmi discovery with GPU 1 gone."""
    with tempfile.TemporaryDirectory(prefix="gpubox-checks-") as tmp:
        host = StandinHost(Path(tmp))
        outputs = {}
        for name in ("smi_query", "nvlink", "topo", "lspci", "dcgm_discovery", "dcgm_dmon"):
            command = FACTS[name].command
            assert isinstance(command, str)
            out = host.standin(command)
            assert out.rc == 0, out
            outputs[name] = out.stdout
        outputs["list"] = host.standin("nvidia-smi -L").stdout
        st.set_gpu_present(host.state, 1, False)
        outputs["dcgm_discovery_one_gpu"] = host.standin(
            str(FACTS["dcgm_discovery"].command)
        ).stdout
    return outputs


def uuids() -> list[str]:
    """The UUIDs of the stand-in's GPUs."""
    return [row["uuid"] for row in FACTS["smi_query"].parse(standin_outputs()["smi_query"])]


def compute_apps(gpus: list[str]) -> str:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory
    --format=csv,noheader,nounits`: llama-server on each of ``gpus``."""
    return "".join(
        f"{uuid}, 2345, /opt/llama.cpp/b11312/bin/llama-server, 30442\n" for uuid in gpus
    )


def tool_call_whole() -> str:
    """llama-server's answer to openai_shape.tool_request (not streamed), as it answers the
    sandbox's tiny model."""
    message = {
        "role": "assistant",
        "content": "",
        "reasoning_content": tinymodel.TOOL_REASONING + "\n",
        "tool_calls": [
            {
                "type": "function",
                "function": {
                    "name": tinymodel.TOOL_NAME,
                    "arguments": json.dumps(tinymodel.TOOL_ARGUMENTS),
                },
                "id": "riRiXVVMzZAhuYol8H7LMEGSRu2PdCEQ",
            }
        ],
    }
    body = {
        "choices": [{"finish_reason": "tool_calls", "index": 0, "message": message}],
        "created": 1796105310,
        "model": "qwen3-next",
        "object": "chat.completion",
        "id": "chatcmpl-eTbzj7pE5XtKBImlr4eCK5opaaITV5oR",
    }
    return http(200, json.dumps(body, separators=(",", ":")))


def tool_call_stream(done: bool = True) -> str:
    """The same answer streamed: the reasoning, then the call's id and name, then its
    arguments in two pieces, then the finish reason and [DONE]."""
    chunk = {"created": 1796105310, "id": "chatcmpl-TprhF", "model": "qwen3-next"}
    arguments = json.dumps(tinymodel.TOOL_ARGUMENTS)
    call = {"index": 0, "id": "TUZxp3NW7b1BvX6QFuUQgLVhg7cWZec4", "type": "function"}
    deltas: list[tuple[dict, str | None]] = [
        ({"role": "assistant", "content": None}, None),
        ({"reasoning_content": tinymodel.TOOL_REASONING + "\n"}, None),
        (
            {"tool_calls": [{**call, "function": {"name": tinymodel.TOOL_NAME, "arguments": "{"}}]},
            None,
        ),
        ({"tool_calls": [{"index": 0, "function": {"arguments": arguments[1:]}}]}, None),
        ({}, "tool_calls"),
    ]
    events = [
        "data: "
        + json.dumps(
            {"choices": [{"finish_reason": f, "index": 0, "delta": d}], **chunk},
            separators=(",", ":"),
        )
        for d, f in deltas
    ]
    if done:
        events.append("data: [DONE]")
    return http(200, "\n\n".join(events) + "\n\n")


def gpu_burn(verdicts: tuple[str, str] = ("OK", "OK")) -> str:
    """`gpu-burn 5 2>&1` on two GPUs: the two-GPU transcript's progress, then the end of a
    run and its verdicts in the current format (the one-GPU transcript's)."""
    progress = fixture("gpu-burn/burn_2xRTX4090_gpu-burn-issue96_excerpt.txt")
    end = fixture("gpu-burn/burn_1xRTX3060_fatbin_nixpkgs-pr524738.txt")
    end = end[end.index("Killing processes") :]
    end = end.replace(
        "Freed memory for dev 0\n", "Freed memory for dev 0\nFreed memory for dev 1\n"
    )
    end = re.sub(r"Tested 1 GPUs:\n.*", "Tested 2 GPUs:\n", end, flags=re.S)
    return progress + end + "".join(f"\tGPU {i}: {v}\n" for i, v in enumerate(verdicts))


def active_outputs(config: HostConfig) -> dict[str, str | Output]:
    """What the facts that act on the box print on a converged one."""
    from gpubox.plans import model as plan_model

    listing = standin_outputs()["list"]
    container = "7c9e6b0d2f4a" + "0" * 52 + "\n"
    plan = plan_model.plan(config)
    return {
        "container_all": listing,
        "container_cdi": listing,
        "daemon_reload": section("start", container)
        + section("before", listing)
        + section("after", listing),
        "dcgm_dmon": standin_outputs()["dcgm_dmon"],
        "gpu_burn_list": "".join(
            f"ID {i}: Tesla V100-SXM2-32GB, 34089MB\n" for i in range(config.gpu_count)
        ),
        "gpu_burn_short": gpu_burn(),
        "model_sha256": f"{plan.sha256}  {plan.path}\n",
        "tool_call_whole": tool_call_whole(),
        "tool_call_streamed": tool_call_stream(),
        "vllm_compat": "",
    }


def converged(config: HostConfig) -> dict[str, Output]:
    """Every fact's output on a converged box with ``config`` (those the config reads)."""
    gpu = {k: v for k, v in standin_outputs().items() if k in FACTS}
    texts: dict[str, str | Output] = {
        **converged_outputs(config),
        **gpu,
        "smi_apps": compute_apps(uuids()),
        **active_outputs(config),
    }
    outputs = {}
    for name, fact in FACTS.items():
        command = fact.command_for(config, TARGET)
        if command is None:
            continue
        text = texts[name]
        out = text if isinstance(text, Output) else Output(0, text)
        outputs[name] = Output(out.rc, out.stdout, out.stderr, command)
    return outputs


def recorded(config: HostConfig, outputs: dict[str, Output]) -> Recorded:
    """The facts, with the OS target read from their os-release as a host's facts read it."""
    out = outputs.get("os_release")
    try:
        release = parsers.parse_os_release(out.stdout) if out and out.rc == 0 else None
    except parsers.ParseError:
        release = None
    return Recorded(outputs, target_for(release, config.catalog) if release else None)


def verdicts(name: str, outputs: dict[str, Output] | None = None) -> list[checks.Verdict]:
    config = CONFIGS[name]
    facts = recorded(config, outputs if outputs is not None else converged(config))
    return checks.run(checks.ALL, "box", config, facts, INVENTORY)


# --------------------------------------------------------------------------- (a) converged


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_check_passes_on_a_converged_box_or_says_why_not(name: str):
    results = verdicts(name)
    assert [v.check for v in results] == [c.id for c in checks.ALL]
    assert {v.check: str(v) for v in results if v.status not in ("pass", "skip")} == {}
    skipped = {v.check: v.message for v in results if v.status == "skip"}
    assert set(skipped) == SKIPPED[name]
    assert all(skipped.values()), skipped  # each with its reason


def test_the_skip_reasons_are_the_configs():
    reasons = {v.check: v.message for v in verdicts("llamacpp") if v.status == "skip"}
    assert reasons["dcgm.exporter"] == "dcgm_exporter is off in the inventory"
    assert reasons["vllm.container"] == "vLLM is not the backend"
    reasons = {v.check: v.message for v in verdicts("vllm") if v.status == "skip"}
    assert reasons["model.checksum"] == "llama.cpp is not the backend"


def test_a_cpu_build_of_llama_cpp_skips_the_gpu_memory_check():
    config = load_host_config("box", {**REFERENCE, "nvlink_links": 2, "llamacpp_cuda": False})
    verdict = checks.judge(
        checks.BY_ID["backend.gpu-memory"],
        "box",
        config,
        recorded(config, converged(config)),
        INVENTORY,
    )
    assert (verdict.status, verdict.message) == (
        "skip",
        "llama.cpp is built for the CPU (llamacpp_cuda false)",
    )


def test_a_desktops_nvidia_named_packages_are_not_another_driver():
    """Ubuntu 24.04 Desktop's nvidia-settings (510.47.03, its own source), egl-wayland and
    nvidia-prime stay beside the pinned driver; a leftover build of another driver does not."""
    config = CONFIGS["llamacpp"]
    outputs = converged(config)
    desktop = (
        "nvidia-settings\t510.47.03-0ubuntu4.24.04.1\tii \n"
        "libnvidia-egl-wayland1\t1:1.1.13-1ubuntu0.1\tii \n"
        "nvidia-prime\t0.8.17.2\tii \n"
    )
    outputs["dpkg"] = Output(0, outputs["dpkg"].stdout + desktop, "")
    check = checks.BY_ID["driver.one-branch"]
    assert checks.judge(check, "box", config, recorded(config, outputs), INVENTORY).status == "pass"
    outputs["dpkg"] = Output(
        0, outputs["dpkg"].stdout + "nvidia-utils-580\t580.95.05-0ubuntu1\tii \n", ""
    )
    verdict = checks.judge(check, "box", config, recorded(config, outputs), INVENTORY)
    assert verdict.status == "fail" and "nvidia-utils-580" in verdict.message
    assert "nvidia-settings" not in verdict.message


def test_a_required_burn_in_that_is_old_fails():
    config = load_host_config("box", {**REFERENCE, "burnin_required": True})
    out = converged(CONFIGS["llamacpp"])["burnin"]
    date = datetime.datetime.fromisoformat(json.loads(out.stdout)["date"])
    reading = Reading(config, recorded(config, {"burnin": out}))
    assert tools.burnin_record(config, reading, now=date) is None
    late = date + datetime.timedelta(days=config.burnin_max_age_days + 1)
    assert tools.burnin_record(config, reading, now=late) == (
        f"the last burn-in is {config.burnin_max_age_days + 1} days old "
        f"(burnin_max_age_days {config.burnin_max_age_days})"
    )


# --------------------------------------------------------------------------- (b) faults


def replace(old: str, new: str, count: int = 1) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, (old, text[:500])
        return text.replace(old, new, count)

    return edit


def drop_lines(needle: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        kept = [ln for ln in text.splitlines(keepends=True) if needle not in ln]
        assert len(kept) < len(text.splitlines()), (needle, text[:500])
        return "".join(kept)

    return edit


def edit_json(change: Callable[[dict], object], status: int | None = None) -> Callable[[str], str]:
    """Edit an HTTP fact's JSON body (or a plain JSON output)."""

    def edit(text: str) -> str:
        code, sep, body = text.partition("\n")
        if not sep or not code.isdigit():
            data = json.loads(text)
            change(data)
            return json.dumps(data)
        data = json.loads(body)
        change(data)
        return http(status or int(code), data)

    return edit


def _set(path: str, value: object) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value

    return change


@dataclass(frozen=True)
class Fault:
    """One planted fault: the fact's output edited (a function of the converged one) or
    replaced (a string); ``rc`` and ``stderr`` for a command that fails; ``config`` the one it
    is planted on; ``errors``: checks that then cannot tell (and say so)."""

    fact: str
    edit: Callable[[str], str] | str
    config: str = "llamacpp"
    rc: int = 0
    stderr: str = ""
    errors: frozenset[str] = frozenset()

    def plant(self, outputs: dict[str, Output]) -> None:
        out = outputs[self.fact]
        stdout = self.edit if isinstance(self.edit, str) else self.edit(out.stdout)
        assert stdout != out.stdout or self.rc != out.rc, "the fault changes nothing"
        outputs[self.fact] = Output(self.rc, stdout, self.stderr, out.command)


def services(**states: str) -> str:
    base = {
        layout.PERSISTENCED: "active",
        layout.DOCKER: "active",
        layout.DCGM: "active",
        layout.LLAMA_SERVER: "active",
        layout.VLLM: "missing",
    }
    return systemctl_show({**base, **{k.replace("_", "-"): v for k, v in states.items()}})


def _holds_without(*names: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        kept = [ln for ln in text.splitlines() if ln not in names]
        assert len(kept) == len(text.splitlines()) - len(names)
        return "".join(f"{ln}\n" for ln in kept)

    return edit


def _second_gpu(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        first, second = text.splitlines()
        assert old in second
        return f"{first}\n{second.replace(old, new)}\n"

    return edit


def _dmon_warming_up(text: str) -> str:
    """Only the first sample: the profiling fields still N/A."""
    lines = text.splitlines(keepends=True)
    return "".join(lines[:4])


def _one_gpu_discovered(text: str) -> str:
    return standin_outputs()["dcgm_discovery_one_gpu"]


def _failed_burn_in(record: dict) -> None:
    record.update(passed=False, problems=["GPU 1: gpu-burn says FAULTY"])
    record["gpu_burn"]["gpus"]["1"] = "FAULTY"


def _no_caches(data: dict) -> None:
    data[0]["Mounts"] = [m for m in data[0]["Mounts"] if m["Destination"] != "/root/.triton"]


TOOLKIT = CONFIGS["llamacpp"].catalog["container_toolkit"]["packages"]
DCGM = CONFIGS["llamacpp"].catalog["dcgm"]["packages"]
DRIVER = CONFIGS["llamacpp"].driver_packages("debian")
DRIVER_ERRORS = frozenset(
    {
        "driver.version",
        "driver.held",
        "driver.candidate",
        "driver.pins",
        "driver.one-branch",
        "driver.unattended",
    }
)
BAD_STREAM = http(
    200,
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant",'
    '"content":null}}]}\n\ndata: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}]}'
    "\n\ndata: [DONE]\n\n",
)

FAULTS: dict[str, Fault] = {
    "os.supported": Fault(
        "os_release",
        lambda text: text.replace("12", "11").replace("bookworm", "bullseye"),
        errors=DRIVER_ERRORS,
    ),
    "gpu.listed": Fault("smi_query", _second_gpu("V100-SXM2-32GB", "V100-SXM2-16GB")),
    "gpu.persistence": Fault("smi_query", _second_gpu("Enabled", "Disabled")),
    "driver.loaded": Fault("module_version", "570.195.03\n"),
    "driver.version": Fault(
        "dpkg",
        replace(
            f"nvidia-kernel-dkms\t{DRIVER.package_version}\thi ",
            f"nvidia-kernel-dkms\t{DRIVER.package_version}\tiU ",
        ),
    ),
    "driver.held": Fault("holds", _holds_without("nvidia-kernel-dkms")),
    "driver.candidate": Fault(
        "policy", replace(f"Candidate: {DRIVER.package_version}", "Candidate: 580.105.08-1")
    ),
    "driver.pins": Fault(
        "pins",
        pins_output({k: v for k, v in pin_files(CONFIGS["llamacpp"]).items() if "dcgm" not in k}),
    ),
    "driver.one-branch": Fault(
        "dpkg", lambda text: text + "libnvidia-compute-580\t580.105.08-1\tii \n"
    ),
    "driver.unattended": Fault("unattended", drop_lines('"^nvidia-kernel-dkms$"')),
    "driver.kernels": Fault("kernels", lambda text: text + "K 6.1.0-31-amd64\n"),
    "driver.nouveau": Fault("nouveau", "yes\n"),
    "driver.secure-boot": Fault(
        "mok", lambda text: text.replace("LOADED nvidia PO", "LOADED nvidia POE")
    ),
    "driver.persistenced": Fault("services", services(nvidia_persistenced="inactive")),
    "nvlink.links": Fault("nvlink", replace("Link 0: 25.781 GB/s", "Link 0: <inactive>")),
    "nvlink.topology": Fault("topo", replace("NV2", "SYS", 2)),
    "cuda.nvcc": Fault("nvcc", replace("/usr/local/cuda-12.8/bin/nvcc", "/usr/bin/nvcc")),
    "cuda.link": Fault("cuda_link", "/usr/local/cuda-12.4\n"),
    "cuda.ldconfig": Fault("ldconfig_cudart", "/usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89\n"),
    "cuda.no-13": Fault("cuda13_dirs", "/usr/local/cuda-13.0\n"),
    "docker.service": Fault("services", services(docker="failed")),
    "docker.users": Fault(
        "docker_users", replace("alice:alice sudo docker", "alice:alice sudo"), config="vllm"
    ),
    "docker.runtime": Fault("docker_info", edit_json(_set("Runtimes", {"runc": {}}))),
    "docker.daemon-json": Fault("daemon_json", '{\n    "log-driver": "journald"\n}\n'),
    "toolkit.packages": Fault("holds", _holds_without(*TOOLKIT)),
    "toolkit.cdi-spec": Fault("cdi_list", drop_lines("nvidia.com/gpu=1")),
    "docker.gpus-all": Fault("container_all", drop_lines("GPU 1:")),
    "docker.cdi-container": Fault("container_cdi", drop_lines("GPU 0:")),
    "docker.daemon-reload": Fault(
        "daemon_reload",
        lambda text: (
            text[: text.index(section("after", ""))]
            + section("after", "Failed to initialize NVML: Unknown Error\n")
        ),
    ),
    "dcgm.packages": Fault("holds", _holds_without(*DCGM)),
    "dcgm.service": Fault("services", services(nvidia_dcgm="inactive")),
    "dcgm.localhost": Fault("listening", replace("127.0.0.1:5555", "0.0.0.0:5555")),
    "dcgm.discovery": Fault("dcgm_discovery", _one_gpu_discovered),
    "dcgm.nvlink-fields": Fault("dcgm_dmon", _dmon_warming_up),
    "dcgm.exporter": Fault(
        "exporter_metrics", drop_lines("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"), config="vllm"
    ),
    # the unit before the fix: --remote-hostengine-info 127.0.0.1:5555 labels every metric so
    "dcgm.exporter-hostname": Fault(
        "exporter_metrics", replace('Hostname="v100-box"', 'Hostname="127.0.0.1"', 2), "vllm"
    ),
    "tools.gpu-burn": Fault("gpu_burn_list", drop_lines("ID 1:")),
    "tools.burn": Fault("gpu_burn_short", gpu_burn(("OK", "FAULTY"))),
    "tools.nvtop": Fault("nvtop", "NVTOP version 1.0.0\n"),
    "burnin.record": Fault("burnin", edit_json(_failed_burn_in)),
    "backend.service": Fault("services", services(gpubox_llama_server="failed")),
    "backend.only-one": Fault("services", services(gpubox_vllm="active")),
    "backend.health": Fault("health", "503"),
    "backend.key": Fault("key_file", "root 644 43\n"),
    "backend.auth": Fault("api_unauthorized", lambda text: "200" + text[3:]),
    "backend.models": Fault("api_models", edit_json(_set("data.0.id", "tiny"))),
    "backend.chat": Fault("api_chat", BAD_STREAM),
    "backend.sane": Fault("sane_short", edit_json(_set("choices.0.message.content", "!" * 64))),
    "backend.slots": Fault("api_props", edit_json(_set("total_slots", 1))),
    "backend.build": Fault(
        "llama_build", replace("build 11312, commit 0c1e570", "build 1, commit a")
    ),
    "backend.metrics": Fault(
        "api_metrics",
        http(
            501,
            {
                "error": {
                    "code": 501,
                    "message": "This server does not support metrics "
                    "endpoint. Start it with `--metrics`",
                    "type": "not_supported_error",
                }
            },
        ),
    ),
    "backend.gpu-memory": Fault("smi_apps", lambda text: text.splitlines(keepends=True)[0]),
    "model.verified": Fault("model_state", replace("file=size=48876255232", "file=size=1048576")),
    "model.checksum": Fault("model_sha256", lambda text: "0" * 64 + text[64:]),
    "backend.tool-call-whole": Fault(
        "tool_call_whole",
        edit_json(
            _set(
                "choices.0.message",
                {"role": "assistant", "content": '<tool_call>{"name": "get_weather"}</tool_call>'},
            )
        ),
    ),
    "backend.tool-call-streamed": Fault("tool_call_streamed", tool_call_stream(done=False)),
    "watchdog.timer": Fault(
        "watchdog",
        replace(
            "ActiveState=active\nUnitFileState=enabled",
            "ActiveState=inactive\nUnitFileState=disabled",
        ),
    ),
    "panel.services": Fault(
        "panel",
        replace(
            "ActiveState=active\nUnitFileState=enabled", "ActiveState=failed\nUnitFileState=enabled"
        ),
        "vllm",
    ),
    "panel.socket": Fault("panel", replace("@@gpubox socket\nyes", "@@gpubox socket\nno"), "vllm"),
    # a wrong entrance: 1Panel's "Access Temporarily Unavailable" page, with status 200
    "panel.login": Fault(
        "panel",
        replace("status=200\nmark=0\nmark=1\nmark=2\n", "status=200\nunavailable\n"),
        "vllm",
    ),
    "panel.settings": Fault("panel", replace("user=gpubox", "user=admin"), "vllm"),
    "monitoring.node-exporter": Fault("monitor", replace("gpubox_gpus_expected 2\n", ""), "vllm"),
    "monitoring.services": Fault(
        "monitor",
        replace(
            "Id=prometheus.service\nLoadState=loaded\nActiveState=active",
            "Id=prometheus.service\nLoadState=loaded\nActiveState=failed",
        ),
        "vllm",
    ),
    "monitoring.targets": Fault(
        "monitor",
        replace(
            '"scrapeUrl": "http://127.0.0.1:9400/metrics", "health": "up"',
            '"scrapeUrl": "http://127.0.0.1:9400/metrics", "health": "down"',
        ),
        "vllm",
    ),
    "monitoring.rules": Fault(
        "monitor", replace('{"name": "NvlinkDown", ', '{"name": "NvlinkDownX", '), "vllm"
    ),
    "vllm.container": Fault(
        "vllm_inspect", edit_json(_set("0.Config.Image", "vllm/vllm-openai:latest")), "vllm"
    ),
    "vllm.caches": Fault("vllm_inspect", edit_json(_no_caches), "vllm"),
    "vllm.warm": Fault("vllm_cache_files", section("triton", "") + section("vllm", ""), "vllm"),
    "vllm.compat": Fault(
        "vllm_compat",
        "",
        "vllm",
        rc=1,
        stderr="vllm/vllm-openai:v0.19.1 has no /usr/local/cuda-12.9/compat/libcuda.so.*: it is "
        "built on CUDA 12.9, newer than the CUDA 12.8 of the driver\n",
    ),
}


def test_every_check_has_a_planted_fault():
    assert set(FAULTS) == set(checks.BY_ID), "a check without a fault that fails it"


@pytest.mark.parametrize("check_id", list(FAULTS))
def test_one_planted_fault_fails_exactly_its_check(check_id: str):
    fault = FAULTS[check_id]
    config = CONFIGS[fault.config]
    assert fault.fact in checks.BY_ID[check_id].reads
    outputs = converged(config)
    fault.plant(outputs)
    results = {v.check: v for v in verdicts(fault.config, outputs)}
    failed = {i: str(v) for i, v in results.items() if v.status == "fail"}
    assert list(failed) == [check_id], failed
    errors = {i for i, v in results.items() if v.status == "error"}
    assert errors == fault.errors, {i: str(results[i]) for i in errors}
    verdict = results[check_id]
    assert verdict.message.startswith("box: ") and verdict.fix and "{" not in verdict.fix


def test_the_findings_name_the_part_and_the_fix():
    def finding(check_id: str) -> checks.Verdict:
        fault = FAULTS[check_id]
        outputs = converged(CONFIGS[fault.config])
        fault.plant(outputs)
        return next(v for v in verdicts(fault.config, outputs) if v.check == check_id)

    assert str(finding("os.supported")) == (
        "box: unsupported OS Debian GNU/Linux 11 (bullseye) -> gpubox supports Ubuntu 24.04 "
        "and Debian 12: reinstall the host with one of them"
    )
    assert str(finding("burnin.record")) == (
        f"box: the last burn-in failed: GPU 1: gpu-burn says FAULTY -> gpubox burnin {INVENTORY}"
    )
    assert str(finding("driver.held")) == (
        f"box: driver packages not held: nvidia-kernel-dkms -> pyinfra {INVENTORY} deploy/driver.py"
    )
    assert str(finding("driver.pins")) == (
        f"box: apt pin {layout.DCGM_PIN} is missing -> pyinfra {INVENTORY} deploy/dcgm.py"
    )
    assert str(finding("dcgm.exporter-hostname")) == (
        'box: dcgm-exporter labels its metrics Hostname="127.0.0.1", not this box\'s name '
        '"v100-box": its unit must name the host engine --remote-hostengine-info v100-box:5555 '
        "(with --add-host v100-box:127.0.0.1), as gpubox's unit does -> systemctl cat "
        "gpubox-dcgm-exporter (a drop-in's ExecStart overrides gpubox's); "
        f"pyinfra {INVENTORY} deploy/dcgm.py"
    )
    assert str(finding("dcgm.localhost")) == (
        "box: nv-hostengine listens beyond localhost: ['0.0.0.0:5555'] -> "
        f"pyinfra {INVENTORY} deploy/dcgm.py"
    )
    assert str(finding("tools.burn")) == (
        "box: gpu-burn tested 2 GPU(s); not OK: {1: 'FAULTY'} -> "
        f"pyinfra {INVENTORY} deploy/tools.py"
    )
    assert finding("backend.tool-call-whole").message.startswith(
        "box: the whole answer to a request with a tool is not a parsed tool call: "
        "no tool call (finish_reason 'tool_calls'"
    )
    assert finding("backend.tool-call-streamed").message.startswith(
        "box: the streamed answer to a request with a tool is not a parsed tool call: "
        "the stream did not end with data: [DONE]"
    )
    assert str(finding("backend.sane")) == (
        "box: the answer to the short prompt content is one character repeated ('!' 64 of 64 "
        "times): '" + "!" * 60 + "'... -> journalctl -u gpubox-llama-server -n 50; "
        f"gpubox bench --smoke {INVENTORY} (which server flags answer text)"
    )
    assert finding("vllm.compat").message == (
        "box: vllm/vllm-openai:v0.19.1 has no /usr/local/cuda-12.9/compat/libcuda.so.*: it is "
        "built on CUDA 12.9, newer than the CUDA 12.8 of the driver"
    )
    assert finding("vllm.compat").fix == f"pyinfra {INVENTORY} deploy/backend.py"
    assert finding("docker.cdi-container").fix == f"pyinfra {INVENTORY} deploy/container_toolkit.py"


def test_a_container_that_loses_nvml_after_the_reload_fails_the_reload_check():
    outputs = converged(CONFIGS["llamacpp"])
    FAULTS["docker.daemon-reload"].plant(outputs)
    [verdict] = [v for v in verdicts("llamacpp", outputs) if v.check == "docker.daemon-reload"]
    assert verdict.message == (
        "box: the container saw 2 GPU(s), then 0 after systemctl daemon-reload (Failed to "
        "initialize NVML: Unknown Error)"
    )
    Fault(
        "daemon_reload",
        section("start", "docker: Error response from daemon: could not select device driver\n")
        + section("before", "")
        + section("after", ""),
    ).plant(outputs)
    [verdict] = [v for v in verdicts("llamacpp", outputs) if v.check == "docker.daemon-reload"]
    assert verdict.message == (
        "box: could not start a GPU container (gpubox-check-daemon-reload): docker: Error "
        "response from daemon: could not select device driver"
    )


def test_output_a_judge_cannot_read_is_an_error_not_a_crash():
    outputs = converged(CONFIGS["llamacpp"])
    Fault("api_models", http(200, "<html><body>502 Bad Gateway</body></html>")).plant(outputs)
    Fault("api_props", http(200, "not json")).plant(outputs)
    results = {v.check: v for v in verdicts("llamacpp", outputs) if v.failed}
    assert set(results) == {"backend.models", "backend.slots"}
    assert results["backend.models"].status == "error"
    assert results["backend.models"].message.startswith(
        "box: /v1/models lists the alias: cannot tell: unreadable output (Expecting value"
    )


def test_a_docker_without_cdi_skips_the_cdi_container():
    outputs = converged(CONFIGS["llamacpp"])
    Fault("docker_version", "20.10.24+dfsg1\n").plant(outputs)
    verdict = next(v for v in verdicts("llamacpp", outputs) if v.check == "docker.cdi-container")
    assert (verdict.status, verdict.message) == (
        "skip",
        "Docker 20.10.24+dfsg1 has no CDI device support (Docker 25 or newer)",
    )


# --------------------------------------------------------------------------- (c) registry


def test_the_registry():
    ids = [c.id for c in checks.ALL]
    assert len(ids) == len(set(ids)) == len(checks.BY_ID)
    assert all(re.fullmatch(r"[a-z0-9]+\.[a-z0-9-]+", i) for i in ids), ids
    assert all(name in FACTS for c in checks.ALL for name in c.reads)
    assert {c.marker for c in checks.ALL} <= {"quick", "gpu", "slow", "burn", ""}
    assert all(c.title and c.reads for c in checks.ALL)
    # every fact is read by a check or shown by doctor (kernel: the view's header)
    read = {name for c in checks.ALL for name in c.reads}
    assert set(FACTS) - read <= {"kernel"}
    # a check that acts on the box never runs in doctor or the deploy
    passive = checks.select(passive=True)
    assert not any(c.active for c in passive)
    assert {c.id for c in checks.select(["burn"])} == {"tools.burn"}
    assert all(c.marker == "quick" for c in checks.select(["quick"]))
    # the deploy file a fix names exists
    deploy = Path(__file__).resolve().parents[2] / "deploy"
    assert all((deploy / f"{c.deploy_stage}.py").is_file() for c in checks.ALL), [
        c.deploy_stage for c in checks.ALL if not (deploy / f"{c.deploy_stage}.py").is_file()
    ]


# --------------------------------------------------------------------------- (d) missing tools


def runner(outputs: dict[str, Output], missing: set[str]) -> checks.Runner:
    """A host whose tools named in ``missing`` are not installed."""
    by_command = {out.command: out for out in outputs.values()}

    def run(command: str) -> Output:
        tool = command.split()[0]
        if tool in missing:
            return Output(127, "", f"sh: 1: {tool}: not found")
        return by_command[command]

    return run


@pytest.mark.parametrize(
    ("check_id", "tool"),
    [
        ("tools.nvtop", "nvtop"),
        ("docker.runtime", "docker"),
        ("dcgm.discovery", "dcgmi"),
        ("driver.held", "apt-mark"),
        ("toolkit.cdi-spec", "nvidia-ctk"),
        ("dcgm.localhost", "ss"),
    ],
)
def test_a_missing_command_is_an_error_naming_it(check_id: str, tool: str):
    config = CONFIGS["llamacpp"]
    check = checks.BY_ID[check_id]
    facts = checks.Facts(runner(converged(config), {tool}), config)
    verdict = checks.judge(check, "box", config, facts, INVENTORY)
    [command] = [
        facts[name].command for name in check.reads if facts[name].command.startswith(tool)
    ]
    assert verdict.status == "error"
    assert verdict.message == (
        f"box: {check.title}: cannot tell: `{command}`: sh: 1: {tool}: not found"
    )
    assert verdict.fix == check.fix_for(INVENTORY)


def test_nvidia_smi_missing_means_no_driver():
    config = CONFIGS["llamacpp"]
    facts = checks.Facts(runner(converged(config), {"nvidia-smi"}), config)
    verdict = checks.judge(checks.BY_ID["gpu.listed"], "box", config, facts, INVENTORY)
    assert (verdict.status, verdict.message) == (
        "error",
        "box: nvidia-smi lists every GPU of the inventory: cannot tell: nvidia-smi not found: "
        "no NVIDIA driver installed",
    )


# --------------------------------------------------------------------------- (e) the API key

KEY = 'k3y-"quoted"-back\\slash-0123456789abcdef'
PLANTED = "\n".join(
    [
        "    1 /sbin/init",
        f"  812 /usr/bin/curl -H Authorization: Bearer {KEY} http://127.0.0.1:8080/v1",
        "  900 /usr/bin/python3 -m http.server --secret-of-someone-else",
        f" 4711 sh -c VLLM_API_KEY={KEY} exec docker run",
        f" 4712 /opt/{KEY}/bin/tool --flag",
        f" 4713 /usr/local/bin/{KEY}-agent --serve",
        "  977 sshd: root@pts/0",
    ]
)


def key_in_ps(tmp_path: Path, key: str, ps_output: str) -> tuple[str, str]:
    """Run the key_in_ps fact's own command, with a ps that prints ``ps_output``: (its output,
    the command)."""
    key_file = tmp_path / "api key's file"
    key_file.write_text(key)
    key_file.chmod(0o600)
    config = load_host_config("box", {**REFERENCE, "api_key_file": str(key_file)})
    command = FACTS["key_in_ps"].command_for(config, TARGET)
    assert command is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "ps.out").write_text(ps_output + "\n")
    ps = bin_dir / "ps"
    ps.write_text(
        f"#!/bin/sh\n[ \"$*\" = '-eww -o pid=,args=' ] || exit 2\ncat '{tmp_path}/ps.out'\n"
    )
    ps.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["sh", "-c", command], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stderr == ""
    return result.stdout, command


def test_the_ps_fact_names_only_pids_and_programs(tmp_path: Path):
    shown, command = key_in_ps(tmp_path, KEY, PLANTED)
    assert shown == "812 curl\n4711 sh\n4712 tool\n4713 ?\n"
    assert KEY not in command and "0123456789abcdef" not in command  # read on the box
    assert FACTS["key_in_ps"].parse(shown) == ["812 curl", "4711 sh", "4712 tool", "4713 ?"]


def test_the_ps_fact_finds_nothing_on_a_clean_box_or_with_an_empty_key(tmp_path: Path):
    clean = "\n".join(ln for ln in PLANTED.splitlines() if KEY not in ln)
    assert key_in_ps(tmp_path, KEY, clean)[0] == ""
    assert key_in_ps(tmp_path, KEY + "\n", clean)[0] == ""  # a key file ending in a newline
    assert key_in_ps(tmp_path, KEY + "\n", PLANTED)[0] == "812 curl\n4711 sh\n4712 tool\n4713 ?\n"
    assert key_in_ps(tmp_path, "", PLANTED)[0] == ""  # no key: nothing matches everything


def test_the_key_check_failure_shows_neither_the_key_nor_the_arguments(tmp_path: Path):
    shown, _ = key_in_ps(tmp_path, KEY, PLANTED)
    config = CONFIGS["llamacpp"]
    outputs = converged(config)
    Fault("key_in_ps", shown).plant(outputs)
    verdict = checks.judge(
        checks.BY_ID["backend.key"], "box", config, recorded(config, outputs), INVENTORY
    )
    assert verdict.status == "fail"
    assert verdict.message == (
        "box: the API key shows in the arguments of 812 (curl), 4711 (sh), 4712 (tool), 4713 (?)"
    )
    for secret_or_args in (KEY, "0123456789abcdef", "Bearer", "http.server", "--flag", "/opt/"):
        assert secret_or_args not in str(verdict)
    Fault("key_file", "root 600 0\n").plant(outputs)
    verdict = checks.judge(
        checks.BY_ID["backend.key"], "box", config, recorded(config, outputs), INVENTORY
    )
    assert verdict.message.startswith(f"box: {config.api_key_file} is empty; the API key shows")
    outputs["key_file"] = Output(1, "", f"stat: cannot statx '{config.api_key_file}': No such file")
    verdict = checks.judge(
        checks.BY_ID["backend.key"], "box", config, recorded(config, outputs), INVENTORY
    )
    assert verdict.message == f"box: {config.api_key_file} is missing"
