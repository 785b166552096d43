"""gpubox doctor: gather, evaluate (gpubox.checks, the passive ones) and render on facts from
real outputs: the sandbox's stand-in nvidia-smi, lspci and dcgmi (held byte for byte to real
captures by test_standin.py) under the planted faults, captured os-release and nvcc outputs,
and every other command's output of a converged box written in that command's real format
(the files gpubox writes are rendered from its own templates; the captured outputs in
tests/fixtures/apt hold no NVIDIA package). test_checks.py judges these outputs too."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import bench_level

from gpubox import bench, checks, doctor, parsers
from gpubox.base import layout
from gpubox.checks.core import FACTS, Output, Unreachable
from gpubox.checks.facts import SERVICES, api_base
from gpubox.config import HostConfig, load_host_config, target_for
from gpubox.knowledge import reads
from gpubox.parsers import SECTION, parse_unit_states
from gpubox.plans import driver as driver_plan
from gpubox.sandbox import standin
from gpubox.sandbox.standin import state as st

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PIN = "570.211.01"
NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
CONFIG = load_host_config("box", {"nvlink_links": 2, "llamacpp_cuda": False})
DRIVER = CONFIG.driver_packages("debian")
INVENTORY = "inventories/box.py"
# What NVIDIA's Debian 12 repository builds at the pinned version, beside the roots (the
# driver stage pins every one of them).
OFFERED = [
    "firmware-nvidia-gsp",
    "libcuda1",
    "libnvidia-ml1",
    "nvidia-kernel-support",
    "nvidia-persistenced",
    "nvidia-smi",
]
MODEL_STAT = "size=48876255232 mtime=1772100000"
API_KEY_SIZE = 43  # 32 random bytes in base64, without its /, + and =


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


OS_RELEASE = fixture("os/os-release_debian12_local.txt")
TARGET = target_for(parsers.parse_os_release(OS_RELEASE), CONFIG.catalog)
assert TARGET is not None and TARGET.family == "debian"


def section(name: str, text: str) -> str:
    """One section of a multi-command fact (what `echo '@@gpubox NAME'` prints, then its text)."""
    return f"{SECTION}{name}\n{text}"


def panel_converged(config: HostConfig = CONFIG) -> str:
    """gpubox.knowledge.panel's state fact on a box with 1Panel converged: 1pctl's variables (the
    password masked), both units active and enabled, `1pctl user-info` filtered on the box,
    the version, the agent's socket, the entrance file's digest and the login page (its three
    marks, status 200)."""
    from gpubox.knowledge import panel

    port, user = config.panel_port, config.panel_user
    unit = "Id={}.service\nLoadState=loaded\nActiveState=active\nUnitFileState=enabled\n"
    return (
        section(
            "ctl",
            f"BASE_DIR=/opt\nORIGINAL_PORT={port}\nORIGINAL_VERSION=v2.3.2\n"
            f"ORIGINAL_USERNAME={user}\nLANGUAGE=en\nPANEL_EDITION=intl\nPASSWORD=masked\n",
        )
        + section("units", unit.format("1panel-core") + "\n" + unit.format("1panel-agent"))
        + section("info", f"port={port}\nuser={user}\nentrance=same\n")
        + section("version", "v2.3.2\n")
        + section("socket", "yes\n")
        + section(
            "entrance_file", (panel.entrance_digest(config.panel_entrance) or "0" * 64) + "\n"
        )
        + section("page", "status=200\nmark=0\nmark=1\nmark=2\n")
    )


# The watchdog's fact on a converged box: its timer active, its record of runs without a restart.
WATCHDOG_CONVERGED = section(
    "timer",
    "Id=gpubox-watchdog.timer\nLoadState=loaded\nActiveState=active\nUnitFileState=enabled\n",
) + section(
    "state",
    '{"restarts": 0, "failures": 0, "healthy": true, "start_us": 91034412, '
    '"last_run": "2026-02-27T10:00:00+00:00", "last_action": "ok"}\n',
)


def monitor_converged() -> str:
    """gpubox.checks.monitoring's fact on a converged monitor: its three units active and
    enabled, gpubox's lines of the node exporter's /metrics, Prometheus's targets all up and
    every shipped rule loaded (the JSON shapes of Prometheus 2.42's /api/v1/targets and
    /api/v1/rules, trimmed to the fields the checks read)."""
    from gpubox.checks.monitoring import UNITS, shipped_rules

    unit = "Id={}.service\nLoadState=loaded\nActiveState=active\nUnitFileState=enabled\n"
    targets = [
        {
            "labels": {"host": "box", "job": job, "instance": address},
            "scrapeUrl": f"http://{address}/metrics",
            "health": "up",
            "lastError": "",
        }
        for job, address in (
            ("node", "127.0.0.1:9100"),
            ("dcgm", "127.0.0.1:9400"),
            ("backend", "127.0.0.1:8080"),
        )
    ]
    rules = [{"name": name, "type": "alerting", "health": "ok"} for name in shipped_rules()]
    return (
        section("units", "\n".join(unit.format(u) for u in UNITS))
        + section("node", "gpubox_gpus_expected 2\ngpubox_output_tokens_per_second_floor 5\n")
        + section(
            "targets",
            json.dumps({"status": "success", "data": {"activeTargets": targets}}) + "\n",
        )
        + section(
            "rules",
            json.dumps(
                {"status": "success", "data": {"groups": [{"name": "gpubox", "rules": rules}]}}
            )
            + "\n",
        )
    )


def systemctl_show(states: dict[str, str]) -> str:
    """`systemctl show -p Id,LoadState,ActiveState,UnitFileState UNIT...` for gpubox's units:
    each unit's state ("missing": not installed; absent: inactive)."""
    blocks = []
    for unit in SERVICES:
        active = states.get(unit, "inactive")
        missing = active == "missing"
        blocks.append(
            f"Id={unit}.service\nLoadState={'not-found' if missing else 'loaded'}\n"
            f"ActiveState={'inactive' if missing else active}\n"
            f"UnitFileState={'' if missing else 'enabled'}\n"
        )
    return "\n".join(blocks)


def driver_plan_for(config: HostConfig) -> driver_plan.DriverPlan:
    want = config.driver_packages("debian")
    offered = {name: [want.package_version] for name in [*want.installed, *OFFERED]}
    assert TARGET is not None
    return driver_plan.plan(config, TARGET, offered)


