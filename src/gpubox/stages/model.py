"""Stage: the model file, downloaded on the box into model_dir (Hugging Face or a mirror,
ModelScope, or a plain HTTPS URL), resumable, verified (sha256 where known, size otherwise)
and skipped when it is already there and verified.

What was verified is recorded next to the file (``<file>.gpubox-verified``) with the file's
size and mtime then; when they differ now (the file truncated, rewritten or gone), the file
is verified again, and downloaded again when it does not verify. The Hugging Face token file
is removed however the download command ends.

The hf and modelscope tools download into a staging directory beside the file
(``<model_dir>/<file>.incomplete/``); the file moves into model_dir only once it verifies, so
the backend never sees a file that does not. A file that does not verify is refused with both
sha256s, and the staging directory (the tool's own cache of the download, its metadata
included) is removed with it. The tools are installed with pip from catalog
``pypi.index_url`` (a PyPI mirror is an override of it). The download runs as a long step:
a progress line (bytes, rate, ETA when the size is known) at least every 15 s.

With the vLLM backend the model is a whole Hugging Face repository (the catalog's
``vllm_repo``): `vllm_checkpoint` downloads it with the same hf tool, as a long step too, into
``<model_dir>/<org>--<name>/`` before vLLM starts (gpubox.stages.checkpoint)."""

from __future__ import annotations

import os
import shlex
import urllib.parse
from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server

from gpubox import layout, preflight, progress
from gpubox.config import HostConfig
from gpubox.facts import CommandOutput
from gpubox.stages import as_file, checkpoint, current_config

# The paths under the names the tests use.
HF_VENV = layout.HF_VENV
TOKEN_FILE = layout.HF_TOKEN_FILE
# huggingface_hub's own progress bars stay off (the long step reports progress), and so do the
# CLI's update check and telemetry (calls to pypi.org and the Hub that a mirror does not serve).
HF_QUIET = "HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HUB_DISABLE_TELEMETRY=1"
PROGRESS_EVERY = 10
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

    @property
    def staging(self) -> str:
        """Where hf and modelscope download (their --local-dir): beside the file, so on the
        same filesystem (the move into place is a rename), and named so that
        ``progress.download_probe(path)`` counts it with the file and curl's ``.part``."""
        return f"{self.path}.incomplete"


