"""The model's plan: where the model stage (gpubox.stages.model) puts the model's file, where
from, how it is verified, and the commands that read its state on the box."""

from __future__ import annotations

import shlex

from gpubox.config import HostConfig
from gpubox.plans import model_script
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
    the ``Content-Length`` of a 200 to ``HEAD .../resolve/REVISION/FILE`` (main unpinned);
    for a URL, the final response's ``Content-Length`` after redirects. None for modelscope
    (no such call)."""
    if p.source == "hf":
        url = model_script.hf_resolve_url(p, hf_endpoint)
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
