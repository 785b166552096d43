"""The end of deploy/full.py: the quick checks of gpubox.checks, run on the box once it has
converged (inventory key ``verify_after_deploy``, on by default).

The same checks as ``pytest tests/host -m quick`` and doctor, less the burn-in record (burn-in
is its own run: deploy/burnin.py) and any that act on the box. The operation reads the facts
when it executes (after every stage), yields no command, so a converged box reports no
change; a failed check fails the host, naming each check, what it found and its fix."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import OperationError, operation

from gpubox import checks

RC_MARK = "@@gpubox-rc="


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


def failures(verdicts: list[checks.Verdict]) -> str:
    return "\n".join(f"  [{v.check}] {v.message}\n      fix: {v.fix}" for v in verdicts)


@operation(is_idempotent=True)
def verify_host(inventory: str):
    """Judge the host with the deploy's checks (when this operation executes)."""
    from gpubox.stages import current_config

    config = current_config()
    sudo = {"_sudo": True} if host.data.get("_sudo") else {}
    facts = checks.Facts(runner(host, sudo), config)
    chosen = deploy_checks()
    verdicts = checks.run(chosen, host.name, config, facts, inventory)
    failed = [v for v in verdicts if v.failed]
    passed = sum(v.status == "pass" for v in verdicts)
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
    """Add the check operation when the inventory asks for it (verify_after_deploy)."""
    import sys

    from gpubox.stages import current_config

    if not current_config().verify_after_deploy:
        return
    verify_host(
        name="Check | the box passes the quick checks (verify_after_deploy)",
        inventory=inventory_argument(sys.argv),
    )
