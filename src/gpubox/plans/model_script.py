"""The shell of the model download (gpubox.stages.model): the commands that download, resume
and verify the file, the stall watchdog they run the transfer under, the script and systemd
unit that run them in the background, and the backend's wait for that unit. Pure text: the
unit tests run it with stand-in tools."""

from __future__ import annotations

import shlex
import urllib.parse
from dataclasses import dataclass

from gpubox.base import layout
from gpubox.knowledge import modelscope

# huggingface_hub's own progress bars stay off (the long step reports progress), and so do the
# CLI's update check and telemetry (calls to pypi.org and the Hub that a mirror does not serve).
HF_QUIET = "HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_DISABLE_UPDATE_CHECK=1 HF_HUB_DISABLE_TELEMETRY=1"
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
    # hf: a Hugging Face commit; modelscope: a ModelScope revision; None: not pinned (hf asks
    # for main, modelscope for its default)
    revision: str | None = None
    # hf: the commit the deploy found for the sha256 (gpubox.plans.model_pin), downloaded
    # instead of the revision and recorded in the marker; None: none found or none looked for
    commit: str | None = None

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


# The background download (docs/models.md): a systemd unit running a script the stage writes.
UNIT = "gpubox-model-download"
UNIT_FILE = layout.unit_file(UNIT)
SCRIPT = "/usr/local/lib/gpubox/model-download.sh"
CREDENTIAL = "hf-token"  # the unit's LoadCredential= name for the Hugging Face token
# The stall watchdog samples the bytes every second; a transfer that fails (not a stall) is
# tried ATTEMPTS times, RETRY_S apart; after MAX_STALLS stalls the download fails. Both counts
# start again whenever bytes arrived during an attempt (the watched paths hold more bytes after
# it than before it), so only attempts in a row that brought nothing end a download of hours.
# The transfer sees how many stalls came before it in all ($GPUBOX_STALLS, never reset) and how
# many attempts were killed with exit status 137 ($GPUBOX_OOMS: the kernel's OOM killer at the
# unit's MemoryMax, which OOMPolicy=continue leaves to the script): hf runs with Xet off
# (HF_HUB_DISABLE_XET=1) after the first OOM kill, and from the XET_OFF_AFTER-th stall
# (gpubox.plans.checkpoint).
ATTEMPTS = 3
RETRY_S = 5
MAX_STALLS = 6
XET_OFF_AFTER = 2
# curl's own retries: --retry, not --retry-all-errors. --retry alone does not retry a
# connection reset in the middle of a transfer (curl(1)), and that is what gpubox wants: a
# retry inside one curl run starts again from where that run began (curl's tool_operate.c
# truncates the file to it), so with --retry-all-errors a reset after 40 GB of a run would
# fetch those 40 GB again (tests/integration/test_model_download.py's dropped connection saw
# a whole new GET, no range). curl exits instead, and the watchdog's next attempt resumes from
# the bytes on disk with a range request (-C -); the counts start again since bytes arrived.
CURL_RETRY = "-fsSL --retry 10 --retry-delay 5"

