"""Progress for long deploy steps, shown through pyinfra's own output.

A step that takes minutes (a 3 GB apt install, a model download, a build, an image pull) would
otherwise sit silent until it ends. ``long_step`` runs its command on the host in the
background and, every ``every`` seconds (10 by default, always under 15), prints one line made
by a *probe* shell snippet. pyinfra prints the line as it arrives, after the host's name, with
plain ``pyinfra INVENTORY deploy/full.py`` (no -v needed)::

    [box] Install cuda-toolkit-12-8 [40 s]: downloaded 1.2 GiB of 3.0 GiB (40%), 110 MB/s, ETA 16 s
    [box] Install cuda-toolkit-12-8 [2 min 0 s]: setting up cuda-nvcc-12-8 (31 of 70 packages)
    [box] Install cuda-toolkit-12-8: done in 2 min 31 s

The command's own output goes to a temporary log on the host; when the command fails, the
log's last 40 lines go to stderr, so pyinfra shows them with the error. The exit status of the
command is the operation's; the log is removed however the step ends.

How to use (``name`` and every pyinfra global argument, ``_sudo`` included, work as for
``server.shell``; the returned OperationMeta answers ``did_change()`` like server.shell's),
in a stage that imports ``progress`` from gpubox at its top::

    # a download into a file or a directory (partial files count), total known or not
    progress.long_step(
        name="Download the model",
        command="hf download org/model --local-dir /srv/models/model",
        probe=progress.download_probe("/srv/models/model", total=45 * 2**30),
    )
    # a build whose ninja output goes to a log: "412 of 1290 targets built (31%), ETA 6 min"
    progress.long_step(
        name="Build llama.cpp",
        command="cmake --build build -j 8 >/tmp/build.log 2>&1",
        probe=progress.ninja_probe("/tmp/build.log"),  # or ninja_probe() for the step's own log
    )
    # an apt-get install (its "Need to get ..." line gives the total)
    progress.long_step(
        name="Install cuda-toolkit-12-8",
        command="DEBIAN_FRONTEND=noninteractive apt-get -y install cuda-toolkit-12-8",
        probe=progress.apt_probe(),
    )
    # an image pull (bytes received on the default route's interface)
    progress.long_step(
        name="Pull vllm/vllm-openai:v0.9.2",
        command="docker pull vllm/vllm-openai:v0.9.2",
        probe=progress.docker_pull_probe("vllm/vllm-openai:v0.9.2", total_bytes=9 * 10**9),
    )

A probe is POSIX sh, run by the wrapper in its own shell (not a subshell) once before the
command starts (a baseline, printed nowhere) and then once per interval; the first line it
prints is shown. It may keep state between runs in shell variables named ``_p_*`` and read
the wrapper's ``$_gb_now`` (epoch seconds of this sample), ``$_gb_start``, ``$_gb_log`` (the
step's own output) and ``$_gb_dir`` (a private temporary directory); ``_gb_progress BYTES
[TOTAL]`` prints "X of Y (P%), R MB/s, ETA ..." with the rate over the last interval. A probe
must not ``exit``. ``wrapper_command`` returns the whole shell text (tests run it with
/bin/sh).
"""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra import host
from pyinfra.api import OperationValueError, StringCommand, operation
from pyinfra.connectors.util import CommandOutput

# The step's own output (the temporary log), for a probe that reads it: pass it where a probe
# builder takes a log path (ninja_probe(STEP_LOG)).
STEP_LOG = '"$_gb_log"'

DEFAULT_EVERY = 10
MAX_EVERY = 14  # a line at least every 15 s, counting the probe's own time
TAIL_LINES = 40
_EOF = "_GB_STEP_EOF"

# Formatting, in awk (mawk and gawk alike): sizes in binary units, rates in MB/s as downloads
# are usually quoted, durations as "5 min 10 s".
_AWK_LIB = r"""
function size(b) {
  if (b >= 1073741824) return sprintf("%.1f GiB", b / 1073741824)
  if (b >= 1048576) return sprintf("%.1f MiB", b / 1048576)
  if (b >= 1024) return sprintf("%.1f KiB", b / 1024)
  return sprintf("%d B", b)
}
function dur(s) {
  s = int(s + 0.5)
  if (s >= 3600) return sprintf("%d h %d min", int(s / 3600), int((s % 3600) / 60))
  if (s >= 60) return sprintf("%d min %d s", int(s / 60), s % 60)
  return sprintf("%d s", s)
}
function rate(r) {
  if (r >= 10e6) return sprintf("%.0f MB/s", r / 1e6)
  if (r >= 1e6) return sprintf("%.1f MB/s", r / 1e6)
  return sprintf("%.0f kB/s", r / 1e3)
}
"""

