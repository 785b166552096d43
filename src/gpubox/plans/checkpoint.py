"""The vLLM backend's checkpoint: a whole Hugging Face repository (config, tokenizer,
safetensors shards; about 42 GB for the catalog's 4-bit Qwen3-Next), downloaded on the box in
the background by the download unit (gpubox-model-download, the same unit the GGUF file uses:
one model per box), started by the early stage ``model_download``; the model stage waits for
it before vLLM starts, with progress (bytes, rate, ETA). vLLM then serves the local directory
with the Hub off (HF_HUB_OFFLINE=1): it never downloads at start.

Where: ``<model_dir>/<org>--<name>/`` (``/models/<org>--<name>`` in the container, which
mounts model_dir on /models). ``hf download REPO --local-dir DIR`` keeps its bookkeeping under
``DIR/.cache/huggingface/`` (a metadata file per file, the partial downloads, the tree
listing); run again, it skips the files it has and fetches only what is missing. It resumes
at file granularity only: huggingface_hub 1.x writes each file into a temporary file named
anew by every run, so a file cut short is fetched again from its start (the script removes
such leftovers before each transfer).

What gpubox knows of the repository it asks the Hub at plan time, on the box
(``GET /api/models/REPO/revision/REV?blobs=true``, REV the catalog's ``vllm_revision`` or
the host's, else ``main``: the commit and every file's size). The download then asks for that
commit (``--revision``), so the file list, the total of the progress lines and the bytes
agree; unknown (no answer), it downloads REV.

The transfer runs under the stall watchdog (model_script.watchdog): no new bytes in the
directory for download_stall_s restarts it; from the XET_OFF_AFTER-th stall on, or after an
attempt killed for memory (exit 137), hf runs with ``HF_HUB_DISABLE_XET=1``. The unit's
MemoryMax caps hf and hf_xet; XET_BOUNDS and MAX_WORKERS keep them below it.

Complete is recorded beside the directory (``<org>--<name>.gpubox-complete``), written only
once every file has the size the Hub gave: the repository, the commit, then one line per file
(``file SIZE NAME``). A deploy skips the download when every file named there has that size
(and, pinned to a commit, the marker records it); a missing or resized file is removed and
the download runs again (it fetches only that). Pure functions here; the operations are in
gpubox.stages.model."""

from __future__ import annotations

import json
import re
import shlex
import urllib.parse
from dataclasses import dataclass

from gpubox.base import layout
from gpubox.config import HostConfig
from gpubox.plans import model_script

MARKER_SUFFIX = ".gpubox-complete"
# Xet's parallelism and buffers, bounded from the start so that hf with hf_xet stays well under
# the unit's MemoryMax (download_memory_max, default 4G; hf_xet's RSS was measured at about
# 15 GB unbounded). Small fixed values: a download in the background of a deploy needs no
# more, and a box's link is filled by a few streams.
# - `hf download --max-workers`: the files fetched at once (huggingface_hub 1.x
#   src/huggingface_hub/cli/download.py, passed to snapshot_download; default 8).
# - HF_XET_CLIENT_AC_MAX_DOWNLOAD_CONCURRENCY: the most range fetches hf_xet's adaptive
#   concurrency runs at once (default 64), and HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_SIZE /
#   _LIMIT: its download buffer, base and ceiling (default 2gb / 8gb; the size must not exceed
#   the limit). Names and defaults: huggingface/xet-core xet_runtime/src/config/groups/
#   client.rs and reconstruction.rs, and read in hf_xet 1.8.0's binary (what pip installs
#   with huggingface_hub 1.33, which requires hf-xet>=1.6). hf_xet 1.8.0 no longer reads
#   HF_XET_NUM_CONCURRENT_RANGE_GETS (the name of older releases), so it is not set.
MAX_WORKERS = 2
XET_BOUNDS = (
    "HF_XET_CLIENT_AC_MAX_DOWNLOAD_CONCURRENCY=8 "
    "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_SIZE=512mb "
    "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_LIMIT=1gb"
)
CONTAINER_MODELS = "/models"  # where the vLLM container mounts model_dir
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Checkpoint:
    repo: str
    model_dir: str
    # the Hugging Face revision asked for (catalog vllm_revision or the host's vllm_revision);
    # None: main (the listing then names the commit main points at)
    revision: str | None = None

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
    model = config.catalog["models"][config.model]
    repo = model["vllm_repo"]
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise ValueError(f"vllm_repo {repo!r} is not a Hugging Face repository (owner/name)")
    revision = config.vllm_revision or model.get("vllm_revision") or None
    return Checkpoint(repo=repo, model_dir=config.model_dir, revision=revision)