_WATCHDOG = r"""_gw_bytes() {
  du -sb $1 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'
}
_gw_run() {
  # $1: the transfer (sh text), run in a session of its own; $2: the paths whose bytes count
  _gw_stalls=0
  _gw_fails=0
  _gw_all_stalls=0
  _gw_ooms=0
  while :; do
    _gw_before=$(_gw_bytes "$2")
    GPUBOX_STALLS=$_gw_all_stalls GPUBOX_OOMS=$_gw_ooms setsid sh -c "$1" </dev/null &
    _gw_pid=$!
    _gw_last=
    _gw_quiet=0
    _gw_stalled=
    while kill -0 "$_gw_pid" 2>/dev/null; do
      sleep 1
      _gw_now=$(_gw_bytes "$2")
      if [ "$_gw_now" != "$_gw_last" ]; then
        _gw_last=$_gw_now
        _gw_quiet=0
      else
        _gw_quiet=$((_gw_quiet + 1))
      fi
      if [ "$_gw_quiet" -ge @STALL@ ]; then
        _gw_stalled=1
        echo "gpubox: no new bytes for @STALL@ s (download_stall_s): restarting the transfer"
        kill -TERM -"$_gw_pid" 2>/dev/null || kill -TERM "$_gw_pid" 2>/dev/null
        sleep 2
        kill -KILL -"$_gw_pid" 2>/dev/null || true
        break
      fi
    done
    _gw_rc=0
    wait "$_gw_pid" || _gw_rc=$?
    # bytes arrived during this attempt: the counts start again
    if [ "$(_gw_bytes "$2")" -gt "${_gw_before:-0}" ]; then
      _gw_stalls=0
      _gw_fails=0
    fi
    if [ -n "$_gw_stalled" ]; then
      _gw_stalls=$((_gw_stalls + 1))
      _gw_all_stalls=$((_gw_all_stalls + 1))
      if [ "$_gw_stalls" -ge @MAX_STALLS@ ]; then
        echo "gpubox: the transfer stalled $_gw_stalls times; giving up" >&2
        return 1
      fi
      continue
    fi
    [ "$_gw_rc" -eq 0 ] && return 0
    if [ "$_gw_rc" -eq 137 ]; then
      _gw_ooms=$((_gw_ooms + 1))
      echo "gpubox: the transfer was killed (exit status 137: out of memory at MemoryMax?)"
    fi
    _gw_fails=$((_gw_fails + 1))
    if [ "$_gw_fails" -ge @ATTEMPTS@ ]; then
      echo "gpubox: the transfer failed $_gw_fails times (exit status $_gw_rc)" >&2
      return "$_gw_rc"
    fi
    echo "gpubox: the transfer failed (exit status $_gw_rc); again in @RETRY@ s"
    sleep @RETRY@
  done
}
"""


