"""The vLLM backend's checkpoint: a whole Hugging Face repository (config, tokenizer,
safetensors shards; about 42 GB for the catalog's 4-bit Qwen3-Next), downloaded on the box by
the model stage before vLLM starts, so the download shows progress (bytes, rate, ETA) instead
of hiding inside vLLM's first start. vLLM then serves the local directory with the Hub off
(HF_HUB_OFFLINE=1): it never downloads at start.

Where: ``<model_dir>/<org>--<name>/`` (``/models/<org>--<name>`` in the container, which
mounts model_dir on /models). ``hf download REPO --local-dir DIR`` keeps its bookkeeping under
``DIR/.cache/huggingface/`` (a metadata file per file, the partial downloads, the tree
listing); run again, it skips the files it has and fetches only what is missing.

What gpubox knows of the repository it asks the Hub at plan time, on the box
(``GET /api/models/REPO/revision/main?blobs=true``: the commit ``main`` points at and every
file's size). The download then asks for that commit (``--revision``), so the file list, the
total of the progress lines and the bytes agree; unknown (no answer), it downloads ``main``.

Complete is recorded beside the directory (``<org>--<name>.gpubox-complete``), written only
once every file has the size the Hub gave: the repository, the commit, then one line per file
(``file SIZE NAME``). A deploy skips the download when every file named there has that size;
a missing or resized file is removed and the download runs again (it fetches only that).
Pure functions here; the operations are in gpubox.stages.model."""

from __future__ import annotations

import json
import re
import shlex
import urllib.parse
from dataclasses import dataclass

from gpubox.config import HostConfig

MARKER_SUFFIX = ".gpubox-complete"
CONTAINER_MODELS = "/models"  # where the vLLM container mounts model_dir
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Checkpoint:
    repo: str
    model_dir: str

    @property
    def name(self) -> str:
        """``org--name``: the directory's name (as the Hub's own cache names a repository)."""
        return self.repo.replace("/", "--")

    @property
    def directory(self) -> str:
        return f"{self.model_dir.rstrip('/')}/{self.name}"

    @property
    def marker(self) -> str:
        return self.directory + MARKER_SUFFIX

    @property
    def container_path(self) -> str:
        """The directory as the vLLM container sees it (vLLM's model argument)."""
        return f"{CONTAINER_MODELS}/{self.name}"


def plan(config: HostConfig) -> Checkpoint:
    repo = config.catalog["models"][config.model]["vllm_repo"]
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise ValueError(f"vllm_repo {repo!r} is not a Hugging Face repository (owner/name)")
    return Checkpoint(repo=repo, model_dir=config.model_dir)


def safe_name(name: str) -> bool:
    """Whether a file name of the repository may become a path under its directory (and a
    line of the marker): relative, no ``..`` part, no newline."""
    return (
        bool(name)
        and "\n" not in name
        and "\r" not in name
        and not name.startswith("/")
        and ".." not in name.split("/")
    )


# --- What the Hub says of the repository ---------------------------------------------------


@dataclass(frozen=True)
class Listing:
    """The repository at one commit: each file's size (bytes)."""

    commit: str
    files: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.files.values())


def listing_command(repo: str, hf_endpoint: str, revision: str = "main") -> str:
    """A shell command that prints the Hub's model info of ``repo`` at ``revision`` with the
    files' sizes (``?blobs=true``); nothing when the Hub does not answer or curl is absent."""
    url = (
        f"{hf_endpoint.rstrip('/')}/api/models/{repo}/revision/"
        f"{urllib.parse.quote(revision, safe='')}?blobs=true"
    )
    return (
        f"if command -v curl >/dev/null 2>&1; then curl -fsS --max-time 20 {shlex.quote(url)}; fi"
    )


def parse_listing(text: str) -> Listing | None:
    """The Hub's answer to `listing_command` as a Listing; None unless it names a commit and
    the size of every file (and every name is `safe_name`)."""
    try:
        info = json.loads(text)
    except ValueError:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("sha"), str):
        return None
    commit = info["sha"]
    siblings = info.get("siblings")
    if not _COMMIT.fullmatch(commit) or not isinstance(siblings, list) or not siblings:
        return None
    files: dict[str, int] = {}
    for sibling in siblings:
        if not isinstance(sibling, dict):
            return None
        name, size = sibling.get("rfilename"), sibling.get("size")
        lfs = sibling.get("lfs")
        if not isinstance(size, int) and isinstance(lfs, dict):
            size = lfs.get("size")
        if not isinstance(name, str) or not safe_name(name):
            return None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return None
        files[name] = size
    return Listing(commit, files)


# --- What is on the box --------------------------------------------------------------------


