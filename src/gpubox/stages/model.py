"""Stage: the model file, downloaded on the box into model_dir (Hugging Face or a mirror,
ModelScope, or a plain HTTPS URL), resumable, verified (sha256 where known, size otherwise)
and skipped when it is already there and verified.

What was verified is recorded next to the file (``<file>.gpubox-verified``) with the file's
size and mtime then; when they differ now (the file truncated, rewritten or gone), the file
is verified again, and downloaded again when it does not verify. The Hugging Face token file
is removed however the download command ends."""

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
# What the marker records of the file it verified (GNU stat): a truncated or rewritten file
# no longer matches it, so the next deploy verifies it again.
STAT_FORMAT = "size=%s mtime=%Y"


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
        """What a verified download records next to the file (then the file's STAT_FORMAT)."""
        return f"sha256={self.sha256}" if self.sha256 else f"size={self.size}"

    @property
    def marker(self) -> str:
        return f"{self.path}.gpubox-verified"


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


def matches_command(p: ModelPlan, path: str) -> str:
    """A shell condition: true when ``path`` is the file the plan names (sha256 where known,
    size otherwise; any regular file when neither is known)."""
    q = shlex.quote
    if p.sha256:
        return f'[ "$(sha256sum {q(path)} 2>/dev/null | cut -d" " -f1)" = {q(p.sha256)} ]'
    if p.size:
        return f'[ "$(stat -c %s {q(path)} 2>/dev/null)" = {p.size} ]'
    return f"[ -f {q(path)} ]"


def verify_command(p: ModelPlan, path: str, remove: bool = False) -> str:
    """Exit 1 naming what is wrong unless ``path`` verifies; with ``remove``, a file that does
    not verify is removed (a bad partial download must not be resumed forever)."""
    q = shlex.quote
    gone = f"rm -f {q(path)}; " if remove else ""
    note = "; removed it" if remove else ""
    if p.sha256:
        return (
            f'got=$(sha256sum {q(path)} | cut -d" " -f1); if [ "$got" != {q(p.sha256)} ]; then '
            f'{gone}echo "gpubox: {p.file} has sha256 $got, expected {p.sha256}{note}" >&2; '
            "exit 1; fi"
        )
    if p.size:
        return (
            f'got=$(stat -c %s {q(path)}); if [ "$got" != {p.size} ]; then '
            f'{gone}echo "gpubox: {p.file} has $got bytes, expected {p.size}{note}" >&2; '
            "exit 1; fi"
        )
    return "true"


def download_commands(
    p: ModelPlan,
    hf_endpoint: str,
    ms_endpoint: str,
    token_file: str = TOKEN_FILE,
    hf_venv: str = HF_VENV,
    ms_venv: str = MS_VENV,
) -> list[str]:
    """mkdir; then, in one command: the marker removed, the file kept when it verifies,
    else removed and downloaded (resuming where the tool can) and verified; then the marker
    written with the file's size and mtime. Each command stops at its first failure."""
    q = shlex.quote
    d = q(p.directory)
    path = q(p.path)
    before = ""
    if p.source == "url":
        assert p.url
        part = q(p.path + ".part")
        # -C -: resume a partial download after an interruption
        fetch = (
            f"curl -fL --retry 10 --retry-delay 5 -C - -o {part} {q(p.url)}; "
            + verify_command(p, p.path + ".part", remove=True)
            + f"; mv {part} {path}"
        )
    elif p.source == "hf":
        # The token file is removed however this command ends: success, failure or a signal.
        before = f"trap 'rm -f {q(token_file)}' EXIT; trap 'exit 1' HUP INT TERM; "
        token = f"$( [ -s {q(token_file)} ] && cat {q(token_file)} )"
        # hf download resumes by itself and keeps a cache under the directory
        fetch = (
            f"HF_ENDPOINT={q(hf_endpoint)} HF_TOKEN={token} {hf_venv}/bin/hf download "
            f"{q(p.repo)} {q(p.file)} --local-dir {d}; " + verify_command(p, p.path)
        )
    else:
        fetch = (
            f"MODELSCOPE_DOMAIN={q(ms_endpoint)} {ms_venv}/bin/modelscope download --model "
            f"{q(p.repo)} {q(p.file)} --local_dir {d}; " + verify_command(p, p.path)
        )
    return [
        f"mkdir -p {d}",
        before
        + f"set -e; rm -f {q(p.marker)}; "
        + f"if [ -f {path} ] && {matches_command(p, p.path)}; then "
        f'echo "gpubox: {p.file} is there and verifies; kept"; '
        f"else rm -f {path}; {fetch}; fi",
        f"printf '%s %s\\n' {q(p.stamp)} \"$(stat -c {q(STAT_FORMAT)} {path})\" > {q(p.marker)}",
    ]


def verified(p: ModelPlan, state: str) -> bool:
    """Whether the fact `model_state_command` answered says the file is the one verified."""
    values = {k: v for k, _, v in (line.partition("=") for line in state.splitlines())}
    current = values.get("file", "")
    return bool(current) and values.get("marker") == f"{p.stamp} {current}"


def present_size(state: str) -> int:
    """The size of the file now, from the answer to `model_state_command` (0 when absent)."""
    for line in state.splitlines():
        if line.startswith("file=size="):
            size = line[len("file=size=") :].split()[0]
            return int(size) if size.isdigit() else 0
    return 0


def model_state_command(p: ModelPlan) -> str:
    q = shlex.quote
    return (
        f'echo "marker=$(cat {q(p.marker)} 2>/dev/null)"; '
        f'echo "file=$(stat -c {q(STAT_FORMAT)} {q(p.path)} 2>/dev/null)"'
    )


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
    state = host.get_fact(CommandOutput, command=model_state_command(p))
    if verified(p, state):
        if p.source == "hf":
            # left by a download cut short before it could remove it
            files.file(name="No HF_TOKEN file left on the box", path=TOKEN_FILE, present=False)
        return None
    # The file's size when the catalog knows it, else the model's weights as an estimate, less
    # what is there already (a file to verify again may need no download at all).
    model_entry = config.catalog["models"][config.model]
    need = p.size or (model_entry["weights_gib"] * 2**30 if p.file == model_entry["file"] else 0)
    need = max(0, need - present_size(state))
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
