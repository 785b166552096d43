"""Checks of the served model: the backend's unit, its OpenAI-compatible API, the model file,
and vLLM's container (deploy/backend.py fixes them)."""

from __future__ import annotations

import json

from gpubox.base import layout
from gpubox.checks.core import Check, Finding, Reading, Skip
from gpubox.config import HostConfig
from gpubox.knowledge import answer_sanity, openai_shape, vllm_rules
from gpubox.plans import model
from gpubox.plans import vllm as stage
from gpubox.plans.llamacpp import llama_build as build


def _unit(c: HostConfig) -> str:
    return layout.BACKEND_UNITS[c.backend]


def serving(c: HostConfig) -> str | None:
    return "backend is none in the inventory" if c.backend == "none" else None


def llamacpp(c: HostConfig) -> str | None:
    return None if c.backend == "llamacpp" else "llama.cpp is not the backend"


def vllm(c: HostConfig) -> str | None:
    return None if c.backend == "vllm" else "vLLM is not the backend"


def unit_active(c: HostConfig, r: Reading) -> Finding | None:
    unit = _unit(c)
    props = r.get("services").get(unit, {})
    active, state = props.get("ActiveState", "unknown"), props.get("UnitFileState", "unknown")
    if active == "active" and state == "enabled":
        return None
    return Finding(f"{unit} is {active} and {state}", f"journalctl -u {unit} -n 50; {{deploy}}")


def only_one(c: HostConfig, r: Reading) -> list[str]:
    services = r.get("services")
    mine = layout.BACKEND_UNITS.get(c.backend)
    return [
        f"{unit} runs too (backend is {c.backend})"
        for unit in layout.BACKEND_UNITS.values()
        if unit != mine and services.get(unit, {}).get("ActiveState") == "active"
    ]


def health(c: HostConfig, r: Reading) -> Finding | None:
    code = r.out("health").stdout.strip()
    if code == "200":
        return None
    unit = _unit(c)
    return Finding(
        f"/health answers {code if code not in ('', '000') else 'nothing'}",
        f"journalctl -u {unit} -n 50; sudo systemctl restart {unit}",
    )


def key_file(c: HostConfig, r: Reading) -> list[str]:
    """The key file is root's, mode 600, not empty, and no process shows the key in its
    arguments (the processes are named; the key never leaves the box)."""
    out = r.out("key_file")
    if out.rc != 0:
        return [f"{c.api_key_file} is missing"]
    owner, mode, size = (out.stdout.split() + ["", "", ""])[:3]
    problems = []
    if (owner, mode) != ("root", "600"):
        problems.append(f"{c.api_key_file} is owned by {owner} with mode {mode}, not root 600")
    if size == "0":
        problems.append(f"{c.api_key_file} is empty")
    shown = r.get("key_in_ps")
    if shown:
        problems.append(
            "the API key shows in the arguments of "
            + ", ".join(f"{p.split()[0]} ({p.split()[-1]})" for p in shown)
        )
    return problems


def refuses_without_key(c: HostConfig, r: Reading) -> str | None:
    status, _ = r.get("api_unauthorized")
    return None if status == 401 else f"/v1/models without the key answered {status}"


def lists_alias(c: HostConfig, r: Reading) -> str | None:
    status, body = r.get("api_models")
    ids = [m.get("id") for m in json.loads(body).get("data", [])] if status == 200 else []
    if c.model_alias in ids:
        return None
    return f"/v1/models ({status}) lists {ids}, not {c.model_alias}"


def streams_tokens(c: HostConfig, r: Reading) -> str | None:
    status, body = r.get("api_chat")
    if status != 200:
        return f"a chat completion answered {status}: {body[:300]}"
    pieces = []
    for line in body.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices", []):
                delta = choice.get("delta", {})
                pieces.append(delta.get("content") or delta.get("reasoning_content") or "")
    if "data: [DONE]" in body and "".join(pieces):
        return None
    return f"the stream carried no tokens: {body[:300]}"


