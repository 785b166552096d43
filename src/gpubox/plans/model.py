"""The model's plan: where the model stage (gpubox.stages.model) puts the model's file, where
from, how it is verified, and the commands that read its state on the box."""

from __future__ import annotations

import shlex

from gpubox.config import HostConfig
from gpubox.plans import model_pin, model_script
from gpubox.plans.model_script import STAT_FORMAT, ModelPlan


def plan(config: HostConfig) -> ModelPlan:
    model = config.catalog["models"][config.model]
    source = config.model_source
    repo = config.model_repo or (
        model["modelscope_repo"] if source == "modelscope" else model["hf_repo"]
    )
    name = config.model_file or model["file"]
    catalog_file = name == model["file"]
    sha256 = config.model_sha256 or (model["sha256"] if catalog_file else None)
    # The catalog's revision belongs to its own file in its own repository (the sha256 was
    # taken at that commit); model_revision names one for any.
    catalog_revision = model.get("modelscope_revision" if source == "modelscope" else "revision")
    revision = config.model_revision or (
        catalog_revision if catalog_file and not config.model_repo else None
    )
    return ModelPlan(
        source=source,
        repo=repo,
        file=name,
        url=config.model_url,
        sha256=sha256 or None,
        size=(model.get("size") or None) if catalog_file else None,
        directory=config.model_dir,
        revision=(revision or None) if source != "url" else None,
    )


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


def remote_size_command(p: ModelPlan, hf_endpoint: str) -> str | None:
    """The size query: a shell command that prints the response headers of
    ``HEAD .../resolve/REVISION/FILE`` for hf (main unpinned; the first response: the Hub
    answers an LFS file with a redirect that carries ``X-Linked-Size``, and
    ``X-Repo-Commit`` and ``X-Linked-Etag``, which gpubox.plans.model_pin reads), or of the
    URL after its redirects (``model_pin.announced_size`` reads the size). None for modelscope
    (no such call)."""
    if p.source == "hf":
        request = model_pin.Request("HEAD", model_script.hf_resolve_url(p, hf_endpoint))
    elif p.source == "url" and p.url:
        request = model_pin.Request("HEAD", p.url, follow=True)
    else:
        return None
    return model_pin.request_command(request)


def model_state_command(p: ModelPlan) -> str:
    """The marker's first line (what was verified), the commit its second records (when one
    was pinned), and the file's size and mtime now."""
    q = shlex.quote
    return (
        f'echo "marker=$(head -n 1 {q(p.marker)} 2>/dev/null)"; '
        f"echo \"commit=$(sed -n 's/^commit=//p' {q(p.marker)} 2>/dev/null)\"; "
        f'echo "file=$(stat -c {q(STAT_FORMAT)} {q(p.path)} 2>/dev/null)"'
    )