def watchdog(stall_s: int) -> str:
    """The shell function ``_gw_run TRANSFER PATHS``: TRANSFER runs in a session of its own
    until it succeeds; no byte growth of PATHS for ``stall_s`` seconds kills it and starts it
    again (a partial file stays, and is resumed), with the number of stalls so far in its
    environment (``GPUBOX_STALLS``, all of them) with the number of attempts killed with exit
    status 137 (``GPUBOX_OOMS``); a failure is retried ATTEMPTS times; returns 1 after
    MAX_STALLS stalls, else the last failure's status. Both counts start again after an
    attempt during which bytes arrived."""
    values = {
        "STALL": str(int(stall_s)),
        "MAX_STALLS": str(MAX_STALLS),
        "ATTEMPTS": str(ATTEMPTS),
        "RETRY": str(RETRY_S),
    }
    text = _WATCHDOG
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def download_commands(
    p: ModelPlan,
    hf_endpoint: str,
    ms_endpoint: str,
    token_file: str = layout.HF_TOKEN_FILE,
    hf_venv: str = layout.HF_VENV,
    ms_venv: str = layout.MODELSCOPE_VENV,
    stall_s: int = 120,
    token_read: str | None = None,
    ms_ca_bundle: str | None = None,
) -> list[str]:
    """mkdir; then, in one command: nothing when the marker says the file verified as it is;
    else the file kept when it verifies, else downloaded (resuming whatever an earlier run
    left: nothing is removed before the transfer) under the stall watchdog and verified; then
    the marker written with the file's size and mtime. Each command stops at its first
    failure. ``ms_endpoint``: ModelScope's https URL or host name (ValueError for http://);
    ``ms_ca_bundle``: the CA bundle modelscope trusts. ``token_read``: the shell word of the
    file the hf token is read from (default
    ``token_file``; the unit reads its credential); ``token_file`` is removed when the
    command ends by itself (not when it is stopped: the next start resumes with it)."""
    q = shlex.quote
    d = q(p.directory)
    path = q(p.path)
    stage = q(p.staging)
    staged = q(f"{p.staging}/{p.file}")
    revision = f" --revision {q(p.revision)}" if p.revision else ""
    # modelscope: the staging directory is kept across runs (modelscope resumes what it
    # can there); the file moves into model_dir once it
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
        transfer = f"curl {CURL_RETRY} -C - -o {part} {q(p.url)}"
        fetch = (
            watchdog(stall_s)
            + f"_gw_run {q(transfer)} {part}; "
            + verify_command(p, p.path + ".part", remove=True)
            + f"; mv {part} {path}"
        )
    elif p.source == "hf":
        # The token file is removed when this command ends by itself; a stop (a signal) keeps
        # it, for the run that resumes the download (after a reboot: the unit at boot).
        before = (
            # mktemp makes the header file 0600 (no umask change: the model must stay readable)
            "GPUBOX_AUTH=$(mktemp); export GPUBOX_AUTH; "
            f"trap 'rm -f {q(token_file)} \"$GPUBOX_AUTH\"' EXIT; "
            "trap 'rm -f \"$GPUBOX_AUTH\"; trap - EXIT; exit 143' HUP INT TERM; "
        )
        source = token_read or q(token_file)
        # The token as a header file (printf is the shell's own: on no command line); curl
        # sends it to the Hub only, not to the CDN a redirect leads to.
        auth = (
            f"if [ -s {source} ]; then "
            f'printf \'Authorization: Bearer %s\\n\' "$(cat {source})" > "$GPUBOX_AUTH"; fi; '
        )
        # huggingface_hub 1.x (`hf download`) writes each run into a new temporary file, so a
        # run cut short leaves nothing the next run can resume. curl fetches the same resolve
        # URL (at the pinned revision) into <file>.part and resumes it with a Range request
        # (-C -), in the same run and in any later one. No Xet client runs: the Hub serves
        # Xet-stored files over plain HTTP too.
        part = q(p.path + ".part")
        url = hf_resolve_url(p, hf_endpoint)
        transfer = f'curl {CURL_RETRY} -C - -H @"$GPUBOX_AUTH" -o {part} {q(url)}'
        fetch = (
            auth
            + watchdog(stall_s)
            + f"_gw_run {q(transfer)} {part}; "
            + verify_command(p, p.path + ".part", remove=True)
            + f"; mv {part} {path}"
        )
    else:
        # modelscope keeps its partial files in the local dir and resumes what it can. It is
        # given the endpoint's host and adds https:// itself (gpubox.knowledge.modelscope); a
        # private CA (modelscope_ca_bundle) reaches its requests as REQUESTS_CA_BUNDLE. Every
        # release takes --model and --local_dir (modelscope-hub as legacy arguments).
        env = modelscope.env(ms_endpoint)
        if ms_ca_bundle:
            env["REQUESTS_CA_BUNDLE"] = ms_ca_bundle
        transfer = (
            " ".join(f"{name}={q(value)}" for name, value in env.items())
            + f" {ms_venv}/bin/modelscope download --model "
            f"{q(p.repo)} {q(p.file)}{revision} --local_dir {stage}"
        )
        fetch = (
            f"mkdir -p {stage}; "
            + watchdog(stall_s)
            + f"_gw_run {q(transfer)} {stage}"
            + into_place
        )
    return [
        f"mkdir -p {d}",
        before + "set -e; " + f"if {marker_matches_command(p)}; then "
        f'echo "gpubox: {p.file} is there and verified; kept"; '
        f"else rm -f {q(p.marker)}; "
        f"if [ -f {path} ] && {matches_command(p, p.path)}; then "
        f'echo "gpubox: {p.file} is there and verifies; kept"; '
        f"else rm -f {path}; {fetch}; fi; fi",
        f"printf '%s %s\\n' {q(p.stamp)} \"$(stat -c {q(STAT_FORMAT)} {path})\" > {q(p.marker)}"
        + (f"; echo commit={q(p.commit)} >> {q(p.marker)}" if p.commit else ""),
    ]