def pin_files(config: HostConfig) -> dict[str, str]:
    """The apt pins the driver, container toolkit and DCGM stages write."""
    from gpubox.base.rendering import render

    toolkit, dcgm = config.catalog["container_toolkit"], config.catalog["dcgm"]
    return {
        layout.DRIVER_PIN: driver_plan_for(config).pin,
        layout.TOOLKIT_PIN: render(
            "apt-pin-exact.j2",
            what="the NVIDIA Container Toolkit",
            version=toolkit["version"],
            packages=toolkit["packages"],
        ),
        layout.DCGM_PIN: render(
            "apt-pin-exact.j2", what="DCGM", version=dcgm["version"], packages=dcgm["packages"]
        ),
    }


def pins_output(files: dict[str, str]) -> str:
    """The pins fact: each pin file's section (its text), or its "missing" section."""
    return "".join(
        section(path, files[path]) if path in files else section(f"{path} missing", "")
        for path in (layout.DRIVER_PIN, layout.TOOLKIT_PIN, layout.DCGM_PIN)
    )


def apt_config_dump(config: HostConfig) -> str:
    """`apt-config dump Unattended-Upgrade::Package-Blacklist` with gpubox's blacklist file
    (rendered by the driver stage) read: the list node, then one line per entry."""
    file = driver_plan_for(config).unattended
    entries = [line.strip()[1:-2] for line in file.splitlines() if line.strip().startswith('"')]
    assert entries, file
    return 'Unattended-Upgrade::Package-Blacklist "";\n' + "".join(
        f'Unattended-Upgrade::Package-Blacklist:: "{entry}";\n' for entry in entries
    )


def dpkg_lines(packages: list[str], version: str, status: str = "hi ") -> str:
    return "".join(f"{name}\t{version}\t{status}\n" for name in packages)


def http(status: int, body: Any) -> str:
    """The API facts' output: the HTTP status, a newline, the body."""
    return f"{status}\n" + (body if isinstance(body, str) else json.dumps(body))


def chat_stream(*pieces: tuple[str, str]) -> str:
    """llama-server's streamed chat completion: one event per (field, text) delta, then a
    finish event and [DONE]."""
    chunk = {"created": 1796105310, "id": "chatcmpl-TprhF", "model": "qwen3-next"}
    chunk["object"] = "chat.completion.chunk"

    def event(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"finish_reason": finish, "index": 0, "delta": delta}
        return "data: " + json.dumps({"choices": [choice], **chunk}, separators=(",", ":"))

    events = [event({"role": "assistant", "content": None})]
    events += [event({field: text}) for field, text in pieces]
    events += [event({}, "stop"), "data: [DONE]", ""]
    return "\n\n".join(events)


def api_outputs(config: HostConfig) -> dict[str, str]:
    """What the OpenAI-compatible API answers on the box (the curl facts' output)."""
    alias = config.model_alias
    models = {
        "models": [
            {"name": alias, "model": alias, "type": "model", "capabilities": ["completion"]}
        ],
        "object": "list",
        "data": [{"id": alias, "object": "model", "created": 1796105310, "owned_by": "llamacpp"}],
    }
    props = {
        "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": config.model_ctx},
        "total_slots": config.model_parallel,
        "model_path": f"{config.model_dir}/model.gguf",
        "build_info": "b11312-0c1e5709",
    }
    metrics = "".join(
        f"# HELP llamacpp:{name} {text}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} 0\n"
        for name, kind, text in (
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed."),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed."),
            ("requests_processing", "gauge", "Number of requests processing."),
        )
    )
    unauthorized = {
        "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
    }
    return {
        "health": "200",
        "api_unauthorized": http(401, unauthorized),
        "api_models": http(200, models),
        "api_chat": http(
            200,
            chat_stream(("reasoning_content", "The user says hello."), ("content", "Hello!")),
        ),
        "api_props": http(200, props),
        "api_metrics": http(200, metrics),
        "sane_short": http(200, sane_answer("The sky is blue because air scatters blue light.")),
        "sane_long": http(200, sane_answer("The group's scripts broke machines; a tool fixed it.")),
    }


def sane_answer(content: str) -> dict[str, Any]:
    """llama-server's whole answer to one of backend.sane's prompts."""
    return {
        "choices": [
            {
                "finish_reason": "stop",
                "index": 0,
                "message": {"role": "assistant", "content": content},
            }
        ],
        "created": 1796105310,
        "model": "qwen3-next",
        "object": "chat.completion",
        "usage": {"completion_tokens": 12, "prompt_tokens": 24, "total_tokens": 36},
    }


def vllm_outputs(config: HostConfig) -> dict[str, str]:
    """`docker inspect gpubox-vllm`, the compile caches and the libcuda.so vLLM's processes
    mapped on a converged vLLM box: the image's cuda-compat one (CUDA 12.9.1's is 575.57.08)
    where the driver's CUDA is older than the image's, else the host's, which the container
    toolkit mounts into /usr/lib/x86_64-linux-gnu."""
    from gpubox.plans import vllm as plan_vllm

    inspect = {
        "Id": "5d3c0b6a8f0e",
        "Path": "vllm",
        "Args": ["serve", *plan_vllm.vllm_args(config)],
        "State": {"Status": "running", "Running": True},
        "Config": {
            "Image": config.catalog["vllm"]["image"],
            "Env": [
                f"{key}={value}"
                for key, value in {
                    "PATH": "/usr/local/bin:/usr/bin",
                    **plan_vllm.container_env(config),
                }.items()
            ],
        },
        "Mounts": [
            {
                "Type": "bind",
                "Source": f"{plan_vllm.CACHE_DIR}/{name}",
                "Destination": path,
                "Mode": "",
                "RW": True,
                "Propagation": "rprivate",
            }
            for name, path in plan_vllm.CACHES.items()
        ],
    }
    cache = layout.VLLM_CACHE_DIR
    return {
        "vllm_inspect": json.dumps([inspect], indent=4) + "\n",
        "vllm_cache_files": section("triton", f"{cache}/triton/cache/3f2a/matmul_kernel.json\n")
        + section("vllm", f"{cache}/vllm/torch_compile_cache/9c1e/rank_0_0/model\n"),
        "vllm_libcuda": (
            "/usr/local/cuda-12.9/compat/libcuda.so.575.57.08\n"
            if plan_vllm.compat_env(config)[plan_vllm.COMPAT_ENV] == "1"
            else f"/usr/lib/x86_64-linux-gnu/libcuda.so.{config.driver_version}\n"
        ),
    }