def sane(c: HostConfig, r: Reading) -> list[Finding]:
    """Both prompts of gpubox.knowledge.answer_sanity answered with text: not empty, not one
    character
    repeated (vLLM #10656: ``!!!!!`` to short prompts on Volta and Turing), not bytes."""
    problems = []
    for which in answer_sanity.PROMPTS:
        status, body = r.get(f"sane_{which}")
        if status != 200:
            problems.append(f"the {which} prompt answered {status}: {body[:300]}")
            continue
        problem = answer_sanity.answer_problem(openai_shape.parse(body, stream=False))
        if problem:
            problems.append(f"the answer to the {which} prompt {problem}")
    smoke = "gpubox bench --smoke {inv} (which server flags answer text)"
    fix = f"journalctl -u {_unit(c)} -n 50; {smoke}"
    return [Finding(p, fix) for p in problems]


def slots(c: HostConfig, r: Reading) -> str | None:
    """llama-server's /props: the context of one slot (model_ctx: -c is model_ctx x
    model_parallel without the unified KV cache) and the number of slots."""
    status, body = r.get("api_props")
    if status != 200:
        return f"/props answered {status}: {body[:200]}"
    props = json.loads(body)
    slot_ctx = props.get("default_generation_settings", {}).get("n_ctx")
    if (slot_ctx, props.get("total_slots")) == (c.model_ctx, c.model_parallel):
        return None
    return (
        f"each of llama-server's {props.get('total_slots')} slots holds {slot_ctx} tokens; "
        f"the config wants {c.model_parallel} slots of {c.model_ctx}"
    )


def llama_build(c: HostConfig, r: Reading) -> list[str]:
    b, sections = build(c), r.get("llama_build")
    version = r.out("llama_build").stdout.split("@@gpubox ")[0]
    problems = []
    if not b.is_version(version):
        problems.append(
            f"{b.binary} --version says {version.strip()[:200]!r}, not build {b.build_number} "
            f"at commit {b.short_commit} (the catalog's)"
        )
    if "bench present" not in sections:
        problems.append(f"no {b.bench}")
    return problems


def metrics(c: HostConfig, r: Reading) -> str | None:
    status, body = r.get("api_metrics")
    return None if status == 200 and "llamacpp:" in body else f"/metrics answered {status}"


def memory_on_every_gpu(c: HostConfig, r: Reading) -> str | None:
    if c.backend == "llamacpp" and not c.llamacpp_cuda:
        raise Skip("llama.cpp is built for the CPU (llamacpp_cuda false)")
    gpus = {g["uuid"] for g in r.get("smi_query")}
    holding = {a["gpu_uuid"] for a in r.get("smi_apps")}
    missing = sorted(gpus - holding)
    return f"no server memory on {missing}" if missing else None


def model_verified(c: HostConfig, r: Reading) -> str | None:
    """The model file is the one the deploy verified: its size and mtime are those its
    ``.gpubox-verified`` marker recorded (a truncated or rewritten file is not)."""
    p, state = model.plan(c), r.get("model_state")
    if model.verified(p, state):
        return None
    values = dict(line.partition("=")[::2] for line in state.splitlines())
    if not values.get("file"):
        return f"the model file {p.path} is missing"
    if not values.get("marker"):
        return f"the model file {p.path} was never verified (no {p.marker})"
    return (
        f"the model file {p.path} changed since it was verified ({values['file']}; "
        f"verified: {values['marker']})"
    )


def model_checksum(c: HostConfig, r: Reading) -> str | None:
    p = model.plan(c)
    if not p.sha256:
        raise Skip("no pinned checksum for this model file")
    got = r.get("model_sha256")
    return None if got == p.sha256 else f"{p.file} has sha256 {got}, expected {p.sha256}"