def pinned_commit(c: Checkpoint) -> str | None:
    """The commit the checkpoint is pinned to (None for main, a branch or a tag)."""
    return c.revision if c.revision and _COMMIT.fullmatch(c.revision) else None


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
    q = shlex.quote
    # python3 when curl is not there yet (the early stage asks before anything is installed)
    fetch = (
        "import sys, urllib.request; "
        "print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode())"
    )
    return (
        f"if command -v curl >/dev/null 2>&1; then curl -fsS --max-time 20 {q(url)}; "
        "elif command -v python3 >/dev/null 2>&1; then "
        f"python3 -c {q(fetch)} {q(url)} 2>/dev/null; fi"
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


def complete_command(c: Checkpoint, commit: str | None = None) -> str:
    """A shell condition: the marker is there, names at least one file, every file it names
    has its size, and (given ``commit``) it records that commit."""
    q = shlex.quote
    same = f" && grep -qxF {q('commit ' + commit)} {q(c.marker)}" if commit else ""
    return (
        f"{{ [ -r {q(c.marker)} ]{same} && ( bad=0; "
        + _check_files(c.marker, c.directory, "bad=1")
        + '; [ "$bad" = 0 ] && [ "$n" -gt 0 ] ); }'
    )


def download_commands(
    c: Checkpoint,
    listing: Listing | None,
    hf_endpoint: str,
    token_file: str,
    hf_venv: str,
    quiet: str,
    stall_s: int = 120,
    token_read: str | None = None,
) -> list[str]:
    """mkdir; then, in one command: nothing when the marker says the repository is complete
    (at the listing's commit); else the files that cannot be right removed (those the old
    marker names at another size, and those the listing names at another size), the marker
    removed, ``hf download`` of the repository (at the listing's commit, else the plan's
    revision, else main) under the stall watchdog (Xet off after XET_OFF_AFTER stalls), then
    every file checked for its size and the new marker written. The token file
    (``token_file``; read from ``token_read``, default the same) is removed when the command
    ends by itself, kept when it is stopped (the next start resumes with it)."""
    q = shlex.quote
    d = q(c.directory)
    source = token_read or q(token_file)
    revision = listing.commit if listing else c.revision
    rev = f" --revision {q(revision)}" if revision else ""
    meta = q(c.directory + "/.cache/huggingface/download")
    # huggingface_hub 1.x downloads each file into a temporary file named anew by every run
    # (<meta>/NAME.<random>.incomplete): a run that was killed leaves one nobody resumes, so
    # the transfer removes them first. What survives a stop is the files already complete.
    # Xet off after an OOM kill (exit 137 at the unit's MemoryMax: hf_xet's buffers are what
    # outgrows it), or from the XET_OFF_AFTER-th stall (a hung hf_xet)
    transfer = (
        'if [ "${GPUBOX_OOMS:-0}" -gt 0 ]; then export HF_HUB_DISABLE_XET=1; '
        'echo "gpubox: hf was killed for memory (exit status 137): hf runs with Xet off '
        '(HF_HUB_DISABLE_XET=1)"; '
        f'elif [ "${{GPUBOX_STALLS:-0}}" -ge {model_script.XET_OFF_AFTER} ]; then '
        "export HF_HUB_DISABLE_XET=1; "
        'echo "gpubox: $GPUBOX_STALLS stalls: hf runs with Xet off (HF_HUB_DISABLE_XET=1)"; fi; '
        f"find {meta} -name '*.incomplete' -type f -exec rm -f {{}} + 2>/dev/null || true; "
        f"HF_ENDPOINT={q(hf_endpoint)} HF_TOKEN=$( [ -s {source} ] && cat {source} ) "
        f"{quiet} {XET_BOUNDS} {hf_venv}/bin/hf download {q(c.repo)}{rev} --local-dir {d} "
        f"--max-workers {MAX_WORKERS}"
    )
    new = c.marker + ".new"
    if listing:
        want = "printf '%s\\n' " + " ".join(q(line) for line in marker_lines(c, listing))
        # before the transfer: a file at another size than the listing's is no download hf
        # would finish (its metadata may say it has it)
        first = f"{want} > {q(new)}; " + _check_files(
            new, c.directory, f'[ -z "$got" ] || rm -f -- {d}/"$name"'
        )
        write = ":"
    else:
        # No listing: the files hf left (its .cache/ aside) and the commit of its metadata.
        first = ":"
        write = (
            f"m=$(find {meta} -name '*.metadata' -type f 2>/dev/null | head -n 1); "
            'commit=$( [ -n "$m" ] && sed -n 1p "$m" ); '
            f'{{ echo {q("repo " + c.repo)}; echo "commit ${{commit:-unknown}}"; '
            f"find {d} -path {q(c.directory + '/.cache')} -prune -o -type f "
            f"-printf 'file %s %P\\n' | sort -k 3; }} > {q(new)}"
        )
    stale = _check_files(c.marker, c.directory, f'[ -z "$got" ] || rm -f -- {d}/"$name"')
    message = f'echo "gpubox: {c.repo}: $name has ${{got:-no}} bytes, expected $size" >&2; bad=1'
    check = (
        f"{write}; bad=0; "
        + _check_files(new, c.directory, message)
        + f'; if [ "$bad" != 0 ] || [ "$n" = 0 ]; then rm -f {q(new)}; '
        f'echo "gpubox: {c.repo} is incomplete in {c.directory}" >&2; exit 1; fi; '
        f"mv {q(new)} {q(c.marker)}"
    )
    fetch = (
        f"trap 'rm -f {q(token_file)}' EXIT; trap 'trap - EXIT; exit 143' HUP INT TERM; "
        f"set -e; if {complete_command(c, listing.commit if listing else None)}; then "
        f'echo "gpubox: {c.repo} is complete in {c.directory}; kept"; else '
        f"if [ -r {q(c.marker)} ]; then {stale}; fi; rm -f {q(c.marker)}; {first}; "
        + model_script.watchdog(stall_s)
        + f"_gw_run {q(transfer)} {d}; {check}; fi"
    )
    return [f"mkdir -p {d}", fetch]


def download_script(
    c: Checkpoint, listing: Listing | None, hf_endpoint: str, stall_s: int, token: bool
) -> str:
    """The script the download unit runs for the checkpoint (model_script.script_text)."""
    commands = download_commands(
        c,
        listing,
        hf_endpoint,
        layout.HF_TOKEN_FILE,
        layout.HF_VENV,
        model_script.HF_QUIET,
        stall_s=stall_s,
        token_read=model_script.credential_read(token),
    )
    return model_script.script_text(c.repo, c.directory, commands)


def wait_command(c: Checkpoint) -> str:
    """The backend's wait for the checkpoint's download unit (model_script.wait_for)."""
    return model_script.wait_for(
        complete_command(c), f"{c.repo} downloaded (every file at its size)", f"a complete {c.repo}"
    )