def converged_outputs(config: HostConfig = CONFIG) -> dict[str, str]:
    """What every passive command but nvidia-smi, lspci and dcgmi prints on a converged
    Debian 12 box with ``config``, by fact name."""
    from gpubox.plans import model as plan_model
    from gpubox.plans.llamacpp import llama_build
    from gpubox.stages import container_toolkit

    want = config.driver_packages("debian")
    version = want.package_version
    toolkit, dcgm = config.catalog["container_toolkit"], config.catalog["dcgm"]
    policy = "".join(
        f"{name}:\n  Installed: {version}\n  Candidate: {version}\n  Version table:\n"
        f" *** {version} 1001\n        500 http://127.0.0.1:8000/debian12/x86_64  Packages\n"
        f"        100 /var/lib/dpkg/status\n"
        for name in want.installed
    )
    prefix = config.cuda["prefix"]
    build = llama_build(config)
    plan = plan_model.plan(config)
    outputs = {
        "os_release": OS_RELEASE,
        "kernel": "6.1.0-28-amd64\n",
        "module_version": config.driver_version + "\n",
        "nouveau": "no\n",
        # Secure Boot on, DKMS's key enrolled, the modules signed and verified
        "sb_state": "SecureBoot enabled\n",
        "mok": fixture("secureboot/mok-state_debian12_enrolled.txt"),
        "kernels": "R 6.1.0-28-amd64\nK 6.1.0-28-amd64\nH 6.1.0-28-amd64\nDKMS\n"
        f"D nvidia-current/{config.driver_version}, 6.1.0-28-amd64, x86_64: installed\n",
        "dpkg": fixture("apt/dpkg-query_debian12_local.txt")
        + dpkg_lines(want.installed, version)
        + dpkg_lines(OFFERED, version, "ii ")
        + dpkg_lines(toolkit["packages"], toolkit["version"])
        + dpkg_lines(dcgm["packages"], dcgm["version"])
        + dpkg_lines([config.cuda["package"]], config.cuda["package_version"], "ii "),
        "holds": "".join(
            f"{name}\n" for name in [*want.installed, *toolkit["packages"], *dcgm["packages"]]
        ),
        "policy": policy,
        "pins": pins_output(pin_files(config)),
        "unattended": apt_config_dump(config),
        "services": systemctl_show(
            {
                layout.PERSISTENCED: "active",
                layout.DOCKER: "active",
                layout.DCGM: "active",
                layout.LLAMA_SERVER: "active" if config.backend == "llamacpp" else "missing",
                layout.VLLM: "active" if config.backend == "vllm" else "missing",
            }
        ),
        "nvcc": f"{prefix}/bin/nvcc\n" + fixture("nvcc/nvcc-version_12.8.93_1cat-issue237.txt"),
        "cuda_link": prefix + "\n",
        "ldconfig_cudart": f"{prefix}/targets/x86_64-linux/lib/libcudart.so.12.8.90\n" * 2,
        "cuda13_dirs": "",
        "docker_info": json.dumps(
            {
                "ServerVersion": "28.5.1",
                "DefaultRuntime": "nvidia" if config.docker_default_runtime_nvidia else "runc",
                "Runtimes": {"io.containerd.runc.v2": {}, "nvidia": {}, "runc": {}},
            }
        )
        + "\n",
        "docker_version": "28.5.1\n",
        # `id -nG` of each user of docker_users (gpubox.knowledge.users.groups_command's lines)
        "docker_users": "".join(f"{u}:{u} sudo docker\n" for u in config.docker_users),
        "daemon_json": json.dumps(
            {
                **container_toolkit.NVIDIA_RUNTIME,
                **container_toolkit.runtime_settings(config)[0],
                **config.docker_daemon_options,
            },
            indent=4,
        )
        + "\n",
        "cdi_list": 'time="2026-02-27T10:00:00Z" level=info msg="Found 5 CDI devices"\n'
        "nvidia.com/gpu=0\nnvidia.com/gpu=1\n"
        "nvidia.com/gpu=GPU-60f2c95a-c564-a078-2a14-b4ff488806ca\n"
        "nvidia.com/gpu=GPU-dae76d0e-3414-958a-8f3e-fc6682b36f31\nnvidia.com/gpu=all\n",
        "listening": "LISTEN 0      4096       127.0.0.1:5555       0.0.0.0:*    "
        'users:(("nv-hostengine",pid=1187,fd=8))\n'
        "LISTEN 0      128          0.0.0.0:22         0.0.0.0:*    "
        'users:(("sshd",pid=612,fd=3))\n'
        f"LISTEN 0      512        127.0.0.1:{config.api_port}       0.0.0.0:*    "
        'users:(("llama-server",pid=2345,fd=3))\n'
        "LISTEN 0      128             [::]:22            [::]:*    "
        'users:(("sshd",pid=612,fd=4))\n',
        "exporter_metrics": "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-dae76d0e",Hostname="v100-box"} 0\n'
        "# HELP DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL Total NVLink bandwidth.\n"
        "# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter\n"
        'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{gpu="0",UUID="GPU-dae76d0e",Hostname="v100-box"} 0\n',
        "hostname": "v100-box\n",
        "nvtop": "nvtop version 3.0.1\n",
        "burnin": json.dumps(
            {
                "date": "2026-02-27T10:00:00+00:00",
                "passed": True,
                "gpu_count": 2,
                "seconds": 3,
                "gpu_burn": {"exit_status": 0, "tested": 2, "gpus": {"0": "OK", "1": "OK"}},
                "dcgm_diag": {"level": 2, "passed": True},
                "problems": [],
            }
        ),
        "key_file": f"root 600 {API_KEY_SIZE}\n",
        "key_in_ps": "",
        "llama_build": f"version: 0.5.0-dev (build {build.build_number}, commit "
        f"{build.short_commit})\nbuilt with GNU 12.2.0 for Linux x86_64\n"
        + section("bench present", ""),
        "model_state": f"marker={plan.stamp} {MODEL_STAT}\nfile={MODEL_STAT}\n",
        "watchdog": WATCHDOG_CONVERGED,
        "panel": panel_converged(config),
        "monitor": monitor_converged(),
        **api_outputs(config),
        **vllm_outputs(config),
    }
    missing = {n for n, f in FACTS.items() if not f.active} - set(outputs) - STANDIN_FACTS
    assert not missing, f"no converged output for {missing}"
    return outputs