def _check_files(marker: str, directory: str, on_bad: str) -> str:
    """Shell: for each ``file SIZE NAME`` line of ``marker``, run ``on_bad`` (with $name,
    $size and $got set) when DIRECTORY/NAME does not have SIZE bytes; counts the lines in $n."""
    q = shlex.quote
    return (
        "n=0; while IFS= read -r line; do case $line in 'file '*) "
        "rest=${line#file }; size=${rest%% *}; name=${rest#* }; n=$((n + 1)); "
        f'got=$(stat -c %s -- {q(directory)}/"$name" 2>/dev/null) || got=; '
        f'[ "$got" = "$size" ] || {{ {on_bad}; }};; esac; done < {q(marker)}'
    )


def state_command(c: Checkpoint) -> str:
    """The fact: ``marker=yes``, its commit, ``files=N`` and ``bad=NAME`` for each file that is
    missing or resized (only when the marker is there), then ``present=BYTES`` (all under the
    directory, partial downloads included)."""
    q = shlex.quote
    return (
        f"if [ -r {q(c.marker)} ]; then echo marker=yes; "
        f"sed -n 's/^commit /commit=/p' {q(c.marker)}; "
        + _check_files(c.marker, c.directory, 'echo "bad=$name"')
        + '; echo "files=$n"; fi; '
        f'echo "present=$(du -sb {q(c.directory)} 2>/dev/null | cut -f1)"'
    )


@dataclass(frozen=True)
class State:
    marker: bool
    commit: str
    files: int
    bad: tuple[str, ...]
    present: int

    @property
    def complete(self) -> bool:
        return self.marker and self.files > 0 and not self.bad


def parse_state(text: str) -> State:
    values: dict[str, str] = {}
    bad: list[str] = []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "bad":
            if safe_name(value):
                bad.append(value)
        else:
            values.setdefault(key, value)
    files = values.get("files", "")
    present = values.get("present", "")
    return State(
        marker=values.get("marker") == "yes",
        commit=values.get("commit", ""),
        files=int(files) if files.isdigit() else 0,
        bad=tuple(bad),
        present=int(present) if present.isdigit() else 0,
    )


# --- The download --------------------------------------------------------------------------


def marker_lines(c: Checkpoint, listing: Listing) -> list[str]:
    return [f"repo {c.repo}", f"commit {listing.commit}"] + [
        f"file {size} {name}" for name, size in sorted(listing.files.items())
    ]


def download_commands(
    c: Checkpoint,
    listing: Listing | None,
    bad: tuple[str, ...] | list[str],
    hf_endpoint: str,
    token_file: str,
    hf_venv: str,
    quiet: str,
) -> list[str]:
    """mkdir; the marker removed, the ``bad`` files (missing or resized) removed, and ``hf
    download`` of the repository (at the listing's commit) into the directory, the token file
    removed however it ends; then the new marker written aside, each of its files checked for
    its size, and moved into place. Each command stops at its first failure."""
    q = shlex.quote
    d = q(c.directory)
    token = f"$( [ -s {q(token_file)} ] && cat {q(token_file)} )"
    revision = f" --revision {listing.commit}" if listing else ""
    removed = "".join(f"rm -f -- {q(c.directory + '/' + name)}; " for name in bad)
    fetch = (
        f"trap 'rm -f {q(token_file)}' EXIT; trap 'exit 1' HUP INT TERM; "
        f"set -e; rm -f {q(c.marker)}; {removed}"
        f"HF_ENDPOINT={q(hf_endpoint)} HF_TOKEN={token} {quiet} {hf_venv}/bin/hf download "
        f"{q(c.repo)}{revision} --local-dir {d}"
    )
    new = c.marker + ".new"
    if listing:
        write = "printf '%s\\n' " + " ".join(q(line) for line in marker_lines(c, listing))
    else:
        # No listing: the files hf left (its .cache/ aside) and the commit of its metadata.
        meta = q(c.directory + "/.cache/huggingface/download")
        write = (
            f"m=$(find {meta} -name '*.metadata' -type f 2>/dev/null | head -n 1); "
            'commit=$( [ -n "$m" ] && sed -n 1p "$m" ); '
            f'{{ echo {q("repo " + c.repo)}; echo "commit ${{commit:-unknown}}"; '
            f"find {d} -path {q(c.directory + '/.cache')} -prune -o -type f "
            "-printf 'file %s %P\\n' | sort -k 3; }"
        )
    message = f'echo "gpubox: {c.repo}: $name has ${{got:-no}} bytes, expected $size" >&2; bad=1'
    check = (
        f"set -e; {write} > {q(new)}; bad=0; "
        + _check_files(new, c.directory, message)
        + f'; if [ "$bad" != 0 ] || [ "$n" = 0 ]; then rm -f {q(new)}; '
        f'echo "gpubox: {c.repo} is incomplete in {c.directory}" >&2; exit 1; fi; '
        f"mv {q(new)} {q(c.marker)}"
    )
    return [f"mkdir -p {d}", fetch, check]