# The wrapper's shell functions. Nothing here may contain " install " (the plan tests find a
# step's packages after the first " install " of its text, which must be the command's own).
_PRELUDE = (
    "_gb_awk='"
    + _AWK_LIB
    + "'\n"
    + r"""_gb_dur() { awk -v s="$1" "$_gb_awk"'BEGIN { print dur(s) }'; }
# _gb_progress BYTES [TOTAL]: sets _gb_out to the bytes so far (and the total, when known),
# the rate since the previous call, percent and ETA; the first call only takes the sample.
# Call it as a command, not in $( ), so that the sample it keeps survives.
_gb_progress() {
  _gb_out=
  if [ -n "$_gb_pt" ]; then
    _gb_out=$(awk -v b="${1:-0}" -v t="$2" -v pb="$_gb_pb" -v dt="$((_gb_now - _gb_pt))" "$_gb_awk"'
      BEGIN {
        r = (dt > 0) ? (b - pb) / dt : 0
        if (r < 0) r = 0
        out = size(b)
        if (t > 0) {
          p = int(100 * b / t); if (p > 100) p = 100
          out = out " of " size(t) " (" p "%)"
        }
        out = out ", " rate(r)
        if (t > 0 && b < t) {
          if (r > 0) out = out ", ETA " dur((t - b) / r)
          else out = out ", nothing new in the last " dur(dt)
        }
        print out
      }')
  fi
  _gb_pb=${1:-0}
  _gb_pt=$_gb_now
}
_gb_stop() {
  if [ -n "$_gb_pid" ]; then
    kill -TERM -"$_gb_pid" 2>/dev/null || kill -TERM "$_gb_pid" 2>/dev/null
  fi
  exit "$1"
}
"""
)

_MAIN = r"""_gb_main() {
  _gb_dir=$(mktemp -d "${TMPDIR:-/tmp}/gpubox-step.XXXXXX") || exit 1
  _gb_log="$_gb_dir/log"
  _gb_pid=
  _gb_pb=
  _gb_pt=
  trap 'rm -rf "$_gb_dir"' EXIT
  trap '_gb_stop 129' HUP
  trap '_gb_stop 130' INT
  trap '_gb_stop 141' PIPE
  trap '_gb_stop 143' TERM
  cat >"$_gb_dir/step"
  : >"$_gb_log"
  _gb_start=$(date +%s)
  _gb_now=$_gb_start
  { @PROBE@
  } >/dev/null 2>&1
  # its own session, so that a stop ends the whole command (its children too)
  if command -v setsid >/dev/null 2>&1; then _gb_ss="setsid -w"; else _gb_ss=; fi
  $_gb_ss sh "$_gb_dir/step" >"$_gb_log" 2>&1 </dev/null &
  _gb_pid=$!
  _gb_next=$((_gb_start + _gb_every))
  while kill -0 "$_gb_pid" 2>/dev/null; do
    sleep 1
    _gb_now=$(date +%s)
    [ "$_gb_now" -lt "$_gb_next" ] && continue
    kill -0 "$_gb_pid" 2>/dev/null || break
    _gb_next=$((_gb_next + _gb_every))
    [ "$_gb_next" -le "$_gb_now" ] && _gb_next=$((_gb_now + _gb_every))
    { @PROBE@
    } >"$_gb_dir/line" 2>/dev/null
    _gb_line=
    IFS= read -r _gb_line <"$_gb_dir/line"
    printf '%s [%s]: %s\n' "$_gb_label" "$(_gb_dur $((_gb_now - _gb_start)))" \
      "${_gb_line:-working}"
  done
  wait "$_gb_pid"
  _gb_rc=$?
  _gb_pid=
  _gb_took=$(_gb_dur $(($(date +%s) - _gb_start)))
  if [ "$_gb_rc" -ne 0 ]; then
    printf '%s: failed (exit status %s) after %s; the last %s lines of its output:\n' \
      "$_gb_label" "$_gb_rc" "$_gb_took" "@TAIL@" >&2
    tail -n @TAIL@ "$_gb_log" >&2
  else
    printf '%s: done in %s\n' "$_gb_label" "$_gb_took"
  fi
  exit "$_gb_rc"
}
"""


def wrapper_command(command: str, probe: str, every: int = DEFAULT_EVERY, label: str = "") -> str:
    """The shell text of a long step: run ``command`` (POSIX sh) in the background, its output
    to a temporary log, and print one ``probe`` line every ``every`` seconds (see the module's
    docstring). The command comes last, as a quoted here-document, verbatim."""
    if not isinstance(every, int) or not 1 <= every <= MAX_EVERY:
        raise ValueError(f"every must be 1 to {MAX_EVERY} seconds, not {every!r}")
    if any(line.strip() == _EOF for line in command.splitlines()):
        raise ValueError(f"a long step's command cannot hold a line {_EOF}")
    probe = probe.strip() or ":"
    main = _MAIN.replace("@PROBE@", probe).replace("@TAIL@", str(TAIL_LINES))
    return (
        "# gpubox long step: the command below runs in the background, a progress line "
        f"every {every} s\n"
        f"_gb_every={every}\n"
        f"_gb_label={shlex.quote(label or 'long step')}\n"
        f"{_PRELUDE}{main}"
        f"_gb_main <<'{_EOF}'\n{command.rstrip()}\n{_EOF}\n"
    )


