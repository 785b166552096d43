"""The end of deploy/full.py: the quick checks of gpubox.checks, run on the box once it has
converged (inventory key ``verify_after_deploy``, on by default).

The same checks as ``pytest tests/host -m quick`` and doctor, less the burn-in record (burn-in
is its own run: deploy/burnin.py) and any that act on the box. The operation reads the facts
when it executes (after every stage), yields no command, so a converged box reports no
change; a failed check fails the host, naming each check, what it found and its fix.

The facts are read in two round trips, not one per fact: the OS release first (the other
commands depend on the OS target), then every other fact the checks read, one after the
other in one shell, each output carried back exactly with its exit status (``Batch``). Not
side by side: a check of the processes' arguments would see the API requests of the others,
and the server's slots would be busy with them.

When the fleet is monitored (issue 31), the operation also writes the node exporter's textfile
``gpubox-deploy.prom`` (``write_status``) from its callback, through the connection, not as an
operation command (a converged re-deploy still reports no change): the run's time, its success
(0 when a check failed, written before the operation fails), and the times of the last
successful deploy and check run (kept from the file's last values when this run failed)."""

from __future__ import annotations

import base64
import shlex
import sys
import time
from collections.abc import Iterable

from pyinfra import host, logger
from pyinfra.api import OperationError, operation

from gpubox import checks
from gpubox.config import HostConfig
from gpubox.knowledge import metrics
from gpubox.ops import box_metrics
from gpubox.stages import current_config

RC_MARK = "@@gpubox-rc="
BATCH_MARK = "@@gpubox-batch"


def deploy_checks() -> list[checks.Check]:
    """The checks the deploy ends with."""
    return [c for c in checks.select(["quick"], passive=True) if c.area != "burnin"]


def runner(pyinfra_host: object, sudo: dict[str, bool]) -> checks.Runner:
    """Run one fact's command through pyinfra's connection. Its exit status rides on the
    last line of standard error, after a newline of its own (a command's output need not
    end with one), so standard output stays exactly the command's."""

    def run(command: str) -> checks.Output:
        _, out = pyinfra_host.run_shell_command(  # type: ignore[attr-defined]
            f"{command}\nprintf '\\n{RC_MARK}%s\\n' \"$?\" >&2",
            print_output=False,
            _timeout=300,
            **sudo,
        )
        stdout = "".join(line + "\n" for line in out.stdout_lines)
        errors = list(out.stderr_lines)
        rc = 255
        if errors and errors[-1].startswith(RC_MARK):
            rc = int(errors.pop()[len(RC_MARK) :] or 255)
            if errors and errors[-1] == "":
                errors.pop()
        return checks.Output(rc, stdout, "\n".join(errors), command)

    return run


def batch_command(commands: list[str], in_turn: Iterable[str] = ()) -> str:
    """Shell that runs ``commands``, each in its own subshell with no input: side by side,
    except those in ``in_turn``, which run one after the other once the others have ended;
    then prints one line per command: the mark, its index, its exit status, its standard
    output and standard error in base64 ("-" when empty)."""
    alone = set(in_turn)
    parts = ["d=$(mktemp -d) || exit 1; trap 'rm -rf \"$d\"' EXIT"]
    order = [i for i, c in enumerate(commands) if c not in alone]
    order += [i for i, c in enumerate(commands) if c in alone]
    waited = False
    for i in order:
        run = f'{{ (\n{commands[i]}\n) >"$d/{i}.o" 2>"$d/{i}.e" </dev/null; echo $? >"$d/{i}.r"; }}'
        if commands[i] in alone:
            if not waited:
                parts.append("wait")
                waited = True
            parts.append(run)
        else:
            parts.append(run + " &")
    if not waited:
        parts.append("wait")
    parts.append(
        f"for i in {' '.join(str(i) for i in range(len(commands)))}; do "
        'o=$(base64 -w0 < "$d/$i.o"); e=$(base64 -w0 < "$d/$i.e"); '
        f'printf \'{BATCH_MARK} %s %s %s %s\\n\' "$i" "$(cat "$d/$i.r")" "${{o:--}}" "${{e:--}}"; '
        "done"
    )
    return "\n".join(parts)


