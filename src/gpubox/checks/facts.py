"""Every fact a check or doctor reads on a host: the command, and the parser of its output.

Read-only commands. The few marked ``active`` act on the box for a moment (a container run, a
GPU load, systemctl daemon-reload, a generated answer) or take many seconds: only the host
checks read them."""

from __future__ import annotations

import json
import shlex
from typing import Any

from gpubox import parsers
from gpubox.base import layout
from gpubox.checks.core import Fact, fact
from gpubox.config import HostConfig, Target
from gpubox.knowledge import answer_sanity, openai_shape, panel, reads, vllm_rules
from gpubox.knowledge.reads import section
from gpubox.parsers import parse_sections
from gpubox.plans import model
from gpubox.plans import vllm as vllm_stage
from gpubox.plans.llamacpp import llama_build

QUERY_FIELDS = list(reads.GPU_QUERY_FIELDS)
APPS_FIELDS = ["gpu_uuid", "pid", "process_name", "used_memory"]
SERVICES = [layout.PERSISTENCED, layout.DOCKER, layout.DCGM, *layout.BACKEND_UNITS.values()]
DPKG_QUERY = "dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'"
PINS = (layout.DRIVER_PIN, layout.TOOLKIT_PIN, layout.DCGM_PIN)
NVLINK_FIELDS = "449,1011,1012"
DAEMON_RELOAD_CONTAINER = "gpubox-check-daemon-reload"


def first_word(text: str) -> str:
    """`sha256sum FILE`: the checksum, the first word."""
    return text.split()[0]


def parse_inspect(text: str) -> dict[str, Any]:
    """`docker inspect NAME`: the one container's record."""
    (record,) = json.loads(text)
    return dict(record)


def api_base(config: HostConfig) -> str:
    host = str(config.api_host)
    return f"http://{'127.0.0.1' if host in ('', '0.0.0.0', '::') else host}:{config.api_port}"


def curl(config: HostConfig, path: str, *args: str, key: bool = True, limit: int = 120) -> str:
    """A request made on the box itself: prints the HTTP status, a newline, then the body.
    The key is read from its file there by sed and handed to curl on standard input as a
    curl config line (``header = "..."``, \\ and \" escaped): never on a command line."""
    header = r"""-e 's/[\\"]/\\&/g' -e '1s/.*/header = "Authorization: Bearer &"/p'"""
    feed = f"sed -n {header} {shlex.quote(config.api_key_file)} | " if key else ""
    auth = "--config - " if key else ""
    out = "/tmp/gpubox-check.$$"
    return (
        f"{feed}curl -sS --max-time {limit} -o {out} -w '%{{http_code}}' {auth}"
        + "".join(shlex.quote(a) + " " for a in args)
        + shlex.quote(api_base(config) + path)
        + f"; echo; cat {out} 2>/dev/null; rm -f {out}"
    )


def parse_http(text: str) -> tuple[int, str]:
    status, _, body = text.partition("\n")
    return (int(status) if status.strip().isdigit() else 0), body


def _serving(command: Any) -> Any:
    """Only when a backend serves."""
    return lambda c, t: command(c, t) if c.backend != "none" else None


def _llamacpp(command: Any) -> Any:
    return lambda c, t: command(c, t) if c.backend == "llamacpp" else None


def _panel(config: HostConfig, target: Target | None) -> str | None:
    """Only with a panel."""
    return panel.state_command(config) if config.panel != "none" else None


def _policy(config: HostConfig, target: Target | None) -> str | None:
    if target is None:
        return None
    packages = config.driver_packages(target.family).installed
    return "LC_ALL=C apt-cache policy " + " ".join(packages)


def _docker_users(config: HostConfig, target: Target | None) -> tuple[Any, ...] | None:
    """docker_users' groups (none to read without one)."""
    return (config.docker_users,) if config.docker_users else None


def _pins(config: HostConfig, target: Target | None) -> str:
    return "; ".join(
        f"if [ -f {p} ]; then {section(p)}; cat {p}; else {section(p + ' missing')}; fi"
        for p in PINS
    )


def _container(run_args: str) -> Any:
    return lambda c, t: (
        f"docker run --rm {run_args} {shlex.quote(c.docker_check_image)} nvidia-smi -L"
    )


def _daemon_reload(config: HostConfig, target: Target | None) -> str:
    name, image = DAEMON_RELOAD_CONTAINER, shlex.quote(config.docker_check_image)
    return (
        f"docker rm -f {name} >/dev/null 2>&1; "
        f"{section('start')}; docker run -d --name {name} --gpus all {image} sleep 120 2>&1; "
        f"{section('before')}; docker exec {name} nvidia-smi -L 2>&1; "
        f"systemctl daemon-reload; "
        f"{section('after')}; docker exec {name} nvidia-smi -L 2>&1; "
        f"docker rm -f {name} >/dev/null 2>&1; true"
    )


def _exporter(config: HostConfig, target: Target | None) -> str | None:
    if not config.dcgm_exporter:
        return None
    address = config.dcgm_exporter_address
    host = "127.0.0.1" if address in ("0.0.0.0", "") else address
    return f"curl -fsS --max-time 10 http://{host}:{config.dcgm_exporter_port}/metrics"