class StreamingCommand(StringCommand):
    """A shell command whose output pyinfra prints line by line as it arrives, after the
    host's name, whatever the verbosity (pyinfra prints an operation's output only with -vvv
    otherwise). Connector arguments (_sudo, _env, _timeout, ...) apply as to any command."""

    def execute(self, state: Any, host: Any, connector_arguments: Any) -> Any:
        connector_arguments.update(self.connector_arguments)
        status, output = host.run_shell_command(
            self,
            print_output=True,
            print_input=state.print_input,
            **connector_arguments,
        )
        if status is False and not state.print_output:
            # pyinfra prints a failed command's output again: the progress lines were shown
            # already, so only stderr (the log's tail) goes with the error
            output = CommandOutput([line for line in output if line.buffer_name == "stderr"])
        return status, output


@operation(is_idempotent=False)
def long_step(command: str, probe: str, every: int = DEFAULT_EVERY):
    """Run ``command`` on the host with a progress line (from the shell snippet ``probe``)
    every ``every`` seconds (under 15), shown live by pyinfra; see the module's docstring.
    Always runs (not idempotent): guard it as server.shell would be guarded."""
    if not isinstance(every, int) or not 1 <= every <= MAX_EVERY:
        raise OperationValueError(f"every must be 1 to {MAX_EVERY} seconds, not {every!r}")
    arguments: dict[str, Any] = dict(host.current_op_global_arguments or {})
    label = str(arguments.get("name") or "long step")
    yield StreamingCommand(wrapper_command(command, probe, every, label=label))


# Probes ----------------------------------------------------------------------------------
# Templates: @NAME@ is replaced by a quoted value. Each keeps its state in _p_* variables.

_DOWNLOAD = r"""
if [ -d @PATH@ ]; then
  _p_b=$(du -sb @PATH@ 2>/dev/null | cut -f1)
else
  _p_b=$(du -cb @PATH@ @PATH@.part @PATH@.incomplete 2>/dev/null | tail -n 1 | cut -f1)
fi
_gb_progress "${_p_b:-0}" @TOTAL@
echo "downloaded ${_gb_out:-0 B so far}"
"""

_NINJA = r"""
_p_nn=$(tac @LOG@ 2>/dev/null | grep -m 1 -o '\[[0-9][0-9]*/[0-9][0-9]*\]' | head -n 1 | tr -d '[]')
if [ -z "$_p_nn" ]; then
  echo configuring
else
  awk -v nn="$_p_nn" -v pn="$_p_pn" -v dt="$((_gb_now - ${_p_pt:-$_gb_now}))" "$_gb_awk"'
    BEGIN {
      split(nn, a, "/"); n = a[1]; t = a[2]
      out = n " of " t " targets built"
      if (t > 0) out = out " (" int(100 * n / t) "%)"
      if (pn != "" && dt > 0 && n > pn && t > n) out = out ", ETA " dur((t - n) * dt / (n - pn))
      print out
    }'
  _p_pn=${_p_nn%%/*}
  _p_pt=$_gb_now
fi
"""

_APT = r"""
_p_a=$(du -sb @ARCHIVES@ 2>/dev/null | cut -f1)
_p_a=${_p_a:-0}
if [ -z "$_p_a0" ]; then
  _p_a0=$_p_a
  _p_d0=$(wc -c <@DPKG_LOG@ 2>/dev/null || echo 0)
fi
# "Need to get 1,234 kB/3,012 MB of archives.": what is left to fetch comes first
_p_need=$(sed -n 's/^Need to get \([0-9.,]*\) \([kMG]*B\)[ /].*/\1 \2/p' "$_gb_log" | head -n 1 |
  awk '{ gsub(",", "", $1); m = ($2 == "kB") ? 1e3 : ($2 == "MB") ? 1e6 : ($2 == "GB") ? 1e9 : 1
         printf "%.0f", $1 * m }')
_p_pk=$(sed -n 's/^\([0-9]*\) upgraded, \([0-9]*\) newly installed.*/\1 \2/p' "$_gb_log" |
  head -n 1 | awk '{ print $1 + $2 }')
_p_dpkg=$(tail -c +$((_p_d0 + 1)) @DPKG_LOG@ 2>/dev/null | awk -v all="$_p_pk" '
  $3 == "install" || $3 == "upgrade" { u++; last = "unpacking " $4; n = u }
  $3 == "configure" { c++; last = "setting up " $4; n = c }
  END {
    if (last == "") exit
    sub(/:[a-z0-9]*$/, "", last)
    if (all > 0) last = last " (" n " of " all " packages)"
    print last
  }')
if [ -n "$_p_dpkg" ]; then
  echo "$_p_dpkg"
else
  _gb_progress "$((_p_a - _p_a0))" $_p_need
  echo "downloaded ${_gb_out:-0 B so far}"
fi
"""

