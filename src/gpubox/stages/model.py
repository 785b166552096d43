"""Stage: the model file, downloaded on the box into model_dir (Hugging Face or a mirror,
ModelScope, or a plain HTTPS URL), resumable, verified (sha256 where known, size otherwise)
and skipped when it is already there and verified."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server

from gpubox import preflight
from gpubox.config import HostConfig
from gpubox.facts import CommandOutput
from gpubox.stages import as_file, current_config

HF_VENV = "/opt/gpubox/hf-venv"
MS_VENV = "/opt/gpubox/modelscope-venv"
TOKEN_FILE = "/root/.cache/gpubox/hf-token"


@dataclass(frozen=True)
class ModelPlan:
    source: str
    repo: str
    file: str
    url: str | None
    sha256: str | None
    size: int | None
    directory: str

    @property
    def path(self) -> str:
        return f"{self.directory}/{self.file}"

    @property
    def stamp(self) -> str:
        """What a verified download records next to the file."""
        return f"sha256={self.sha256}" if self.sha256 else f"size={self.size}"


def plan(config: HostConfig) -> ModelPlan:
    model = config.catalog["models"][config.model]
    source = config.model_source
    repo = model["modelscope_repo"] if source == "modelscope" else model["hf_repo"]
    name = config.model_file or model["file"]
    sha256 = config.model_sha256 or (model["sha256"] if name == model["file"] else None)
    return ModelPlan(
        source=source,
        repo=repo,
        file=name,
        url=config.model_url,
        sha256=sha256 or None,
        size=model.get("size") or None,
        directory=config.model_dir,
    )


def verify_command(p: ModelPlan, path: str) -> str:
    q = shlex.quote
    if p.sha256:
        return (
            f'got=$(sha256sum {q(path)} | cut -d" " -f1); if [ "$got" != {q(p.sha256)} ]; then '
            f'echo "gpubox: {p.file} has sha256 $got, expected {p.sha256}" >&2; exit 1; fi'
        )
    if p.size:
        return (
            f'got=$(stat -c %s {q(path)}); if [ "$got" != {p.size} ]; then '
            f'echo "gpubox: {p.file} has $got bytes, expected {p.size}" >&2; exit 1; fi'
        )
    return "true"


def download_commands(p: ModelPlan, hf_endpoint: str, ms_endpoint: str) -> list[str]:
    q = shlex.quote
    d = q(p.directory)
    done = [verify_command(p, p.path), f"echo {q(p.stamp)} > {q(p.path)}.gpubox-verified"]
    if p.source == "url":
        assert p.url
        part = q(p.path + ".part")
        return [
            f"mkdir -p {d}",
            # -C -: resume a partial download after an interruption
            f"curl -fL --retry 10 --retry-delay 5 -C - -o {part} {q(p.url)}",
            verify_command(p, p.path + ".part"),
            f"mv {part} {q(p.path)}",
            *done,
        ]
    if p.source == "hf":
        token = f"$( [ -s {TOKEN_FILE} ] && cat {TOKEN_FILE} )"
        return [
            f"mkdir -p {d}",
            # hf download resumes by itself and keeps a cache under the directory
            f"HF_ENDPOINT={q(hf_endpoint)} HF_TOKEN={token} {HF_VENV}/bin/hf download "
            f"{q(p.repo)} {q(p.file)} --local-dir {d}",
            f"rm -f {TOKEN_FILE}",
            *done,
        ]
    return [
        f"mkdir -p {d}",
        f"MODELSCOPE_DOMAIN={q(ms_endpoint)} {MS_VENV}/bin/modelscope download --model "
        f"{q(p.repo)} {q(p.file)} --local_dir {d}",
        *done,
    ]


@deploy("Model")
def model():
    """The model on the box; returns the download operation (None when nothing to do)."""
    config = current_config()
    preflight.run(config)
    if config.backend == "none":
        return None
    if config.backend == "vllm":
        repo = config.catalog["models"][config.model]["vllm_repo"]
        logger.info(f"{host.name}: vLLM downloads {repo} into its cache at its first start")
        return None
    p = plan(config)
    q = shlex.quote
    stamp = host.get_fact(CommandOutput, command=f"cat {q(p.path)}.gpubox-verified").strip()
    present = host.get_fact(CommandOutput, command=f"test -f {q(p.path)} && echo yes").strip()
    if stamp == p.stamp and present == "yes":
        return None
    # The file's size when the catalog knows it, else the model's weights as an estimate.
    model_entry = config.catalog["models"][config.model]
    need = p.size or (model_entry["weights_gib"] * 2**30 if p.file == model_entry["file"] else 0)
    if need:
        free = host.get_fact(
            CommandOutput,
            command=f'd={q(p.directory)}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done; '
            'df -B1 --output=avail "$d" | tail -n 1',
        ).strip()
        if free.isdigit() and int(free) < need:
            from gpubox.stages import DeployRefused

            raise DeployRefused(
                f"{host.name}: model_dir {p.directory} has {int(free) / 2**30:.1f} GiB free; "
                f"{p.file} needs {need / 2**30:.1f} GiB; nothing was changed"
            )
    catalog = config.catalog
    if p.source in ("hf", "modelscope"):
        venv, requirement = (
            (HF_VENV, catalog["hf"]["hub_requirement"])
            if p.source == "hf"
            else (MS_VENV, catalog["modelscope"]["requirement"])
        )
        apt.packages(name="python3-venv for the download tool", packages=["python3-venv"])
        server.shell(
            name=f"Download tool in {venv}",
            commands=[
                f"test -x {venv}/bin/python || python3 -m venv {venv}",
                f"{venv}/bin/pip install -q {q(requirement)}",
            ],
        )
    token = os.environ.get("HF_TOKEN")
    if p.source == "hf" and token:
        # From the operator's environment to a root-only file, never onto a command line.
        files.put(
            name="HF_TOKEN for this download (removed afterwards)",
            src=as_file(token + "\n"),
            dest=TOKEN_FILE,
            mode="0600",
        )
    logger.info(f"{host.name}: downloading {p.file} into {p.directory}; large models take long")
    return server.shell(
        name=f"Download and verify {p.file} ({p.source})",
        commands=download_commands(
            p, config.hf_endpoint or catalog["hf"]["endpoint"], catalog["modelscope"]["endpoint"]
        ),
    )