def _key_file(config: HostConfig, target: Target | None) -> str | None:
    if config.backend == "none":
        return None
    return f"stat -c '%U %a %s' {shlex.quote(config.api_key_file)}"


def _key_in_ps(config: HostConfig, target: Target | None) -> str | None:
    """Processes whose arguments hold the API key, as "PID PROGRAM" (the program "?" where
    its own name holds the key). awk reads the key from its file on the box: the key never
    leaves the box, nor shows in any command's arguments."""
    if config.backend == "none":
        return None
    return (
        "ps -eww -o pid=,args= | awk "
        + shlex.quote(KEY_IN_PS_AWK)
        + f" {shlex.quote(config.api_key_file)} -"
    )


KEY_IN_PS_AWK = (
    "FILENAME == ARGV[1] { if (FNR == 1) key = $0; next } "
    'key != "" && index($0, key) { n = split($2, p, "/"); '
    'print $1, (index(p[n], key) ? "?" : p[n]) }'
)


def chat(config: HostConfig, request: dict[str, Any], limit: int = 120) -> str:
    """A chat completion request made on the box (JSON in, HTTP status and body out)."""
    return curl(
        config,
        "/v1/chat/completions",
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps(request),
        limit=limit,
    )


def _chat(config: HostConfig, target: Target | None) -> str:
    request = {
        "model": config.model_alias,
        "stream": True,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello."}],
    }
    return chat(config, request)


def _sane(which: str) -> Any:
    """One of backend.sane's two prompts (gpubox.knowledge.answer_sanity), answered whole."""

    def command(config: HostConfig, target: Target | None) -> str | None:
        if config.backend == "none":
            return None
        prompt = answer_sanity.PROMPTS[which]
        return chat(config, answer_sanity.request(config.model_alias, prompt))

    return command


def _tool_call(stream: bool) -> Any:
    def command(config: HostConfig, target: Target | None) -> str | None:
        if config.backend == "none":
            return None
        return chat(config, openai_shape.tool_request(config.model_alias, stream), limit=300)

    return command


def _llama_build(config: HostConfig, target: Target | None) -> str | None:
    if config.backend != "llamacpp":
        return None
    b = llama_build(config)
    return (
        f"{shlex.quote(b.binary)} --version 2>&1; "
        f"if [ -x {shlex.quote(b.bench)} ]; then {section('bench present')}; "
        f"else {section('bench missing')}; fi"
    )


def _model_state(config: HostConfig, target: Target | None) -> str | None:
    if config.backend != "llamacpp":
        return None
    return model.model_state_command(model.plan(config))


def _model_sha256(config: HostConfig, target: Target | None) -> str | None:
    if config.backend != "llamacpp":
        return None
    return f"sha256sum {shlex.quote(model.plan(config).path)}"


def _vllm(command: str) -> Any:
    return lambda c, t: command if c.backend == "vllm" else None


def _vllm_compat(config: HostConfig, target: Target | None) -> str | None:
    """The image's forward-compatibility libraries, where the container runs on them."""
    if config.backend != "vllm":
        return None
    cuda = vllm_rules.image_info(config.catalog["vllm"]).cuda
    if not vllm_rules.needs_forward_compat(cuda, config.branch):
        return None
    return vllm_stage.compat_check_command(
        config.catalog["vllm"]["image"], str(cuda), str(vllm_rules.driver_cuda(config.branch))
    )


def _vllm_cache_files(config: HostConfig, target: Target | None) -> str | None:
    if config.backend != "vllm":
        return None
    return "; ".join(
        f"{section(name)}; find {shlex.quote(layout.VLLM_CACHE_DIR + '/' + name)} -type f "
        "2>/dev/null | head -n 1"
        for name in ("triton", "vllm")
    )


def _health(config: HostConfig, target: Target | None) -> str | None:
    if config.backend == "none":
        return None
    return "curl -sS --max-time 5 -o /dev/null -w '%{http_code}' " + shlex.quote(
        api_base(config) + "/health"
    )