# The passive facts the sandbox's stand-ins answer.
STANDIN_FACTS = {"smi_query", "smi_apps", "nvlink", "topo", "lspci", "dcgm_discovery"}
STANDINS = ("nvidia-smi", "dcgmi", "lspci")
LSPCI = "lspci -Dnn -d 10de:"  # what gpubox.knowledge.reads.NVIDIA_PCI runs where lspci is there


def fact_names(config: HostConfig) -> dict[str, str]:
    """Each command the facts run for ``config`` on the box, to its fact name."""
    names: dict[str, str] = {}
    for name, fact in FACTS.items():
        command = fact.command_for(config, TARGET)
        if command is not None:
            assert command not in names, f"{name} and {names[command]} run the same command"
            names[command] = name
    return names


class StandinHost:
    """A host runner: nvidia-smi, lspci and dcgmi are the sandbox's stand-ins on a temporary
    state; every other command prints what ``outputs`` holds for its fact name (a string: its
    standard output, exit status 0; an Output: all of it). A `cat` of a file with no output
    fails as cat does; any other unknown command is "not found" (127), as the shell says."""

    def __init__(self, root: Path, config: HostConfig = CONFIG) -> None:
        self.root = root
        self.state = st.default_state()
        self.run_dir = root / "run"
        self.run_dir.mkdir()
        (self.run_dir / st.LOADED_DRIVER_FILE).write_text(PIN + "\n")
        (self.run_dir / st.PERSISTENCE_FILE).touch()
        (self.run_dir / st.HOSTENGINE_FILE).write_text(f"{os.getpid()} 127.0.0.1:5555\n")
        (root / "profiling.so").touch()
        self.bin = root / "bin"
        self.bin.mkdir()
        for name, text in (
            ("nvidia-smi", standin.nvidia_smi_source(PIN)),
            ("dcgmi", standin.dcgm_source(standin.DCGMI, "4.4.1")),
            ("lspci", standin.LSPCI.read_text()),
        ):
            (self.bin / name).write_text(text)
        self.outputs: dict[str, str | Output] = dict(converged_outputs(config))
        self.names = fact_names(config)
        self.ran: list[str] = []

    def standin(self, command: str) -> Output:
        """Run one of the stand-ins on this host's state (the NVIDIA PCI read runs lspci where
        the box has one: the stand-in's)."""
        st.save_state(self.state, self.root / "state.json")
        argv = shlex.split(LSPCI if command == reads.NVIDIA_PCI.command else command)
        env = {
            **os.environ,
            st.STATE_ENV: str(self.root / "state.json"),
            st.RUN_ENV: str(self.run_dir),
            st.PROFILING_MODULE_ENV: str(self.root / "profiling.so"),
        }
        result = subprocess.run(
            [sys.executable, str(self.bin / argv[0]), *argv[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return Output(result.returncode, result.stdout, result.stderr)

    def __call__(self, command: str) -> Output:
        self.ran.append(command)
        if command.split(" ", 1)[0] in STANDINS or command == reads.NVIDIA_PCI.command:
            return self.standin(command)
        name = self.names.get(command, "")
        out = self.outputs.get(name)
        if isinstance(out, Output):
            return out
        if out is not None:
            return Output(0, out)
        if command.startswith("cat "):
            path = command.split()[-1]
            return Output(1, "", f"cat: {path}: No such file or directory")
        return Output(127, "", f"sh: 1: {command.split()[0]}: not found")


@pytest.fixture
def host(tmp_path: Path) -> StandinHost:
    return StandinHost(tmp_path)


def check(
    host: StandinHost, config: HostConfig = CONFIG
) -> tuple[dict[str, Any], list[checks.Verdict], str]:
    facts = doctor.gather(host, config)
    view = doctor.describe(config, facts, NOW)
    verdicts = doctor.evaluate("box", config, facts, INVENTORY)
    return view, verdicts, doctor.render_text("box", view, verdicts)


def failed(verdicts: list[checks.Verdict]) -> dict[str, str]:
    """Each failed check's id -> its finding ("message -> fix")."""
    return {v.check: str(v) for v in verdicts if v.failed}


def deploy(stage: str) -> str:
    return f"pyinfra {INVENTORY} deploy/{stage}.py"


def test_doctor_runs_every_check_that_reads_nothing_active():
    ids = [c.id for c in doctor.doctor_checks()]
    assert ids == [c.id for c in checks.ALL if not c.active]
    assert "docker.gpus-all" not in ids and "tools.burn" not in ids
    assert {"driver.held", "backend.key", "dcgm.localhost", "model.verified"} <= set(ids)


def test_a_converged_box_is_ok_and_every_command_runs_once(host: StandinHost):
    view, verdicts, text = check(host)
    assert failed(verdicts) == {}
    assert [v.check for v in verdicts] == [c.id for c in doctor.doctor_checks()]
    passive = {n for n, f in FACTS.items() if not f.active}
    expected = [cmd for cmd, name in host.names.items() if name in passive]
    assert sorted(host.ran) == sorted(expected)
    assert len(host.ran) == len(set(host.ran))
    assert text.endswith("OK: no deviation from the inventory\n")
    lines = text.splitlines()
    assert lines[0] == "== box: Debian GNU/Linux 12 (bookworm), kernel 6.1.0-28-amd64"
    assert lines[1] == f"GPUs      2 found, driver {PIN}"
    assert lines[2].startswith("  GPU 0  Tesla V100-SXM2-32GB  00000000:07:00.0  mem 0/32768 MiB")
    assert "persistence on" in lines[2] and "apps ?" in lines[2]  # the stand-in lists no apps
    assert lines[4].startswith(
        "NVLink    GPU 0 2 up (0, 2), 4 down; GPU 1 2 up (1, 2), 4 down; 25.781 GB/s"
    )
    assert [ln.split()[:3] for ln in lines[6:8]] == [["GPU0", "X", "NV2"], ["GPU1", "NV2", "X"]]
    assert f"Driver    installed {DRIVER.package_version}, loaded {PIN}" in text
    assert "held 2/2" in text and "nvidia-persistenced active, enabled" in text
    assert "CUDA      nvcc 12.8.93 (/usr/local/cuda-12.8/bin/nvcc)" in text
    assert "28.5.1, runtimes io.containerd.runc.v2, nvidia, runc (default runc)" in text
    assert "DCGM      nvidia-dcgm active, enabled, 2 GPU(s) discovered" in text
    assert "/health 200, model qwen3-next (http://127.0.0.1:8080)" in text
    assert "\n          no bench yet (gpubox bench --inventory INVENTORY)\n" in text
    assert view["backend"]["last_bench"] is None
    assert "Burn-in   passed 2026-02-27T10:00:00+00:00, 2 day(s) ago (GPU 0 OK, GPU 1 OK)" in text
    assert view["gpus"]["gpus"][1]["power_limit_w"] == 300.0
    skipped = {v.check for v in verdicts if v.status == "skip"}
    # no docker_users; no exporter; llama.cpp built for the CPU; the vLLM checks; no panel
    assert skipped == {
        "docker.users",
        "dcgm.exporter",
        "dcgm.exporter-hostname",
        "backend.gpu-memory",
        "vllm.container",
        "vllm.caches",
        "vllm.warm",
        "monitoring.node-exporter",
        "monitoring.services",
        "monitoring.targets",
        "monitoring.rules",
        "panel.services",
        "panel.socket",
        "panel.login",
        "panel.settings",
    }
    assert "Panel" not in text
    active = sum(c.active for c in checks.ALL)
    assert (
        f"Checks    {len(verdicts) - len(skipped)} passed, 0 failed, {len(skipped)} not "
        f"applicable (the host checks run {active} more that act on the box: pytest tests/host)"
    ) in text


def test_the_driver_line_carries_the_lifecycle_note_and_no_check_fails_on_it(host: StandinHost):
    """Issue 30 A: the pinned R570 is past its end of life (unlisted by NVIDIA): doctor's Driver
    line is followed by the same note `gpubox check` prints, and every check still passes."""
    view, verdicts, text = check(host)
    assert failed(verdicts) == {}
    driver_checks = [v for v in verdicts if v.check.startswith("driver.")]
    assert len(driver_checks) >= 5 and all(v.status == "pass" for v in driver_checks)
    assert text.endswith("OK: no deviation from the inventory\n")
    note = view["driver"]["lifecycle"]
    assert note.startswith("driver branch R570 is past its end of life (unlisted since the 615")
    assert note.endswith('move to R580: set "driver_branch": "580" and deploy')
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("Driver    installed "))
    assert lines[at + 1] == f"          note: {note}"
    # R580 on the same V100s: no note until six months before its end of life (2028-06), then
    # the hardware's last branch
    r580 = load_host_config(
        "box", {"nvlink_links": 2, "llamacpp_cuda": False, "driver_branch": "580"}
    )
    facts = doctor.gather(host, r580)
    assert doctor.describe(r580, facts, NOW)["driver"]["lifecycle"] is None
    late = datetime.datetime(2028, 1, 5, tzinfo=datetime.UTC)
    assert (
        "R580 is the last branch for Volta"
        in doctor.describe(r580, facts, late)["driver"]["lifecycle"]
    )


def test_planted_faults_gpu_missing(host: StandinHost):
    st.set_gpu_present(host.state, 1, False)
    _, verdicts, text = check(host)
    findings = failed(verdicts)
    assert set(findings) == {"gpu.listed", "nvlink.links", "nvlink.topology", "dcgm.discovery"}
    assert findings["gpu.listed"] == (
        "box: nvidia-smi lists 1 GPU(s), expected 2 Tesla V100-SXM2-32GB; lspci shows 1 NVIDIA "
        "3D controller(s); found: GPU 0 Tesla V100-SXM2-32GB 00000000:07:00.0 -> "
        "check the card/power/PCIe; lspci -d 10de:"
    )
    assert findings["nvlink.links"].startswith(
        "box: GPU 0: 0 NVLink link(s) active, expected 2 (active: none; "
    )
    assert "GPU 1 reports no NVLink links" in findings["nvlink.links"]
    assert findings["nvlink.topology"].startswith("box: topo -m shows 1 GPU(s), expected 2 -> ")
    assert findings["dcgm.discovery"] == (
        "box: dcgmi discovery lists 1 GPU(s), expected 2 -> sudo systemctl restart nvidia-dcgm; "
        f"{deploy('dcgm')}"
    )
    assert "Warnings (4):" in text and "  ! [gpu.listed] box: nvidia-smi lists 1 GPU(s)" in text


def test_planted_faults_link_down(host: StandinHost):
    st.set_link_active(host.state, 0, 2, False)
    view, verdicts, _ = check(host)
    fix = "reseat the NVLink bridge/board, check the GPUs' seating; nvidia-smi nvlink -s"
    assert failed(verdicts) == {
        "nvlink.links": "box: GPU 0: 1 NVLink link(s) active, expected 2 (active: 0; inactive: "
        "1, 2, 3, 4, 5); GPU 1: 1 NVLink link(s) active, expected 2 (active: 1; inactive: 0, 2, "
        f"3, 4, 5) -> {fix}"
    }
    assert view["nvlink"]["topology"]["matrix"][0][1] == "NV1"  # still joined by the other


def test_planted_faults_persistence_off(host: StandinHost):
    st.set_persistence_forced_off(host.state, True)
    _, verdicts, text = check(host)
    fix = f"sudo systemctl restart nvidia-persistenced; {deploy('driver')}"
    assert failed(verdicts) == {
        "gpu.persistence": "box: persistence mode is not Enabled on GPU 0 (00000000:07:00.0), "
        f"GPU 1 (00000000:08:00.0) -> {fix}"
    }
    assert "persistence OFF" in text


def test_no_driver_loaded_and_tools_missing(host: StandinHost):
    (host.run_dir / st.LOADED_DRIVER_FILE).unlink()
    (host.run_dir / st.HOSTENGINE_FILE).unlink()
    for name in ("nvcc", "docker_info", "docker_version", "holds"):
        del host.outputs[name]
    host.outputs["cuda_link"] = Output(1, "")  # readlink -e: no such link
    host.outputs["services"] = systemctl_show({"docker": "failed", "nvidia-dcgm": "inactive"})
    host.outputs["listening"] = "\n".join(
        line for line in str(host.outputs["listening"]).splitlines() if "nv-hostengine" not in line
    )
    host.outputs["health"] = "000"
    _, verdicts, text = check(host)
    findings = failed(verdicts)
    no_driver = "cannot tell: nvidia-smi cannot talk to the driver: no NVIDIA kernel module loaded"
    assert findings["gpu.listed"] == (
        f"box: nvidia-smi lists every GPU of the inventory: {no_driver} -> {deploy('driver')}"
    )
    assert findings["driver.loaded"] == (
        f"box: the loaded driver is the installed one: {no_driver} -> "
        f'sudo reboot (or {deploy("driver")} with "allow_reboot": True)'
    )
    assert findings["cuda.nvcc"] == f"box: no nvcc on a login shell's PATH -> {deploy('cuda')}"
    assert findings["cuda.link"] == (
        f"box: /usr/local/cuda resolves to nothing, not /usr/local/cuda-12.8 -> {deploy('cuda')}"
    )
    assert findings["docker.service"] == (
        f"box: docker is failed and enabled -> sudo systemctl start docker; {deploy('docker')}"
    )
    assert findings["docker.runtime"].startswith(
        "box: Docker lists the nvidia runtime: cannot tell: `docker info --format '{{json .}}'`: "
        "sh: 1: docker: not found -> "
    )
    assert findings["dcgm.service"].startswith(
        "box: nvidia-dcgm is inactive and enabled -> sudo systemctl start nvidia-dcgm"
    )
    assert findings["dcgm.localhost"].startswith("box: nv-hostengine listens on no TCP port")
    assert findings["backend.service"] == (
        "box: gpubox-llama-server is inactive and enabled -> journalctl -u gpubox-llama-server "
        f"-n 50; {deploy('backend')}"
    )
    assert findings["backend.health"] == (
        "box: /health answers nothing -> journalctl -u gpubox-llama-server -n 50; "
        "sudo systemctl restart gpubox-llama-server"
    )
    assert findings["driver.persistenced"].startswith("box: nvidia-persistenced is inactive")
    assert findings["driver.held"].startswith(
        "box: the driver packages are held: cannot tell: `apt-mark showhold 2>/dev/null || true`: "
        "sh: 1: apt-mark: not found"
    )
    assert {"gpu.persistence", "nvlink.links", "nvlink.topology", "dcgm.discovery"} <= set(findings)
    assert {v.check for v in verdicts if v.status == "error"} >= {"gpu.listed", "docker.runtime"}
    assert "GPUs      nvidia-smi: NVIDIA-SMI has failed" in text
    assert "held 0/?" in text


def test_driver_drift_unheld_and_pin_broken(host: StandinHost):
    host.outputs["holds"] = ""
    host.outputs["policy"] = str(host.outputs["policy"]).replace(
        f"Candidate: {DRIVER.package_version}", "Candidate: 580.105.08-1"
    )
    files = pin_files(CONFIG)
    del files[layout.DRIVER_PIN]
    host.outputs["pins"] = pins_output(files)
    host.outputs["module_version"] = "580.105.08\n"
    _, verdicts, _ = check(host)
    findings = failed(verdicts)
    fix = deploy("driver")
    assert findings["driver.held"] == (
        f"box: driver packages not held: {', '.join(sorted(DRIVER.installed))} -> {fix}"
    )
    assert findings["driver.candidate"] == (
        "box: apt would install "
        + ", ".join(f"{name} 580.105.08-1" for name in DRIVER.installed)
        + f", not {DRIVER.package_version} (the pin is missing or broken) -> {fix}"
    )
    assert findings["driver.pins"] == (f"box: apt pin {layout.DRIVER_PIN} is missing -> {fix}")
    assert findings["driver.loaded"] == (
        f"box: loaded driver {PIN}, 580.105.08, configured {PIN} -> "
        f'sudo reboot (or {fix} with "allow_reboot": True)'
    )
    # the container toolkit's and DCGM's packages lost their holds too
    assert set(findings) == {
        "driver.held",
        "driver.candidate",
        "driver.pins",
        "driver.loaded",
        "toolkit.packages",
        "dcgm.packages",
    }


def test_a_kernel_update_without_the_module_is_named_with_its_fix(host: StandinHost):
    _, verdicts, text = check(host)
    assert "Kernels   module built for 6.1.0-28-amd64\n" in text and not failed(verdicts)
    host.outputs["kernels"] = str(host.outputs["kernels"]) + "K 6.1.0-31-amd64\n"
    _, verdicts, text = check(host)
    assert failed(verdicts) == {
        "driver.kernels": f"box: no NVIDIA {PIN} module installed by DKMS for kernel(s) "
        "6.1.0-31-amd64: booting one of them gives no driver -> "
        f"{deploy('driver')} (runs dkms autoinstall -k KERNEL, or installs that kernel's headers)"
    }
    assert "Kernels   module built for 6.1.0-28-amd64; MISSING for 6.1.0-31-amd64" in text


def test_burnin_failed_and_required(host: StandinHost):
    required = load_host_config(
        "box", {"nvlink_links": 2, "llamacpp_cuda": False, "burnin_required": True}
    )
    del host.outputs["burnin"]
    _, verdicts, text = check(host, required)
    assert failed(verdicts) == {
        "burnin.record": "box: no burn-in record (/var/lib/gpubox/burnin.json) -> "
        f"gpubox burnin {INVENTORY}"
    }
    assert "Burn-in   none recorded" in text
    _, verdicts, text = check(host)  # not required: no record is no finding
    assert failed(verdicts) == {}
    assert next(v for v in verdicts if v.check == "burnin.record").status == "skip"
    record = json.loads(converged_outputs()["burnin"])
    record.update(passed=False, problems=["GPU 1: gpu-burn says FAULTY"])
    record["gpu_burn"]["gpus"]["1"] = "FAULTY"
    host.outputs["burnin"] = json.dumps(record)
    _, verdicts, text = check(host)  # a failed one is, even when not required
    assert failed(verdicts) == {
        "burnin.record": "box: the last burn-in failed: GPU 1: gpu-burn says FAULTY -> "
        f"gpubox burnin {INVENTORY}"
    }
    assert "Burn-in   FAILED" in text and "GPU 1 FAULTY" in text


def test_unreachable_host_raises():
    def refuse(command: str) -> Output:
        raise OSError("Connection refused")

    with pytest.raises(Unreachable, match="Connection refused"):
        doctor.gather(refuse, CONFIG)


def test_a_connection_lost_mid_way_is_one_more_finding(host: StandinHost):
    def flaky(command: str) -> Output:
        if command == "nvtop --version":
            raise OSError("Connection reset by peer")
        return host(command)

    facts = doctor.gather(flaky, CONFIG)
    findings = failed(doctor.evaluate("box", CONFIG, facts, INVENTORY))
    assert findings == {
        "tools.nvtop": "box: nvtop runs: cannot tell: `nvtop --version` failed (255): "
        f"OSError: Connection reset by peer -> {deploy('tools')}"
    }


def test_json_is_the_same_report(host: StandinHost):
    st.set_persistence_forced_off(host.state, True)
    facts = doctor.gather(host, CONFIG)
    view = doctor.describe(CONFIG, facts, NOW)
    verdicts = doctor.evaluate("box", CONFIG, facts, "inv.py")
    doc = json.loads(doctor.render_json([doctor.host_report("box", view, verdicts)]))
    [report] = doc["hosts"]
    assert report["host"] == "box" and report["ok"] is False
    [finding] = report["findings"]
    assert finding["check"] == "gpu.persistence" and finding["status"] == "fail"
    assert finding["message"] == (
        "box: persistence mode is not Enabled on GPU 0 (00000000:07:00.0), GPU 1 (00000000:08:00.0)"
    )
    assert finding["fix"] == "sudo systemctl restart nvidia-persistenced; pyinfra inv.py " + (
        "deploy/driver.py"
    )
    assert report["checks"] == {v.check: v.status for v in verdicts}
    assert report["checks"]["gpu.persistence"] == "fail"
    assert report["checks"]["driver.held"] == "pass"
    assert report["checks"]["vllm.container"] == "skip"
    assert [g["persistence"] for g in report["gpus"]["gpus"]] == ["Disabled", "Disabled"]
    assert report["nvlink"]["topology"]["devices"] == ["GPU0", "GPU1"]
    assert report["driver"]["loaded"] == PIN


def test_systemctl_show_blocks():
    units = parse_unit_states(systemctl_show({"docker": "active", "gpubox-vllm": "missing"}))
    assert units["docker"]["ActiveState"] == "active"
    assert units["gpubox-llama-server"]["LoadState"] == "loaded"
    assert units["gpubox-vllm"]["LoadState"] == "not-found"
    assert list(units) == SERVICES


def _bench_report(url: str, model: str = "qwen3-next") -> dict[str, Any]:
    level = bench_level

    return {
        "endpoint": {"url": url, "model": model},
        "levels": [level(1, 65.4, 120.2, 15.24), level(4, 201.0, 180.0, 19.6, failed=2)],
    }


def test_the_last_bench_figures_are_shown_in_the_backend_section(
    host: StandinHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    url = bench.host_url("box", "gpu1.example", CONFIG.api_port)
    assert url == "http://gpu1.example:8080"
    record = bench.summary_record(_bench_report(url), date="2026-11-30T10:00:00+0100")
    bench.save_record(record, host="box")
    found = bench.load_record("box", url)
    facts = doctor.gather(host, CONFIG)
    view = doctor.describe(CONFIG, facts, NOW, last_bench=found)
    text = doctor.render_text("box", view, doctor.evaluate("box", CONFIG, facts, "inv.py"))
    assert (
        "\n          last bench 2026-11-30: 1 stream 65 tok/s, TTFT 120 ms, TPOT 15.2 ms; "
        "4 streams 201 tok/s, TTFT 180 ms, TPOT 19.6 ms, 2 FAILED\n"
    ) in text
    report = json.loads(doctor.render_json([doctor.host_report("box", view, [])]))
    assert report["hosts"][0]["backend"]["last_bench"] == record


def test_the_last_bench_is_found_by_url_and_names_another_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    url = bench.host_url("box", None, 8080)
    assert bench.load_record("box", url) is None
    assert doctor.format_bench(None).startswith("no bench yet")
    # `gpubox bench http://box:8080 --model other` keeps it under the URL only.
    bench.save_record(bench.summary_record(_bench_report("http://box:8080/", "other")))
    record = bench.load_record("box", url)
    assert record is not None
    assert doctor.format_bench(record, "qwen3-next").startswith("last bench ")
    assert " of model other: 1 stream 65 tok/s" in doctor.format_bench(record, "qwen3-next")
    assert " of model" not in doctor.format_bench(record, "other")


def test_the_fleet_table_opens_with_a_row_per_host(tmp_path: Path):
    """Three hosts as a lab has them (one converged, one with a GPU missing and a link down,
    one unreachable): one row each, readable, the deviations counted; the same rows in JSON."""
    rows = []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    healthy = StandinHost(tmp_path / "a")
    view, verdicts, _ = check(healthy)
    view["backend"]["last_bench"] = bench.summary_record(_bench_report("http://gpu1:8080"))
    rows.append(doctor.fleet_row("gpu1", CONFIG, view, verdicts))
    broken = StandinHost(tmp_path / "b")
    st.set_gpu_present(broken.state, 1, False)
    view, verdicts, _ = check(broken)
    rows.append(doctor.fleet_row("gpu2", CONFIG, view, verdicts))
    rows.append(doctor.fleet_row("gpu3", CONFIG, None, []))  # unreachable: nothing judged
    table = doctor.render_fleet(rows).splitlines()
    assert table[0].split() == [
        "HOST", "OS", "DRIVER", "inst/loaded", "GPUS", "seen/want", "NVLINK", "BACKEND",
        "BENCH", "1", "stream", "BURN-IN", "DEVIATIONS",
    ]  # fmt: skip
    assert table[1].split() == [
        "gpu1", "debian", "12", PIN, "2/2", "2/2", "up", "llamacpp", "200", "65", "tok/s",
        "passed", "2d", "ago", "0",
    ]  # fmt: skip
    gpu2 = table[2].split()
    assert gpu2[:4] == ["gpu2", "debian", "12", PIN] and "1/2" in gpu2 and "DOWN" in gpu2
    assert int(gpu2[-1]) >= 2  # gpu.listed, nvlink.links, nvlink.topology ...
    assert table[3].split()[:2] == ["gpu3", "unreachable"] and table[3].split()[-1] == "-"
    assert table[4] == "3 host(s): 1 as the inventory says, 1 deviating, 1 unreachable"
    # the columns line up: each header starts where its cells start
    for title, cell in (("OS", "debian"), ("GPUS", "2/2"), ("DEVIATIONS", "0")):
        column = table[0].index("  " + title) + 2
        assert table[1][column:].startswith(cell) and table[1][column - 2 : column] == "  "
    assert all(len(line) < 140 for line in table)
    document = json.loads(doctor.render_json([], rows))
    assert [row["host"] for row in document["fleet"]] == ["gpu1", "gpu2", "gpu3"]
    assert document["fleet"][0]["bench"] == "65 tok/s"


def test_the_secure_boot_line_says_the_key_and_the_modules(host: StandinHost):
    view, verdicts, text = check(host)
    assert (
        "SecureBoot on; key /var/lib/dkms/mok.pub enrolled ('DKMS module signing key'); "
        "loaded nvidia PO, nvidia_uvm PO; modules verified\n"
    ) in text
    # a module the kernel did not verify: the line says so, and the check names it
    host.outputs["mok"] = host.outputs["mok"].replace("LOADED nvidia PO", "LOADED nvidia POE")
    view, verdicts, text = check(host)
    assert "loaded nvidia POE, nvidia_uvm PO; /sys/module/nvidia/taint is 'POE'" in text
    assert set(failed(verdicts)) == {"driver.secure-boot"}
    # Secure Boot off: one word, and the check does not apply
    host.outputs["sb_state"] = "SecureBoot disabled\n"
    view, verdicts, text = check(host)
    assert "\nSecureBoot off\n" in text and failed(verdicts) == {}


def test_doctor_asks_the_api_with_the_key_on_curls_stdin_never_in_an_argument(tmp_path: Path):
    """The curl facts run for real (sh, sed, curl) against a loopback server that wants the
    key; a wrapper on PATH logs curl's arguments: the key reached the server, not the argv."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from gpubox.checks import facts as check_facts

    key = 'k3y-"quoted"-back\\slash-0123456789abcdef'
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == f"Bearer {key}"
            body = b'{"data": []}' if ok else b'{"error": "Invalid API Key"}'
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    key_file = tmp_path / "api key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.log"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text(
        f"#!/bin/sh\nprintf '%s\\n' \"$@\" >> {shlex.quote(str(log))}\n"
        f'cat /proc/$PPID/cmdline >> {shlex.quote(str(log))}\nexec /usr/bin/curl "$@"\n'
    )
    (bin_dir / "curl").chmod(0o755)
    config = load_host_config(
        "box", {"api_key_file": str(key_file), "api_port": server.server_address[1]}
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    try:
        for command, status in (
            (check_facts.curl(config, "/v1/models"), 200),
            (check_facts.curl(config, "/v1/models", key=False), 401),
        ):
            assert key not in command
            proc = subprocess.run(
                ["sh", "-c", command], env=env, capture_output=True, text=True, timeout=30
            )
            assert check_facts.parse_http(proc.stdout)[0] == status, proc.stderr
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [f"Bearer {key}", None]
    assert key not in log.read_text() and "--config" in log.read_text()


def test_the_panel_line_and_a_stopped_panel(tmp_path: Path):
    """With panel: "1panel" doctor shows the panel's line; a stopped core (systemctl stop
    1panel-core) is named in the line and in a finding with its fix; the entrance and the
    password never show."""
    config = load_host_config("box", {"nvlink_links": 2, "llamacpp_cuda": False, "panel": "1panel"})
    host = StandinHost(tmp_path, config)
    view, verdicts, text = check(host, config)
    assert failed(verdicts) == {}
    assert (
        "Panel     1Panel v2.3.2, core active/enabled, agent active/enabled, port 10100, "
        "agent socket there, login page answers\n"
    ) in text
    host.outputs["panel"] = str(host.outputs["panel"]).replace(
        "ActiveState=active\nUnitFileState=enabled",
        "ActiveState=inactive\nUnitFileState=enabled",
        1,
    )
    view, verdicts, text = check(host, config)
    assert "Panel     1Panel v2.3.2, core inactive/enabled, agent active/enabled" in text
    assert failed(verdicts) == {
        "panel.services": "box: 1panel-core is inactive and enabled -> journalctl -u 1panel-core "
        f"-n 30; systemctl enable --now 1panel-core; {deploy('panel')}"
    }
    assert "password" not in text.lower().replace("masked", "")


def test_a_server_that_hangs_is_not_sent_the_api_requests(host: StandinHost):
    """/health timed out (a frozen server, what BackendHung reports): doctor sends none of the
    API's requests, each of which would wait its whole limit (minutes in all), and their
    checks say why; the health check says the server does not answer."""
    host.outputs["health"] = Output(
        28, "000", "curl: (28) Operation timed out after 5001 milliseconds with 0 bytes received"
    )
    facts = doctor.gather(host, CONFIG)
    api = [c for c in host.ran if ":8080/v1/" in c or ":8080/props" in c or ":8080/metrics" in c]
    assert api == []
    assert {n for n in doctor.API_REQUESTS if n in facts} == set(doctor.API_REQUESTS)
    verdicts = doctor.evaluate("box", CONFIG, facts, INVENTORY)
    found = failed(verdicts)
    assert "backend.health" in found
    assert found["backend.chat"] == (
        "box: a streamed chat completion returns tokens: cannot tell: not sent: the API's "
        "/health gave no answer within 5 s (the server hangs) -> {fix}"
    ).format(fix=found["backend.chat"].rsplit(" -> ", 1)[1])


def test_a_server_that_answers_is_sent_every_api_request(host: StandinHost):
    doctor.gather(host, CONFIG)
    sent = {name for command, name in host.names.items() if command in host.ran}
    assert set(doctor.API_REQUESTS) <= sent


def test_the_api_requests_are_every_passive_fact_that_asks_the_api_but_health():
    """API_REQUESTS cannot go stale: it is every fact doctor reads whose command requests the
    API (its base URL), /health aside."""
    base = api_base(CONFIG)
    asking = set()
    for name, fact in FACTS.items():
        command = None if fact.active else fact.command_for(CONFIG, TARGET)
        if command and base + "/" in command and name != "health":
            asking.add(name)
    assert asking == set(doctor.API_REQUESTS)