def tool_call(stream: bool):
    """A judge: a request with a tool and tool_choice "auto" gets an OpenAI tool call
    (gpubox.knowledge.openai_shape absorbs how llama.cpp's and vLLM's answers differ)."""
    fact = "tool_call_streamed" if stream else "tool_call_whole"

    def judge(c: HostConfig, r: Reading) -> str | None:
        status, body = r.get(fact)
        kind = "streamed" if stream else "whole"
        if status != 200:
            return f"a {kind} request with a tool answered {status}: {body[:300]}"
        request = openai_shape.tool_request(c.model_alias, stream)
        model = c.catalog.get("models", {}).get(c.model, {})
        answer = openai_shape.parse(body, stream)
        problems = openai_shape.tool_call_problems(
            answer,
            openai_shape.offered_names(request),
            expect_reasoning=bool(model.get("thinking_output_tokens")),
        )
        if not problems:
            return None
        return (
            f"the {kind} answer to a request with a tool is not a parsed tool call: "
            + "; ".join(problems)
            + f" ({openai_shape.describe(answer)})"
        )

    return judge


def vllm_container(c: HostConfig, r: Reading) -> list[str]:
    info, image = r.get("vllm_inspect"), c.catalog["vllm"]["image"]
    problems = []
    if info["Config"]["Image"] != image:
        problems.append(f"{layout.VLLM} runs {info['Config']['Image']}, not {image}")
    args, want = info["Args"], stage.vllm_args(c)
    if args[-len(want) :] != want:
        problems.append(f"vLLM runs with {args}, not {want}")
    return problems


def vllm_caches(c: HostConfig, r: Reading) -> list[str]:
    info = r.get("vllm_inspect")
    mounts = {m["Destination"]: m["Source"] for m in info["Mounts"]}
    problems = [
        f"{path} is not the host's {stage.CACHE_DIR}/{name}: {mounts}"
        for name, path in stage.CACHES.items()
        if mounts.get(path) != f"{stage.CACHE_DIR}/{name}"
    ]
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    problems += [
        f"{key}={env.get(key)} in the container"
        for key, value in stage.CACHE_ENV.items()
        if env.get(key) != value
    ]
    return problems


def vllm_warm(c: HostConfig, r: Reading) -> list[str]:
    """After a start and its warm-up, Triton's and vLLM's caches hold files on the host: the
    next restart reuses them instead of compiling for minutes."""
    sections = r.get("vllm_cache_files")
    return [
        f"{layout.VLLM_CACHE_DIR}/{name} is empty: the compile caches are not kept"
        for name in ("triton", "vllm")
        if not sections.get(name, "").strip()
    ]


def vllm_compat(c: HostConfig, r: Reading) -> list[str]:
    """vLLM runs on the CUDA driver the deploy chose (gpubox.plans.vllm.compat_env): the
    image's forward-compatibility libraries where the driver's CUDA is older than the image's,
    the host's driver otherwise. Proven by the container's switch, the image's libraries and
    the libcuda.so that vLLM's running processes mapped."""
    cuda = vllm_rules.image_info(c.catalog["vllm"]).cuda
    want = stage.compat_env(c)
    env = dict(e.split("=", 1) for e in r.get("vllm_inspect")["Config"]["Env"])
    problems = [
        f"{key}={env.get(key, '(unset)')} in the container, not {value}"
        for key, value in want.items()
        if env.get(key) != value
    ]
    loaded = r.get("vllm_libcuda")
    if not loaded:
        return [*problems, f"no process of {layout.VLLM} has a libcuda.so loaded"]
    if want[stage.COMPAT_ENV] == "1":
        out = r.out("vllm_compat")
        if out.rc != 0:
            problems.append(out.stderr.strip() or out.first_error_line())
        path = stage.compat_dir(str(cuda))
        if not any(lib.startswith(path + "/") for lib in loaded):
            problems.append(
                f"vLLM runs on {', '.join(loaded)}, not the image's {path}/libcuda.so.*: "
                f"driver branch {c.branch} supports CUDA {vllm_rules.driver_cuda(c.branch)}, "
                f"older than the image's {cuda}"
            )
    elif compat := [lib for lib in loaded if "/compat/" in lib]:
        problems.append(
            f"vLLM runs on {', '.join(compat)}, forward-compatibility libraries, though "
            f"driver branch {c.branch} runs the image's CUDA {cuda} itself"
        )
    return problems