def _decode(field: str) -> str:
    return "" if field == "-" else base64.b64decode(field).decode("utf-8", "replace")


def parse_batch(commands: list[str], lines: Iterable[str]) -> dict[str, checks.Output]:
    """The outputs ``batch_command`` printed, by command, as ``runner`` would have returned
    them (standard output one line ending each line); a command without its line is absent."""
    found: dict[str, checks.Output] = {}
    for line in lines:
        words = line.split(" ")
        if len(words) != 5 or words[0] != BATCH_MARK:
            continue
        try:
            command = commands[int(words[1])]
            rc = int(words[2])
            out, err = _decode(words[3]), _decode(words[4])
        except (ValueError, IndexError):
            continue
        stdout = "".join(line + "\n" for line in out.splitlines())
        found[command] = checks.Output(rc, stdout, "\n".join(err.splitlines()), command)
    return found


class Batch:
    """A runner (``runner``'s) that answers from outputs read together beforehand (``read``),
    and runs a command alone when it has none for it."""

    def __init__(self, pyinfra_host: object, sudo: dict[str, bool]) -> None:
        self.host = pyinfra_host
        self.sudo = sudo
        self.alone = runner(pyinfra_host, sudo)
        self.outputs: dict[str, checks.Output] = {}

    def __call__(self, command: str) -> checks.Output:
        if command in self.outputs:
            return self.outputs[command]
        return self.alone(command)

    def read(self, commands: Iterable[str], in_turn: Iterable[str] = ()) -> None:
        todo = [c for c in dict.fromkeys(commands) if c not in self.outputs]
        if not todo:
            return
        try:
            _, out = self.host.run_shell_command(  # type: ignore[attr-defined]
                batch_command(todo, in_turn), print_output=False, _timeout=300, **self.sudo
            )
        except Exception:  # noqa: BLE001 - each command is then run alone, as before
            return
        self.outputs.update(parse_batch(todo, out.stdout_lines))


def read_ahead(
    batch: Batch, facts: checks.Facts, chosen: list[checks.Check], config: HostConfig
) -> None:
    """Read every fact the chosen checks may read in one round trip (after the OS release,
    which the other commands depend on)."""
    target = facts.target
    # in the order the checks read them
    names = [n for n in dict.fromkeys(n for c in chosen for n in c.reads) if n != "os_release"]
    commands, in_turn = [], []
    for name in names:
        fact = checks.FACTS.get(name)
        if fact is None or fact.active:
            continue
        command = fact.command_for(config, target)
        if command is not None:
            commands.append(command)
            if fact.in_turn:
                in_turn.append(command)
    batch.read(commands, in_turn)


def failures(verdicts: list[checks.Verdict]) -> str:
    return "\n".join(f"  [{v.check}] {v.message}\n      fix: {v.fix}" for v in verdicts)


DEPLOY_METRICS = (
    "gpubox_deploy_last_run_timestamp_seconds",
    "gpubox_deploy_last_run_success",
    "gpubox_deploy_last_success_timestamp_seconds",
    "gpubox_checks_last_success_timestamp_seconds",
)


def status_text(previous: str, success: bool, checked: bool, now: float) -> str:
    """gpubox-deploy.prom after a deploy that ended now: its time and ``success``; the last
    success's times now when it succeeded (the checks' only when they ran: ``checked``), else
    ``previous``'s (the file as it was; 0 when it had none)."""
    old = metrics.read_values(previous)
    last = {name: old.get(name, 0.0) for name in DEPLOY_METRICS[2:]}
    if success:
        last[DEPLOY_METRICS[2]] = now
        if checked:
            last[DEPLOY_METRICS[3]] = now
    samples: list[metrics.Sample] = [
        (DEPLOY_METRICS[0], {}, now),
        (DEPLOY_METRICS[1], {}, 1.0 if success else 0.0),
    ]
    samples += [(name, {}, value) for name, value in last.items()]
    return metrics.exposition(samples, writer=metrics.DEPLOY)


