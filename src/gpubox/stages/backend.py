"""Stage: the OpenAI-compatible API: llama.cpp built on the box for its GPUs (the default on
Volta) or vLLM in Docker, serving the configured model with an API key. Switching the backend
stops and disables the other one.

llama.cpp's build is all or nothing: its marker (BUILD-INFO.json) is removed before anything in
the install directory changes and written last, after the complete build's bin/ has replaced
the old one in a rename and the size of each of its files is recorded (BUILD-FILES). A build
cut short (a killed deploy) leaves no marker and is built again; a deleted or changed
llama-server or library is rebuilt even when the marker matches; the service only ever runs a
bin/ that was complete when it was put in place."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, deploy, operation
from pyinfra.operations import apt, server, systemd

from gpubox.config import HostConfig
from gpubox.facts import CommandOutput, ManifestProblems, manifest_command
from gpubox.stages import ManagedFiles, current_config, render
from gpubox.stages.model import model as model_stage
from gpubox.stages.model import plan as model_plan

LLAMA_UNIT = "gpubox-llama-server"
VLLM_UNIT = "gpubox-vllm"
BUILD_INFO = "BUILD-INFO.json"
BUILD_FILES = "BUILD-FILES"  # size of each file of bin/, recorded after a complete build
LLAMA_BUILD_PACKAGES = ["cmake", "g++", "make", "libssl-dev", "curl"]


@dataclass(frozen=True)
class LlamaBuild:
    tag: str
    url: str
    sha256: str
    commit: str
    cuda: bool
    architectures: str  # CMAKE_CUDA_ARCHITECTURES, e.g. "70"
    nvcc: str
    ccache: bool
    prefix: str

    @property
    def directory(self) -> str:
        return f"{self.prefix}/{self.tag}"

    @property
    def binary(self) -> str:
        return f"{self.directory}/bin/llama-server"

    def cmake_flags(self) -> list[str]:
        number = "".join(ch for ch in self.tag if ch.isdigit())
        flags = [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            f"-DLLAMA_BUILD_NUMBER={number}",
        ]
        if self.commit:
            flags.append(f"-DLLAMA_BUILD_COMMIT={self.commit}")
        if self.cuda:
            # real sm_70 code, not PTX compiled at the first start
            flags += [
                "-DGGML_CUDA=ON",
                f"-DCMAKE_CUDA_ARCHITECTURES={self.architectures}",
                f"-DCMAKE_CUDA_COMPILER={self.nvcc}",
            ]
        else:
            flags.append("-DGGML_CUDA=OFF")
        if self.ccache:
            flags += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
            if self.cuda:
                flags.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
        return flags

    @property
    def info(self) -> str:
        """What the install records; a different one means rebuild."""
        return json.dumps(
            {"tag": self.tag, "sha256": self.sha256, "flags": self.cmake_flags()}, sort_keys=True
        )


def llama_build(config: HostConfig) -> LlamaBuild:
    llama = config.catalog["llamacpp"]
    major, minor = config.gpu.compute_capability
    return LlamaBuild(
        tag=llama["tag"],
        url=llama["url"].format(tag=llama["tag"]),
        sha256=llama["sha256"],
        commit=llama["commit"],
        cuda=config.llamacpp_cuda,
        architectures=f"{major}{minor}",
        nvcc=f"{config.cuda['prefix']}/bin/nvcc",
        ccache=config.llamacpp_ccache,
        prefix=llama["prefix"],
    )


def build_commands(b: LlamaBuild) -> list[str]:
    """One shell command, all or nothing (`set -e`, one statement per step so that no failure
    hides inside an `&&` chain): the marker goes first, the new bin/ replaces the old one only
    once complete, the file sizes and then the marker are written last."""
    q = shlex.quote
    d = q(b.directory)
    verify = (
        f'if [ "$got" != {q(b.sha256)} ]; then echo "gpubox: llama.cpp {b.tag} tarball has '
        f'sha256 $got, the catalog pins {b.sha256}; refusing it" >&2; exit 1; fi; '
        if b.sha256
        else f'echo "gpubox: WARNING: no pinned sha256 for llama.cpp {b.tag}; got $got '
        '(set llamacpp.sha256 to pin it)" >&2; '
    )
    env = "CCACHE_DIR=/var/cache/gpubox-ccache CCACHE_BASEDIR=" + d + " " if b.ccache else ""
    return [
        "set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
        # not built until this build is complete
        f"rm -f {d}/{BUILD_INFO} {d}/{BUILD_FILES}; "
        f"echo 'gpubox: downloading llama.cpp {b.tag}'; "
        f'curl -fsSL --retry 3 -o "$t/src.tar.gz" {q(b.url)}; '
        'got=$(sha256sum "$t/src.tar.gz" | cut -d" " -f1); '
        + verify
        + f"rm -rf {d}/src {d}/build {d}/bin.new {d}/bin.old; mkdir -p {d}/src; "
        f'tar -xzf "$t/src.tar.gz" -C {d}/src --strip-components=1; '
        f"echo 'gpubox: building llama-server {b.tag} (this takes a while)'; "
        f"{env}cmake -S {d}/src -B {d}/build {' '.join(b.cmake_flags())} >/dev/null; "
        f"{env}cmake --build {d}/build -j$(nproc) --target llama-server; "
        f"test -x {d}/build/bin/llama-server; "
        f"cp -a {d}/build/bin {d}/bin.new; "
        # two renames: bin/ is always a complete build, never a half-copied one
        f"if [ -e {d}/bin ]; then mv {d}/bin {d}/bin.old; fi; "
        f"mv {d}/bin.new {d}/bin; rm -rf {d}/bin.old; "
        + manifest_command(b.directory, BUILD_FILES, "bin/*")
        + "; "
        f"echo {q(b.info)} > {d}/{BUILD_INFO}.new; mv {d}/{BUILD_INFO}.new {d}/{BUILD_INFO}",
    ]


def llama_args(config: HostConfig, model_path: str) -> list[str]:
    sampling = config.catalog["models"][config.model]["sampling"]
    args = [
        "-m", model_path,
        "--alias", config.model_alias,
        "--host", config.api_host,
        "--port", str(config.api_port),
        "-c", str(config.model_ctx),
        "-np", str(config.model_parallel),
        "-ngl", "999",  # every layer on the GPUs
        "-sm", "layer",
        "-ts", ",".join(["1"] * config.gpu_count),
        "-fa", "on",
        "--jinja",
        "--reasoning-format", "deepseek",
        "--temp", str(sampling["temp"]),
        "--top-p", str(sampling["top_p"]),
        "--top-k", str(sampling["top_k"]),
        "--min-p", str(sampling["min_p"]),
        "--api-key-file", "${CREDENTIALS_DIRECTORY}/api-key",
        "--metrics",
    ]  # fmt: skip
    return args + [str(a) for a in config.llamacpp_extra_args]


def flag_check_command(binary: str, args: list[str]) -> str:
    """Fail with the flags `llama-server --help` does not know (they change between tags)."""
    flags = sorted({a for a in args if a.startswith("-") and not a[1:2].isdigit()})
    return (
        f"help=$({binary} --help 2>&1); missing=; for f in {' '.join(flags)}; do "
        'echo "$help" | grep -qE -- "(^|[ ,])$f([ ,=]|$)" || missing="$missing $f"; done; '
        'if [ -n "$missing" ]; then echo "gpubox: this llama-server does not know:$missing '
        '(llama.cpp flags change between tags)" >&2; exit 1; fi'
    )


@operation(is_idempotent=False)
def wait_for_health(port: int, unit: str, timeout: int):
    """Wait until the API answers /health with 200 (model loading takes minutes)."""

    def _wait(state, host) -> None:
        import time

        from gevent import sleep

        start = time.monotonic()
        last = start
        while time.monotonic() - start < timeout:
            _, out = host.run_shell_command(
                f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health || true"
            )
            code = "".join(out.stdout_lines).strip()
            if code == "200":
                logger.info(f"{host.name}: {unit} healthy after {time.monotonic() - start:.0f}s")
                return
            if time.monotonic() - last > 15:
                logger.info(
                    f"{host.name}: waiting for {unit} (/health {code or 'no answer'}, "
                    f"{time.monotonic() - start:.0f}s)"
                )
                last = time.monotonic()
            sleep(1)
        _, out = host.run_shell_command(f"journalctl -u {unit} -n 30 --no-pager")
        raise OperationError(
            f"{unit} did not answer /health within {timeout}s (health_timeout); its last log "
            "lines:\n" + "\n".join(out.stdout_lines)
        )

    yield FunctionCommand(_wait, (), {})


def api_key(config: HostConfig):
    """A key generated on the box at the first deploy, root-only; never in the repository."""
    q = shlex.quote(config.api_key_file)
    present = host.get_fact(CommandOutput, command=f"test -s {q} && echo yes").strip()
    if present == "yes":
        return None
    return server.shell(
        name=f"Generate the API key ({config.api_key_file}, root only)",
        commands=[
            f"mkdir -p $(dirname {q}) && umask 077 && "
            f"head -c 32 /dev/urandom | base64 | tr -d '/+=\\n' > {q} && chmod 600 {q}"
        ],
    )


def stop_other(unit: str) -> None:
    present = host.get_fact(
        CommandOutput, command=f"systemctl list-unit-files {unit}.service --no-legend"
    ).strip()
    if present:
        systemd.service(
            name=f"Stop and disable {unit} (another backend is configured)",
            service=unit,
            running=False,
            enabled=False,
        )


def llamacpp(config: HostConfig, model_change) -> None:
    b = llama_build(config)
    packages = LLAMA_BUILD_PACKAGES + (["ccache"] if b.ccache else [])
    apt.packages(name="llama.cpp build dependencies", packages=packages, no_recommends=True)
    info = host.get_fact(CommandOutput, command=f"cat {b.directory}/{BUILD_INFO}").strip()
    manifest = f"{b.directory}/{BUILD_FILES}"
    damaged = host.get_fact(ManifestProblems, manifest=manifest) if info == b.info else []
    build = None
    if info == b.info and damaged == [manifest]:
        # built by a gpubox that recorded no sizes: record them, do not rebuild
        binary = host.get_fact(CommandOutput, command=f"test -x {b.binary} && echo yes").strip()
        if binary == "yes":
            server.shell(
                name=f"Record the files of llama-server {b.tag}",
                commands=[manifest_command(b.directory, BUILD_FILES, "bin/*")],
            )
            damaged = []
    if info != b.info or damaged:
        why = f"{', '.join(damaged)} missing or changed" if damaged else f"CUDA: {b.cuda}"
        logger.info(f"{host.name}: llama.cpp {b.tag} will be built (minutes; {why})")
        build = server.shell(
            name=f"Build llama-server {b.tag} ({'CUDA ' + b.architectures if b.cuda else 'CPU'})",
            commands=build_commands(b),
        )
    server.user(
        name="System user llama",
        user="llama",
        system=True,
        home="/var/lib/llama",
        shell="/usr/sbin/nologin",
        create_home=True,
    )
    key = api_key(config)
    args = llama_args(config, model_plan(config).path)
    unit_text = render(
        "llama-server.service.j2",
        tag=b.tag,
        model_file=model_plan(config).file,
        alias=config.model_alias,
        binary=b.binary,
        args=" ".join(shlex.quote(a) if "$" not in a else a for a in args),
        api_key_file=config.api_key_file,
    )
    unit_path = f"/etc/systemd/system/{LLAMA_UNIT}.service"
    unit = ManagedFiles({unit_path: unit_text}).put("llama-server unit", unit_path)
    changed = [c for c in (build, unit, model_change, key) if c is not None]

    def any_change() -> bool:
        return any(c.did_change() for c in changed)

    server.shell(
        name="Check the flags against llama-server --help",
        commands=[flag_check_command(b.binary, args)],
        _if=any_change,
    )
    systemd.daemon_reload(name="Reload systemd units (llama-server)", _if=unit.did_change)
    systemd.service(name="llama-server enabled", service=LLAMA_UNIT, enabled=True)
    running = (
        host.get_fact(CommandOutput, command=f"systemctl is-active {LLAMA_UNIT}").strip()
        == "active"
    )
    systemd.service(
        name="(Re)start llama-server (not running, or binary, model or flags changed)",
        service=LLAMA_UNIT,
        restarted=True,
        _if=lambda: (not running) or any_change(),
    )
    wait_for_health(
        name="Wait for the API's /health",
        port=config.api_port,
        unit=LLAMA_UNIT,
        timeout=config.health_timeout,
        _if=lambda: (not running) or any_change(),
    )


@deploy("Backend")
def backend() -> None:
    config = current_config()
    if config.backend == "none":
        stop_other(LLAMA_UNIT)
        stop_other(VLLM_UNIT)
        return
    model_change = model_stage()
    if config.backend == "llamacpp":
        stop_other(VLLM_UNIT)
        llamacpp(config, model_change)
    else:
        stop_other(LLAMA_UNIT)
        from gpubox.stages.vllm import vllm

        vllm(config, model_change)