def hf_resolve_url(p: ModelPlan, hf_endpoint: str) -> str:
    """The Hub's URL of the file at the plan's commit, else its revision (main when
    unpinned)."""
    revision = urllib.parse.quote(p.commit or p.revision or "main", safe="")
    return f"{hf_endpoint.rstrip('/')}/{p.repo}/resolve/{revision}/{urllib.parse.quote(p.file)}"


def marker_matches_command(p: ModelPlan) -> str:
    """A shell condition: the marker records the file as it is now (verified, unchanged): its
    first line (a second, ``commit=``, names the commit the file came from)."""
    q = shlex.quote
    return (
        f'[ -f {q(p.path)} ] && [ "$(head -n 1 {q(p.marker)} 2>/dev/null)" = '
        f'"{p.stamp} $(stat -c {q(STAT_FORMAT)} {q(p.path)} 2>/dev/null)" ]'
    )


def download_script(
    p: ModelPlan,
    hf_endpoint: str,
    ms_endpoint: str,
    stall_s: int,
    token: bool,
    ms_ca_bundle: str | None = None,
) -> str:
    """The script the download unit runs (``sh SCRIPT``): ``download_commands`` with the hf
    token read from the unit's credential, then the unit disabled once the file verified (it
    is enabled only while a download is pending, so that it resumes after a reboot)."""
    commands = download_commands(
        p,
        hf_endpoint,
        ms_endpoint,
        stall_s=stall_s,
        token_read=credential_read(token),
        ms_ca_bundle=ms_ca_bundle,
    )
    return script_text(p.file, p.directory, commands)


def credential_read(token: bool) -> str:
    """The shell word of the file the unit's script reads the hf token from: its credential."""
    return f'"${{CREDENTIALS_DIRECTORY:-/nonexistent}}/{CREDENTIAL}"' if token else "/nonexistent"


def script_text(what: str, directory: str, commands: list[str]) -> str:
    """The unit's script: ``commands`` (``step_command``), then the unit disabled."""
    return (
        "#!/bin/sh\n"
        f"# gpubox: download {what} into {directory} (written by the deploy; run by\n"
        f"# {UNIT}.service, see docs/models.md)\n"
        + step_command(commands)
        + f"systemctl disable -q {UNIT}.service 2>/dev/null || true\n"
    )


def unit_text(p: ModelPlan, memory_max: str, token: bool) -> str:
    """The download unit of the GGUF file (``unit_text_for``)."""
    return unit_text_for(p.file, p.directory, memory_max, token)