_DOCKER_PULL = r"""
_p_if=$(awk '$2 == "00000000" { print $1; exit }' /proc/net/route 2>/dev/null)
if [ -n "$_p_if" ] && [ -r "/sys/class/net/$_p_if/statistics/rx_bytes" ]; then
  _p_rx=$(cat "/sys/class/net/$_p_if/statistics/rx_bytes")
else
  _p_rx=$(awk 'NR > 2 { sub(/^ */, ""); split($0, a, /: */); split(a[2], f, / +/)
                        if (a[1] != "lo") s += f[1] }
               END { printf "%.0f", s }' /proc/net/dev 2>/dev/null)
fi
_p_rx=${_p_rx:-0}
[ -n "$_p_rx0" ] || _p_rx0=$_p_rx
_gb_progress "$((_p_rx - _p_rx0))" @TOTAL@
# layers: "ID: Pulling fs layer" then "ID: Pull complete"; "ID: Already exists" needs none
_p_ly=$(awk '/: Pulling fs layer$/ { n++ } /: Pull complete$/ { d++ } /: Already exists$/ { e++ }
             END { if (n + e > 0) printf ", %d of %d layers done", d + e, n + e }' \
        "$_gb_log" 2>/dev/null)
echo "pulling @IMAGE@: ${_gb_out:-0 B so far}$_p_ly"
"""


def _q(path: str) -> str:
    return path if path == STEP_LOG else shlex.quote(path)


def _fill(template: str, **values: str) -> str:
    for key, value in values.items():
        template = template.replace(f"@{key}@", value)
    return template.strip()


def _total(total: int | None) -> str:
    return str(int(total)) if total else ""


def download_probe(path: str, total: int | None = None) -> str:
    """Bytes so far of a download into ``path``: a directory (everything under it, partial
    files included) or a file (with its ``.part``/``.incomplete`` sibling), the rate over the
    last interval, and percent and ETA when ``total`` (bytes) is known:
    "downloaded 12.3 GiB of 45.0 GiB (27%), 110 MB/s, ETA 5 min 10 s"."""
    return _fill(_DOWNLOAD, PATH=_q(path), TOTAL=_total(total))


def ninja_probe(log: str = STEP_LOG) -> str:
    """The last "[n/N]" of the ninja output in ``log`` (the step's own output by default; a
    log of its own must be written afresh by the step, not appended to):
    "412 of 1290 targets built (31%), ETA 6 min 2 s" (the ETA at the last interval's pace);
    "configuring" before ninja's first line."""
    return _fill(_NINJA, LOG=_q(log))


def apt_probe(
    archives: str = "/var/cache/apt/archives", dpkg_log: str = "/var/log/dpkg.log"
) -> str:
    """An apt-get install's progress. While it downloads: the growth of ``archives``
    (partial/ included) against apt's "Need to get ..." (read from the step's output), with
    rate and ETA: "downloaded 1.2 GiB of 3.0 GiB (40%), 110 MB/s, ETA 16 s". Once dpkg
    works: the package it unpacks or sets up, from the lines ``dpkg_log`` got since the step
    began, out of the packages apt announced: "setting up cuda-nvcc-12-8 (31 of 70
    packages)". The paths are parameters for the tests only."""
    return _fill(_APT, ARCHIVES=_q(archives), DPKG_LOG=_q(dpkg_log))


def docker_pull_probe(image: str, total_bytes: int | None = None) -> str:
    """An image pull's progress: bytes received since the step began on the default route's
    interface (every interface but lo without a default route), with rate, and percent and
    ETA when ``total_bytes`` is known; the layers done so far when the pull's output lists
    them: "pulling IMAGE: 2.1 GiB of 8.4 GiB (25%), 95 MB/s, ETA 1 min 6 s, 3 of 12 layers
    done". Other traffic of the host counts too: an estimate."""
    return _fill(_DOCKER_PULL, TOTAL=_total(total_bytes), IMAGE=_shell_text(image))


def _shell_text(text: str) -> str:
    """``text`` safe inside a double-quoted shell string."""
    return "".join("\\" + c if c in '"$`\\' else c for c in text)