def plan(config: HostConfig) -> ModelPlan:
    model = config.catalog["models"][config.model]
    source = config.model_source
    repo = config.model_repo or (
        model["modelscope_repo"] if source == "modelscope" else model["hf_repo"]
    )
    name = config.model_file or model["file"]
    catalog_file = name == model["file"]
    sha256 = config.model_sha256 or (model["sha256"] if catalog_file else None)
    return ModelPlan(
        source=source,
        repo=repo,
        file=name,
        url=config.model_url,
        sha256=sha256 or None,
        size=(model.get("size") or None) if catalog_file else None,
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


def verify_command(p: ModelPlan, path: str, remove: bool = False, also: str = "") -> str:
    """Exit 1 naming what is wrong unless ``path`` verifies; with ``remove``, a file that does
    not verify is removed (a bad partial download must not be resumed forever), and ``also``
    (a directory: the download tool's staging directory) with it."""
    q = shlex.quote
    gone = f"rm -f {q(path)}; " if remove else ""
    if remove and also:
        gone += f"rm -rf {q(also)}; "
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
    token_file: str = layout.HF_TOKEN_FILE,
    hf_venv: str = layout.HF_VENV,
    ms_venv: str = layout.MODELSCOPE_VENV,
) -> list[str]:
    """mkdir; then, in one command: the marker removed, the file kept when it verifies,
    else removed and downloaded (resuming where the tool can) and verified; then the marker
    written with the file's size and mtime. Each command stops at its first failure."""
    q = shlex.quote
    d = q(p.directory)
    path = q(p.path)
    stage = q(p.staging)
    staged = q(f"{p.staging}/{p.file}")
    # hf and modelscope: a fresh staging directory; the file moves into model_dir once it
    # verifies; a file that does not is removed with the whole staging directory (hf's
    # metadata there would otherwise take the bad file for a finished download).
    into_place = (
        f"; {verify_command(p, p.staging + '/' + p.file, remove=True, also=p.staging)}"
        f'; mkdir -p "$(dirname {path})"; mv {staged} {path}; rm -rf {stage}'
    )
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
        # hf download asks HF_ENDPOINT for the file's metadata (HEAD .../resolve/main/FILE)
        # and then its bytes; a broken connection is resumed with a Range request (five times
        # in one run). It keeps its partial file and metadata under the staging directory.
        fetch = (
            f"rm -rf {stage}; mkdir -p {stage}; "
            f"HF_ENDPOINT={q(hf_endpoint)} HF_TOKEN={token} {HF_QUIET} {hf_venv}/bin/hf download "
            f"{q(p.repo)} {q(p.file)} --local-dir {stage}" + into_place
        )
    else:
        fetch = (
            f"rm -rf {stage}; mkdir -p {stage}; "
            f"MODELSCOPE_DOMAIN={q(ms_endpoint)} {ms_venv}/bin/modelscope download --model "
            f"{q(p.repo)} {q(p.file)} --local_dir {stage}" + into_place
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


# From response headers (one block per response, redirects first): the Hub's X-Linked-Size,
# else the Content-Length of a final 200.
_SIZE_AWK = (
    '/^HTTP\\// { split($0, w, " "); status = w[2]; size = "" } '
    'tolower($1) == "x-linked-size" { linked = $2 } '
    'tolower($1) == "content-length" { size = $2 } '
    'END { if (linked != "") print linked; else if (status == "200") print size }'
)


def remote_size_command(p: ModelPlan, hf_endpoint: str) -> str | None:
    """A shell command that prints the file's size as its server announces it (nothing when
    unknown): for hf, the Hub's ``X-Linked-Size`` (an LFS file, answered with a redirect) or
    the ``Content-Length`` of a 200 to ``HEAD .../resolve/main/FILE``; for a URL, the final
    response's ``Content-Length`` after redirects. None for modelscope (no such call)."""
    if p.source == "hf":
        url = f"{hf_endpoint.rstrip('/')}/{p.repo}/resolve/main/{urllib.parse.quote(p.file)}"
        flags = "-sI"
    elif p.source == "url" and p.url:
        url, flags = p.url, "-sIL"
    else:
        return None
    return (
        f"if command -v curl >/dev/null 2>&1; then curl {flags} --max-time 20 "
        f"{shlex.quote(url)} 2>/dev/null | tr -d '\\r' | awk -F': *' {shlex.quote(_SIZE_AWK)}; fi"
    )


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
        return vllm_checkpoint(config)
    p = plan(config)
    state = host.get_fact(CommandOutput, command=model_state_command(p))
    if verified(p, state):
        if p.source == "hf":
            # left by a download cut short before it could remove it
            files.file(
                name="No HF_TOKEN file left on the box", path=layout.HF_TOKEN_FILE, present=False
            )
        return None
    catalog = config.catalog
    hf_endpoint = config.hf_endpoint or catalog["hf"]["endpoint"]
    # The file's size: the catalog's, else what its server announces (the progress lines' total
    # and the disk check), else the model's weights as an estimate, less what is there already
    # (a file to verify again may need no download at all).
    total = p.size
    size_command = remote_size_command(p, hf_endpoint) if not total else None
    if size_command:
        announced = host.get_fact(CommandOutput, command=size_command).strip()
        total = int(announced) if announced.isdigit() and int(announced) > 0 else None
    model_entry = catalog["models"][config.model]
    need = total or (model_entry["weights_gib"] * 2**30 if p.file == model_entry["file"] else 0)
    refuse_without_space(p.directory, need - present_size(state), p.file)
    if p.source in ("hf", "modelscope"):
        download_tool(config, p.source)
    if p.source == "hf":
        put_token()
    logger.info(f"{host.name}: downloading {p.file} into {p.directory}; large models take long")
    return progress.long_step(
        name=f"Download and verify {p.file} ({p.source})",
        command=step_command(download_commands(p, hf_endpoint, catalog["modelscope"]["endpoint"])),
        # the file, curl's <file>.part, and the staging directory <file>.incomplete/ with
        # hf's partial download (.cache/huggingface/download/*.incomplete) in it
        probe=progress.download_probe(p.path, total),
        every=PROGRESS_EVERY,
    )


def step_command(commands: list[str]) -> str:
    """``download_commands`` as one script that stops at the first failure, as pyinfra runs a
    list of commands. Each runs in a subshell of its own (its traps and ``set -e`` stay its
    own) as a plain statement of a ``set -e`` script, so ``set -e`` holds inside it too."""
    return "set -e\n" + "".join(f"(\n{command}\n)\n" for command in commands)


def refuse_without_space(directory: str, need: int, what: str) -> None:
    """Refuse the deploy (before anything changed) when the filesystem of ``directory`` (or
    of its nearest existing parent) has less than ``need`` bytes free."""
    if need <= 0:
        return
    free = host.get_fact(
        CommandOutput,
        command=f'd={shlex.quote(directory)}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done; '
        'df -B1 --output=avail "$d" | tail -n 1',
    ).strip()
    if free.isdigit() and int(free) < need:
        from gpubox.stages import DeployRefused

        raise DeployRefused(
            f"{host.name}: model_dir {directory} has {int(free) / 2**30:.1f} GiB free; "
            f"{what} needs {need / 2**30:.1f} GiB; nothing was changed"
        )


def download_tool(config: HostConfig, source: str) -> None:
    """hf (huggingface_hub) or modelscope in a venv of its own, from catalog pypi.index_url."""
    catalog = config.catalog
    q = shlex.quote
    venv, requirement = (
        (layout.HF_VENV, catalog["hf"]["hub_requirement"])
        if source == "hf"
        else (layout.MODELSCOPE_VENV, catalog["modelscope"]["requirement"])
    )
    apt.packages(name="python3-venv for the download tool", packages=["python3-venv"])
    server.shell(
        name=f"Download tool in {venv}",
        commands=[
            f"test -x {venv}/bin/python || python3 -m venv {venv}",
            f"{venv}/bin/pip install -q --disable-pip-version-check "
            f"--index-url {q(catalog['pypi']['index_url'])} {q(requirement)}",
        ],
    )


def put_token() -> None:
    """HF_TOKEN, when the operator's environment has one, to a root-only file (never onto a
    command line); the download command removes it however it ends."""
    token = os.environ.get("HF_TOKEN")
    if token:
        files.put(
            name="HF_TOKEN for this download (removed afterwards)",
            src=as_file(token + "\n"),
            dest=layout.HF_TOKEN_FILE,
            mode="0600",
        )


def vllm_checkpoint(config: HostConfig):
    """The vLLM backend's checkpoint (gpubox.stages.checkpoint): the whole repository
    downloaded into <model_dir>/<org>--<name>/ as a long step, before vLLM starts; nothing
    when its marker says every file is there. Returns the download operation or None."""
    c = checkpoint.plan(config)
    state = checkpoint.parse_state(
        host.get_fact(CommandOutput, command=checkpoint.state_command(c))
    )
    if state.complete:
        files.file(
            name="No HF_TOKEN file left on the box", path=layout.HF_TOKEN_FILE, present=False
        )
        return None
    hf_endpoint = config.hf_endpoint or config.catalog["hf"]["endpoint"]
    listing = checkpoint.parse_listing(
        host.get_fact(CommandOutput, command=checkpoint.listing_command(c.repo, hf_endpoint))
    )
    # The repository's size as the Hub gives it (the progress lines' total and the disk
    # check), else the catalog's estimate of the weights; less what is there already.
    total = listing.total if listing else None
    weights = config.catalog["models"][config.model].get("vllm_weights_gib") or 0
    need = total or int(float(weights) * 2**30)
    refuse_without_space(c.directory, need - state.present, c.repo)
    download_tool(config, "hf")
    put_token()
    missing = f"; {len(state.bad)} file(s) missing or resized" if state.bad else ""
    logger.info(f"{host.name}: downloading {c.repo} into {c.directory}{missing}")
    commands = checkpoint.download_commands(
        c, listing, state.bad, hf_endpoint, layout.HF_TOKEN_FILE, layout.HF_VENV, HF_QUIET
    )
    return progress.long_step(
        name=f"Download the vLLM checkpoint {c.repo}",
        command=step_command(commands),
        # everything under the directory: the files, and hf's partial downloads under .cache/
        probe=progress.download_probe(c.directory, total),
        every=PROGRESS_EVERY,
    )