fact(
    Fact.of("os_release", reads.OS_RELEASE),
    Fact("kernel", "uname -r"),
    Fact.of("smi_query", reads.GPU_QUERY),
    Fact(
        "smi_apps",
        f"nvidia-smi --query-compute-apps={','.join(APPS_FIELDS)} --format=csv,noheader,nounits",
        lambda s: parsers.parse_query_gpu(s, APPS_FIELDS),
        parser_name="parsers.parse_query_gpu",
    ),
    Fact.of("nvlink", reads.NVLINK_STATUS),
    Fact("topo", "nvidia-smi topo -m", parsers.parse_topo_matrix),
    Fact.of("lspci", reads.NVIDIA_PCI),
    Fact.of("sb_state", reads.SECURE_BOOT),
    Fact.of("mok", reads.MOK_STATE, lambda c, t: (t.family,) if t else None),
    Fact.of("module_version", reads.LOADED_DRIVER),
    Fact.of("nouveau", reads.MODULE_LOADED, lambda c, t: ("nouveau",)),
    Fact.of("kernels", reads.KERNEL_STATE),
    Fact("dpkg", DPKG_QUERY, parsers.parse_dpkg_query),
    Fact.of("holds", reads.HELD_PACKAGES),
    Fact("policy", _policy, parsers.parse_apt_policy),
    Fact("pins", _pins, parse_sections),
    Fact("unattended", "apt-config dump Unattended-Upgrade::Package-Blacklist"),
    Fact.of("services", reads.UNIT_STATES, lambda c, t: tuple(SERVICES)),
    Fact("nvcc", "bash -lc 'command -v nvcc && nvcc --version'", parsers.parse_nvcc_version),
    Fact("cuda_link", f"readlink -e {layout.USR_LOCAL_CUDA}", ok=(0, 1)),
    Fact(
        "ldconfig_cudart",
        "ldconfig -p | awk '/libcudart\\.so/ {print $NF}' | xargs -r readlink -f",
        str.split,
    ),
    Fact("cuda13_dirs", "ls -d /usr/local/cuda-13* 2>/dev/null || true", str.split),
    Fact("docker_info", "docker info --format '{{json .}}'", json.loads),
    Fact("docker_version", "docker version --format '{{.Server.Version}}'", str.strip),
    Fact("daemon_json", f"cat {layout.DAEMON_JSON}"),
    Fact.of("docker_users", reads.USER_GROUPS, _docker_users),
    Fact("cdi_list", "nvidia-ctk cdi list 2>&1"),
    Fact("container_all", _container("--gpus all"), parsers.parse_smi_list, active=True),
    Fact(
        "container_cdi",
        _container("--device nvidia.com/gpu=all"),
        parsers.parse_smi_list,
        active=True,
    ),
    Fact("daemon_reload", _daemon_reload, parse_sections, active=True),
    Fact("dcgm_discovery", "dcgmi discovery -l", parsers.parse_dcgmi_discovery),
    Fact("dcgm_dmon", f"dcgmi dmon -e {NVLINK_FIELDS} -c 3", parsers.parse_dcgmi_dmon, active=True),
    Fact("listening", "ss -H -ltnp"),
    Fact("exporter_metrics", _exporter),
    # the name the dcgm-exporter unit reads at its start (`hostname` there too)
    Fact("hostname", lambda c, t: "hostname" if c.dcgm_exporter else None, str.strip),
    Fact("gpu_burn_list", "gpu-burn -l", parsers.parse_gpu_burn_list, active=True),
    Fact("gpu_burn_short", "gpu-burn 5 2>&1", parsers.parse_gpu_burn, active=True),
    Fact("nvtop", "nvtop --version"),
    Fact("burnin", f"cat {layout.BURNIN_RECORD}"),
    Fact("health", _health, in_turn=True),
    Fact("key_file", _key_file, str.split),
    Fact("key_in_ps", _key_in_ps, str.splitlines, in_turn=True),
    Fact(
        "api_unauthorized",
        _serving(lambda c, t: curl(c, "/v1/models", key=False)),
        parse_http,
        in_turn=True,
    ),
    Fact("api_models", _serving(lambda c, t: curl(c, "/v1/models")), parse_http, in_turn=True),
    Fact("api_chat", _serving(_chat), parse_http, in_turn=True),
    Fact("sane_short", _sane("short"), parse_http, in_turn=True),
    Fact("sane_long", _sane("long"), parse_http, in_turn=True),
    Fact("api_props", _llamacpp(lambda c, t: curl(c, "/props")), parse_http, in_turn=True),
    Fact("api_metrics", _llamacpp(lambda c, t: curl(c, "/metrics")), parse_http, in_turn=True),
    Fact("llama_build", _llama_build, parse_sections),
    Fact("model_state", _model_state),
    Fact("model_sha256", _model_sha256, first_word, active=True),
    Fact("tool_call_whole", _tool_call(False), parse_http, active=True),
    Fact("tool_call_streamed", _tool_call(True), parse_http, active=True),
    Fact("vllm_inspect", _vllm(f"docker inspect {layout.VLLM}"), parse_inspect),
    Fact("vllm_cache_files", _vllm_cache_files, parse_sections),
    Fact("vllm_compat", _vllm_compat, active=True),
    # which libcuda.so the running vLLM's processes mapped (the engine's and the workers'):
    # the image's compat libraries or the host's driver, whatever set it (vLLM, the toolkit)
    Fact(
        "vllm_libcuda",
        _vllm(
            f"docker exec {layout.VLLM} sh -c 'cat /proc/[0-9]*/maps 2>/dev/null "
            '| grep -o "/[^ ]*/libcuda\\.so[^ ]*" | sort -u\''
        ),
        str.split,
    ),
    # the optional server panel (gpubox.knowledge.panel): units, 1pctl, user-info filtered on the
    # box,
    # the agent's socket and the login page on the entrance
    Fact("panel", _panel, panel.parse_state),
)
