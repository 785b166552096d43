"""Stage: the model file, downloaded on the box into model_dir (Hugging Face or a mirror,
ModelScope, or a plain HTTPS URL) in the background, resumed, verified (sha256 where known,
size otherwise) and skipped when it is already there and verified (docs/models.md).

The download is a systemd unit (gpubox-model-download, running a script this stage writes:
gpubox.plans.model_script), started by the early stage `model_download` before the driver,
and enabled until the file verifies, so that it goes on after the driver's reboot. The backend
stage's `model` waits for it as a long step (bytes, rate, ETA) where the server needs the file,
and fails with the unit's last journal lines when it failed. A re-run with a verified file
starts nothing. Nothing is removed before a transfer: hf resumes its partial file under the
staging directory, curl its ``.part`` (-C -); a stall watchdog restarts a transfer that gets
no bytes for ``download_stall_s`` (hf with Xet off after two stalls); MemoryMax caps it.

hf downloads name the catalog's commit (``revision``, or model_revision), else the commit the
deploy finds for the sha256 on the box (gpubox.plans.model_pin: the size query's headers, else
the file's history), refused before any transfer when no commit has it; modelscope names its
own revision where the catalog has one. Unpinned and unfound (a mirror without the Hub's
API), hf asks for main and the deploy warns.

What was verified is recorded next to the file (``<file>.gpubox-verified``) with the file's
size and mtime then; when they differ now (the file truncated, rewritten or gone), the file
is verified again, and downloaded again when it does not verify. The Hugging Face token
reaches the unit as a credential from a root-only file, removed when the download ends.

The hf and modelscope tools download into a staging directory beside the file
(``<model_dir>/<file>.incomplete/``); the file moves into model_dir only once it verifies, so
the backend never sees a file that does not. A file that does not verify is refused with both
sha256s, and the staging directory (the tool's own cache of the download, its metadata
included) is removed with it. The tools are installed with pip from catalog
``pypi.index_url`` (a PyPI mirror is an override of it).

With the vLLM backend the model is a whole Hugging Face repository (the catalog's
``vllm_repo``), downloaded with hf by the same unit (``begin_checkpoint``, from the early
stage) into ``<model_dir>/<org>--<name>/``; `vllm_checkpoint` waits for it before vLLM
starts (gpubox.plans.checkpoint)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, replace

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from gpubox.base import layout
from gpubox.base.errors import DeployRefused
from gpubox.base.rendering import as_file
from gpubox.config import HostConfig
from gpubox.infra import progress
from gpubox.infra.host_facts import CommandOutput, NetworkOutput
from gpubox.infra.operations import ManagedFiles
from gpubox.knowledge import modelscope
from gpubox.ops import units
from gpubox.plans import checkpoint, model_pin, model_script
from gpubox.plans.model import (
    model_state_command,
    plan,
    present_size,
    remote_size_command,
    verified,
)
from gpubox.preflight import gate as preflight
from gpubox.stages import current_config

# The download's shell (gpubox.plans.model_script), under the names the stage's users know.
HF_QUIET = model_script.HF_QUIET
STAT_FORMAT = model_script.STAT_FORMAT
ModelPlan = model_script.ModelPlan
matches_command = model_script.matches_command
verify_command = model_script.verify_command
UNIT = model_script.UNIT
UNIT_FILE = model_script.UNIT_FILE
SCRIPT = model_script.SCRIPT
download_commands = model_script.download_commands
marker_matches_command = model_script.marker_matches_command
download_script = model_script.download_script
unit_text = model_script.unit_text
wait_command = model_script.wait_command
step_command = model_script.step_command

# The paths under the names the tests use.
HF_VENV = layout.HF_VENV
TOKEN_FILE = layout.HF_TOKEN_FILE
PROGRESS_EVERY = 10


@dataclass
class _Begun:
    """What the first stage of a run that plans the download found (per host)."""

    total: int | None
    verified: bool


# Per pyinfra state and host: the download planned already in this run (the early stage
# model_download, then the backend's model stage, which only waits for it).
_begun: dict[object, dict[str, _Begun]] = {}


def begin_download(config: HostConfig, p: ModelPlan) -> _Begun:
    """Plan the background download of ``p`` once per run: nothing when the marker says the
    file verified as it is (no unit started, no operation but the token file's removal); else
    the disk check, the tool, the token, the script and unit written, the unit enabled and
    started (restarted when its script or unit changed: the partial download is kept)."""
    done = _begun.setdefault(host.state, {})
    if host.name in done:
        return done[host.name]
    state = host.get_fact(CommandOutput, command=model_state_command(p))
    if verified(p, state):
        if p.source == "hf":
            # left by a download cut short before it could remove it
            files.file(
                name="No HF_TOKEN file left on the box", path=layout.HF_TOKEN_FILE, present=False
            )
        done[host.name] = _Begun(None, True)
        return done[host.name]
    catalog = config.catalog
    hf_endpoint = config.hf_endpoint or catalog["hf"]["endpoint"]
    # The file's size: the catalog's, else what its server announces (the progress lines' total
    # and the disk check), else the model's weights as an estimate, less what is there already
    # (a file to verify again may need no download at all). For hf with a sha256 the same
    # query answers which commit has the file (gpubox.plans.model_pin).
    total = p.size
    pin = p.source == "hf" and bool(p.sha256)
    size_command = remote_size_command(p, hf_endpoint) if not total or pin else None
    head = model_pin.Answer()
    if size_command:
        head = model_pin.parse_response(host.get_fact(NetworkOutput, command=size_command))
        total = total or model_pin.announced_size(head)
    if pin:
        p = pin_commit(p, hf_endpoint, head)
    model_entry = catalog["models"][config.model]
    need = total or (model_entry["weights_gib"] * 2**30 if p.file == model_entry["file"] else 0)
    refuse_without_space(p.directory, need - present_size(state), p.file)
    # hf with a sha256: pin_commit pinned it, or said why not
    if p.source in ("hf", "modelscope") and not p.revision and not pin:
        logger.warning(
            f"{host.name}: {p.file} is not pinned to a revision (no commit is recorded for "
            f"its sha256): downloading {'main' if p.source == 'hf' else 'the default revision'}; "
            "the sha256 still refuses other bytes (model_revision pins one)"
        )
    if p.source == "modelscope":
        try:
            modelscope.domain(catalog["modelscope"]["endpoint"])
        except ValueError as exc:
            raise DeployRefused(f"{host.name}: catalog {exc}; nothing was changed") from exc
        download_tool(config, p.source)
    else:
        # hf and url: curl (a minimal Debian has none); apt's lists may be missing this early
        apt.packages(name="curl for the download", packages=["curl"], update=True, cache_time=3600)
    token = put_token() if p.source == "hf" else False
    script = download_script(
        p,
        hf_endpoint,
        catalog["modelscope"]["endpoint"],
        config.download_stall_s,
        token,
        ms_ca_bundle=config.modelscope_ca_bundle,
    )
    managed = ManagedFiles(
        {SCRIPT: script, UNIT_FILE: unit_text(p, config.download_memory_max, token)}
    )
    script_op = managed.put("Model download script", SCRIPT)
    unit_op = managed.put(f"Model download unit {UNIT}", UNIT_FILE)
    units.reload_units(unit_op, label="model download")
    logger.info(f"{host.name}: downloading {p.file} into {p.directory} in the background ({UNIT})")
    start_unit("the file verifies", "the partial download is kept", script_op, unit_op)
    done[host.name] = _Begun(total, False)
    return done[host.name]


def pin_commit(p: ModelPlan, hf_endpoint: str, head: model_pin.Answer) -> ModelPlan:
    """``p`` pinned to the commit whose file has its sha256, found on the box from the size
    query's answer ``head`` and, when that does not settle it, the Hub's API (each request a
    fact: gpubox.plans.model_pin). Refuses the deploy, before anything changed, when no
    commit has it; warns when the endpoint does not answer (``p`` as it was)."""

    def ask(request: model_pin.Request) -> model_pin.Answer:
        command = model_pin.request_command(request)
        return model_pin.parse_response(host.get_fact(NetworkOutput, command=command))

    found = model_pin.resolve(p, hf_endpoint, head, ask)
    if found.refusal:
        raise DeployRefused(f"{host.name}: {found.refusal}")
    if found.warn:
        logger.warning(f"{host.name}: {found.message}")
    elif found.message:
        logger.info(f"{host.name}: {found.message}")
    return replace(p, commit=found.commit) if found.commit else p


def start_unit(until: str, kept: str, script_op: object, unit_op: object) -> None:
    """Start the download unit, enabled until ``until`` (so it resumes after a reboot), and
    restart it when its script or unit changed (``kept``: what a restart keeps)."""
    start = systemd.service(
        name=f"Start {UNIT} (enabled until {until}: it resumes after a reboot)",
        service=f"{UNIT}.service",
        running=True,
        enabled=True,
    )
    units.restart_on_change(
        f"{UNIT}.service",
        f"Restart {UNIT} with its new script or unit ({kept})",
        script_op,
        unit_op,
        unless=start,
    )


@deploy("Model download")
def model_download():
    """The early stage (before the driver): the GGUF's download started in the background as
    soon as the box has disk, network and the download tool; the backend stage waits for it
    where the server needs the file; with the vLLM backend, the checkpoint's (the same unit)."""
    config = current_config()
    preflight.run(config)
    if config.backend == "llamacpp":
        begin_download(config, plan(config))
    elif config.backend == "vllm":
        begin_checkpoint(config)
    return None


@deploy("Model")
def model():
    """The model on the box; returns the operation that waited for its download (None when
    nothing was to do)."""
    config = current_config()
    preflight.run(config)
    if config.backend == "none":
        return None
    if config.backend == "vllm":
        return vllm_checkpoint(config)
    p = plan(config)
    begun = begin_download(config, p)
    if begun.verified:
        return None
    return progress.long_step(
        name=f"Download and verify {p.file} ({p.source})",
        command=wait_command(p),
        # the file, curl's <file>.part, and the staging directory <file>.incomplete/ with
        # hf's partial download (.cache/huggingface/download/*.incomplete) in it
        probe=progress.download_probe(p.path, begun.total),
        every=PROGRESS_EVERY,
    )


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
    # The download starts first in a deploy, before any stage refreshed apt's lists (a fresh
    # box may have none): refresh them when older than an hour, only when the tool is needed.
    apt.packages(
        name="python3-venv for the download tool",
        packages=["python3-venv"],
        update=True,
        cache_time=3600,
    )
    server.shell(
        name=f"Download tool in {venv}",
        commands=[
            f"test -x {venv}/bin/python || python3 -m venv {venv}",
            f"{venv}/bin/pip install -q --disable-pip-version-check "
            f"--index-url {q(catalog['pypi']['index_url'])} {q(requirement)}",
        ],
    )


def put_token() -> bool:
    """HF_TOKEN, when the operator's environment has one, to a root-only file (never onto a
    command line); the download removes it when it ends. Whether there is one."""
    token = os.environ.get("HF_TOKEN")
    if token:
        files.put(
            name="HF_TOKEN for this download (removed afterwards)",
            src=as_file(token + "\n"),
            dest=layout.HF_TOKEN_FILE,
            mode="0600",
        )
    return bool(token)


def begin_checkpoint(config: HostConfig) -> _Begun:
    """Plan the background download of the vLLM checkpoint once per run (as
    ``begin_download``): nothing when its marker says every file is there (at the pinned
    commit, when pinned to one); else the disk check, the hf tool, the token, the script and
    unit written (the same unit as the GGUF's: one model per box), enabled and started."""
    done = _begun.setdefault(host.state, {})
    if host.name in done:
        return done[host.name]
    c = checkpoint.plan(config)
    state = checkpoint.parse_state(
        host.get_fact(CommandOutput, command=checkpoint.state_command(c))
    )
    pinned = checkpoint.pinned_commit(c)
    if state.complete and (not pinned or state.commit == pinned):
        files.file(
            name="No HF_TOKEN file left on the box", path=layout.HF_TOKEN_FILE, present=False
        )
        done[host.name] = _Begun(None, True)
        return done[host.name]
    hf_endpoint = config.hf_endpoint or config.catalog["hf"]["endpoint"]
    listing = checkpoint.parse_listing(
        host.get_fact(
            NetworkOutput,
            command=checkpoint.listing_command(c.repo, hf_endpoint, c.revision or "main"),
        )
    )
    # The repository's size as the Hub gives it (the progress lines' total and the disk
    # check), else the catalog's estimate of the weights; less what is there already.
    total = listing.total if listing else None
    weights = config.catalog["models"][config.model].get("vllm_weights_gib") or 0
    need = total or int(float(weights) * 2**30)
    refuse_without_space(c.directory, need - state.present, c.repo)
    if not c.revision:
        logger.warning(
            f"{host.name}: {c.repo} is not pinned to a revision (no commit is recorded): "
            f"downloading {'main at ' + listing.commit if listing else 'main'} "
            "(vllm_revision pins one)"
        )
    download_tool(config, "hf")
    token = put_token()
    managed = ManagedFiles(
        {
            SCRIPT: checkpoint.download_script(
                c, listing, hf_endpoint, config.download_stall_s, token
            ),
            UNIT_FILE: model_script.unit_text_for(
                c.repo, c.directory, config.download_memory_max, token
            ),
        }
    )
    script_op = managed.put("Model download script", SCRIPT)
    unit_op = managed.put(f"Model download unit {UNIT}", UNIT_FILE)
    units.reload_units(unit_op, label="model download")
    missing = f"; {len(state.bad)} file(s) missing or resized" if state.bad else ""
    logger.info(
        f"{host.name}: downloading {c.repo} into {c.directory} in the background ({UNIT}){missing}"
    )
    start_unit("the checkpoint is complete", "the files downloaded are kept", script_op, unit_op)
    done[host.name] = _Begun(total, False)
    return done[host.name]


def vllm_checkpoint(config: HostConfig):
    """The vLLM backend's checkpoint (gpubox.plans.checkpoint): its download begun (when the
    early stage did not) and waited for as a long step, before vLLM starts; nothing when its
    marker says every file is there. Returns the wait operation or None."""
    begun = begin_checkpoint(config)
    if begun.verified:
        return None
    c = checkpoint.plan(config)
    return progress.long_step(
        name=f"Download the vLLM checkpoint {c.repo}",
        command=checkpoint.wait_command(c),
        # everything under the directory: the files, and hf's partial downloads under .cache/
        probe=progress.download_probe(c.directory, begun.total),
        every=PROGRESS_EVERY,
    )