def write_status(
    pyinfra_host: object, sudo: dict[str, bool], path: str, success: bool, checked: bool
) -> str | None:
    """Read ``path`` on the host, write its new text whole (a temporary name, renamed), 0644:
    through the connection, so the operation yields no command. None when it was written,
    else why not."""
    run = pyinfra_host.run_shell_command  # type: ignore[attr-defined]
    _, out = run(f"cat {shlex.quote(path)} 2>/dev/null || true", print_output=False, **sudo)
    text = status_text("\n".join(out.stdout_lines), success, checked, time.time())
    q, tmp = shlex.quote, shlex.quote(f"{path}.tmp")
    command = (
        f"mkdir -p {q(path.rsplit('/', 1)[0])} && printf %s {q(text)} > {tmp} && "
        f"chmod 644 {tmp} && mv -f {tmp} {q(path)}"
    )
    ok, out = run(command, print_output=False, **sudo)
    return None if ok else ("; ".join(out.stderr_lines) or "failed")


def report_status(success: bool, checked: bool) -> None:
    """gpubox-deploy.prom written when the fleet is monitored; a failure to write is a
    warning, never the deploy's failure. Only while the run executes: pyinfra without -y runs
    the operation once while it plans too, before any stage changed the box."""
    if not host.state.is_executing or not box_metrics.monitored():
        return
    sudo = {"_sudo": True} if host.data.get("_sudo") else {}
    path = box_metrics.textfile(metrics.DEPLOY)
    why = write_status(host, sudo, path, success, checked)
    if why is not None:
        logger.warning(f"{host.name}: cannot write {path}: {why}")


@operation(is_idempotent=True)
def verify_host(inventory: str, check: bool = True):
    """Judge the host with the deploy's checks (when this operation executes); with ``check``
    false, only report the deploy's end to the monitoring."""
    if not check:
        report_status(True, checked=False)
        return
        yield ""
    config = current_config()
    sudo = {"_sudo": True} if host.data.get("_sudo") else {}
    batch = Batch(host, sudo)
    facts = checks.Facts(batch, config)
    chosen = deploy_checks()
    read_ahead(batch, facts, chosen, config)
    verdicts = checks.run(chosen, host.name, config, facts, inventory)
    failed = [v for v in verdicts if v.failed]
    passed = sum(v.status == "pass" for v in verdicts)
    report_status(not failed, checked=True)
    if failed:
        raise OperationError(
            f"{host.name}: {len(failed)} of {len(chosen)} quick checks failed after the "
            f"deploy:\n{failures(failed)}"
        )
    logger.info(
        f"{host.name}: {passed} quick checks passed, "
        f"{len(chosen) - passed} not applicable (verify_after_deploy)"
    )
    if False:  # a generator that yields nothing: no change
        yield ""


def inventory_argument(argv: list[str]) -> str:
    """The inventory as the user typed it (for the fixes printed): pyinfra's first
    positional argument ending in .py that is not under deploy/."""
    return next(
        (a for a in argv[1:] if a.endswith(".py") and not a.startswith(("-", "deploy/"))),
        "INVENTORY",
    )


def verify() -> None:
    """Add the check operation when the inventory asks for it (verify_after_deploy); without
    it, on a monitored fleet, the operation that reports the deploy's end."""
    if not current_config().verify_after_deploy:
        if box_metrics.monitored():
            verify_host(
                name="Report | the deploy's end, to the monitoring (gpubox-deploy.prom)",
                inventory=inventory_argument(sys.argv),
                check=False,
            )
        return
    verify_host(
        name="Check | the box passes the quick checks (verify_after_deploy)",
        inventory=inventory_argument(sys.argv),
    )