B = "backend"
CHECKS = [
    Check(
        "backend.service",
        "the backend's unit is active and enabled",
        "quick",
        ("services",),
        unit_active,
        applies=serving,
    ),
    Check("backend.only-one", "no other backend runs", "quick", ("services",), only_one),
    Check("backend.health", "/health answers 200", "quick", ("health",), health, applies=serving),
    Check(
        "backend.key",
        "the API key file is root's alone and in no process's arguments",
        "quick",
        ("key_file", "key_in_ps"),
        key_file,
        applies=serving,
    ),
    Check(
        "backend.auth",
        "a request without the key is refused",
        "quick",
        ("api_unauthorized",),
        refuses_without_key,
        applies=serving,
    ),
    Check(
        "backend.models",
        "/v1/models lists the alias",
        "quick",
        ("api_models",),
        lists_alias,
        applies=serving,
    ),
    Check(
        "backend.chat",
        "a streamed chat completion returns tokens",
        "quick",
        ("api_chat",),
        streams_tokens,
        applies=serving,
    ),
    Check(
        "backend.sane",
        "a short and a long prompt are answered with text, not garbage",
        "quick",
        ("sane_short", "sane_long"),
        sane,
        applies=serving,
    ),
    Check(
        "backend.slots",
        "every slot has the whole context",
        "quick",
        ("api_props",),
        slots,
        applies=llamacpp,
    ),
    Check(
        "backend.build",
        "llama-server is the catalog's build, llama-bench beside it",
        "quick",
        ("llama_build",),
        llama_build,
        applies=llamacpp,
    ),
    Check(
        "backend.metrics", "/metrics answers", "quick", ("api_metrics",), metrics, applies=llamacpp
    ),
    Check(
        "backend.gpu-memory",
        "the server holds memory on every GPU",
        "gpu",
        ("smi_query", "smi_apps"),
        memory_on_every_gpu,
        applies=serving,
    ),
    Check(
        "model.verified",
        "the model file is the one the deploy verified",
        "quick",
        ("model_state",),
        model_verified,
        applies=llamacpp,
        stage="model",
    ),
    Check(
        "model.checksum",
        "the model file matches its pinned sha256",
        "slow",
        ("model_sha256",),
        model_checksum,
        applies=llamacpp,
        stage="model",
    ),
    Check(
        "backend.tool-call-whole",
        "a request with a tool gets a parsed tool call",
        "slow",
        ("tool_call_whole",),
        tool_call(False),
        applies=serving,
    ),
    Check(
        "backend.tool-call-streamed",
        "a streamed request with a tool gets a tool call",
        "slow",
        ("tool_call_streamed",),
        tool_call(True),
        applies=serving,
    ),
    Check(
        "vllm.container",
        "the container runs the configured image and checkpoint",
        "quick",
        ("vllm_inspect",),
        vllm_container,
        applies=vllm,
        stage=B,
    ),
    Check(
        "vllm.caches",
        "the compile caches are host volumes",
        "quick",
        ("vllm_inspect",),
        vllm_caches,
        applies=vllm,
        stage=B,
    ),
    Check(
        "vllm.warm",
        "the warm-up left compiled kernels on the host",
        "",
        ("vllm_cache_files",),
        vllm_warm,
        applies=vllm,
        stage=B,
    ),
    Check(
        "vllm.compat",
        "vLLM runs on the CUDA driver chosen for it (the image's compat libraries or the host's)",
        "",
        ("vllm_inspect", "vllm_libcuda", "vllm_compat"),
        vllm_compat,
        applies=vllm,
        stage=B,
    ),
]