def unit_text_for(what: str, directory: str, memory_max: str, token: bool) -> str:
    """The download unit (of the GGUF file, or of the vLLM checkpoint). Enabled while a
    download is pending (WantedBy=multi-user.target): the driver stage reboots the box
    mid-deploy, and the download goes on at boot by itself,
    before any deploy reconnects. Low priority: idle CPU niceness, batch scheduling, the
    lowest best-effort IO priority (not the idle class, which a busy build or apt install
    would starve). MemoryMax caps the transfer, hf_xet included (its RSS was measured at
    about 15 GB uncapped; gpubox.plans.checkpoint bounds its parallelism and buffers too);
    OOMPolicy=continue: the OOM killer ends the transfer, and the script retries it (with Xet
    off), instead of systemd stopping the unit. The Hugging Face token is a
    credential (LoadCredential=, from a root-only file): never on a command line or in an
    Environment= line."""
    credential = f"LoadCredential={CREDENTIAL}:{layout.HF_TOKEN_FILE}\n" if token else ""
    return (
        "# gpubox: the model download in the background (docs/models.md)\n"
        "[Unit]\n"
        f"Description=gpubox: download {what}\n"
        "Wants=network-online.target\n"
        "After=network-online.target\n"
        f"RequiresMountsFor={directory}\n"
        "\n"
        "[Service]\n"
        "Type=exec\n"
        f"ExecStart=/bin/sh {SCRIPT}\n"
        "Nice=19\n"
        "CPUSchedulingPolicy=batch\n"
        "IOSchedulingClass=best-effort\n"
        "IOSchedulingPriority=7\n"
        f"MemoryMax={memory_max}\n"
        # an OOM kill at MemoryMax kills the transfer, not the unit: systemd's default
        # (DefaultOOMPolicy=stop, systemd.service(5) OOMPolicy=) would stop the whole unit, and
        # neither the script's retries nor its Xet-off fallback would run
        "OOMPolicy=continue\n"
        f"{credential}"
        "# retries and the stall watchdog are the script's; a failed download stays failed\n"
        "Restart=no\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


JOURNAL_WAIT_S = 10


def wait_command(p: ModelPlan) -> str:
    """The backend's wait for the GGUF file's download (``wait_for``)."""
    return wait_for(
        marker_matches_command(p), f"{p.file} downloaded and verified", f"a verified {p.file}"
    )


def wait_for(
    done: str, finished: str, missing: str, unit: str = UNIT, what: str = "model download"
) -> str:
    """The backend's wait for a download unit (``unit``): until it is no longer running;
    then done when the shell condition ``done`` holds (the model download's unit disabled,
    its token file gone), else a failure with the unit's last journal lines."""
    q = shlex.quote
    cleanup = (
        f'  systemctl disable -q "$u" 2>/dev/null || true\n  rm -f {q(layout.HF_TOKEN_FILE)}\n'
        if unit == UNIT
        else ""
    )
    return (
        f"u={unit}.service\n"
        "while :; do\n"
        '  s=$(systemctl show -p ActiveState --value "$u")\n'
        '  case "$s" in activating|active|deactivating|reloading) sleep 2 ;; *) break ;; esac\n'
        "done\n"
        f"if {done}; then\n"
        f"{cleanup}"
        f'  echo "gpubox: {finished}"\n'
        "  exit 0\n"
        "fi\n"
        'r=$(systemctl show -p Result --value "$u")\n'
        f'echo "gpubox: the {what} ($u: $s, result $r) ended without '
        f'{missing}; its last journal lines:" >&2\n'
        # journald writes a unit's last output lines a moment after the unit ended (later
        # still on a busy box): ask it to catch up, and look again, for up to JOURNAL_WAIT_S;
        # then the unit's last lines of any run, when this run's carry no invocation ID
        'id=$(systemctl show -p InvocationID --value "$u")\n'
        "lines=\n"
        f"for i in $(seq {JOURNAL_WAIT_S}); do\n"
        '  [ -n "$id" ] || break\n'
        "  journalctl --sync 2>/dev/null || true\n"
        '  lines=$(journalctl --no-pager -o cat -n 30 _SYSTEMD_INVOCATION_ID="$id" 2>/dev/null)\n'
        '  [ -n "$lines" ] && break\n'
        "  sleep 1\n"
        "done\n"
        '[ -n "$lines" ] || lines=$(journalctl --no-pager -o cat -n 30 -u "$u" 2>/dev/null)\n'
        "printf '%s\\n' \"$lines\" >&2\n"
        "exit 1\n"
    )


def step_command(commands: list[str]) -> str:
    """``download_commands`` as one script that stops at the first failure, as pyinfra runs a
    list of commands. Each runs in a subshell of its own (its traps and ``set -e`` stay its
    own) as a plain statement of a ``set -e`` script, so ``set -e`` holds inside it too."""
    return "set -e\n" + "".join(f"(\n{command}\n)\n" for command in commands)
