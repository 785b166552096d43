"""`make demo`: build (or reuse) the sandbox box, boot it, converge it with deploy/full.py,
verify it with the host checks, and print a short summary. The deploy's output shows line by
line as it runs (a long step's progress lines included), the summary at the end.

The helpers here (deploy, checks) are what the integration tests and the benchmark use too:
pyinfra and pytest run exactly as a user types them, inside the sandbox's network namespace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO
from xml.etree import ElementTree

from gpubox import sandbox as sandbox_package  # `sandbox` below runs `gpubox sandbox`

ROOT = Path(__file__).resolve().parents[3]
INVENTORY = "inventories/sandbox.py"
BIN = Path(sys.executable).parent


def sandbox(
    *args: str, check: bool = True, quiet: bool = False
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "gpubox"), "sandbox", *args],
        cwd=ROOT,
        check=check,
        text=True,
        capture_output=quiet,
    )


def in_netns(argv: list[str]) -> list[str]:
    """A host command run inside the sandbox's network namespace (where the box is)."""
    return [str(BIN / "gpubox"), "sandbox", "exec", "--", *argv]


@dataclass
class DeployRun:
    rc: int
    seconds: float
    operations: int = 0  # operations planned (all hosts)
    changed: int = 0  # operations that changed something
    errors: int = 0
    failed_hosts: list[str] = field(default_factory=list)
    changed_names: list[str] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)  # the @deploy names, in order
    output: str = ""

    @property
    def no_change(self) -> bool:
        return self.rc == 0 and self.changed == 0 and self.errors == 0 and not self.failed_hosts


def stream(
    argv: list[str], echo: TextIO | None = None, merged: bool = False
) -> tuple[int, str, str]:
    """Run ``argv`` in the checkout; each line it writes to stderr (to either, ``merged``) is
    copied to ``echo`` (sys.stderr by default) as it comes, not after the end. Returns the exit
    status, stdout (kept in a temporary file meanwhile: pyinfra --json writes its report
    there; empty when ``merged``) and stderr (both, ``merged``)."""
    echo = echo or sys.stderr
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8") as out:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            text=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if merged else out,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            bufsize=1,
            errors="replace",
        )
        shown = proc.stdout if merged else proc.stderr
        assert shown is not None
        for line in shown:
            lines.append(line)
            echo.write(line)
            echo.flush()
        rc = proc.wait()
        out.seek(0)
        return rc, out.read(), "".join(lines)


def deploy(
    deploy_file: str = "deploy/full.py", inventory: str = INVENTORY, extra: tuple[str, ...] = ()
) -> DeployRun:
    """pyinfra as a user types it; its output shows as it runs (long steps print a progress
    line every 10 s), the summary comes from its --json report."""
    argv = in_netns([str(BIN / "pyinfra"), "-y", "--json", *extra, inventory, deploy_file])
    start = time.monotonic()
    rc, stdout, stderr = stream(argv)
    run = DeployRun(rc, time.monotonic() - start, output=stderr)
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError:
        sys.stderr.write(stdout)
        run.output += stdout
        return run
    results = data.get("results", {})
    for op in results.get("operations", []):
        run.operations += 1
        stage = op.get("name", "").split(" | ")[0] if " | " in op.get("name", "") else ""
        if stage and stage not in run.stages:
            run.stages.append(stage)
        if op.get("success"):
            run.changed += 1
            run.changed_names.append(op.get("name", "?"))
        run.errors += len(op.get("error", []))
    run.failed_hosts = list(results.get("failed_hosts", []))
    return run


def burnin(inventory: str = INVENTORY) -> DeployRun:
    """`gpubox burnin INVENTORY`, as a user types it."""
    argv = in_netns([str(BIN / "gpubox"), "burnin", inventory])
    start = time.monotonic()
    rc, _, output = stream(argv, merged=True)
    return DeployRun(rc, time.monotonic() - start, output=output)


def box_info() -> dict:
    """The running sandbox box's facts (box.json)."""
    return dict(sandbox_package.box_info())


def load_check_image() -> str:
    """The image the host checks start GPU containers from: imported into the box's Docker
    from a local root filesystem (the sandbox reaches no registry)."""
    return sandbox_package.load_check_image()


@dataclass
class CheckRun:
    rc: int
    passed: int
    failed: int
    skipped: int
    output: str
    failures: dict[str, str] = field(default_factory=dict)  # check id -> failure message
    # host -> check id -> failure message (an inventory of several hosts)
    by_host: dict[str, dict[str, str]] = field(default_factory=dict)
    hosts: set[str] = field(default_factory=set)  # every host a test ran for


def check_id(test_name: str) -> str:
    """The check of a host-check test: ``test_check[HOST:CHECK]`` -> ``CHECK``."""
    return host_and_check(test_name)[1]


def host_and_check(test_name: str) -> tuple[str, str]:
    """``test_check[HOST:CHECK]`` -> (HOST, CHECK); ("", name) for another test."""
    if "[" not in test_name:
        return "", test_name
    host, _, check = test_name.split("[", 1)[1].rstrip("]").rpartition(":")
    return host, check


def checks(inventory: str = INVENTORY, extra: tuple[str, ...] = ()) -> CheckRun:
    """Run the host checks; results come from pytest's JUnit XML, not its terminal output."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        argv = in_netns(
            [
                str(BIN / "pytest"),
                "tests/host",
                "--inventory",
                inventory,
                "-q",
                "-rfE",
                "-p",
                "no:cacheprovider",
                f"--junitxml={report}",
                *extra,
            ]
        )
        proc = subprocess.run(argv, cwd=ROOT, text=True, capture_output=True)
        run = CheckRun(proc.returncode, 0, 0, 0, proc.stdout + proc.stderr)
        if not report.exists():
            return run
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            host, name = host_and_check(case.get("name", "?"))
            run.hosts.add(host)
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            if problem is not None:
                run.failed += 1
                message = problem.get("message", "") + "\n" + (problem.text or "")
                run.failures[name] = message
                run.by_host.setdefault(host, {})[name] = message
            elif case.find("skipped") is not None:
                run.skipped += 1
            else:
                run.passed += 1
    return run


def main() -> int:
    start = time.monotonic()
    if not (ROOT / "deploy" / "full.py").is_file():
        print(
            "gpubox demo runs from a gpubox checkout (make demo): it needs deploy/, inventories/ "
            f"and tests/host beside the package, and {ROOT} has none",
            file=sys.stderr,
        )
        return 2
    if sandbox("status", check=False, quiet=True).returncode == 0:
        print("== gpubox demo: reusing the sandbox box that is up (make demo-down stops it)")
    else:
        print(
            "== gpubox demo: sandbox box up (the root filesystem and the downloads are cached "
            "after a first run)",
            flush=True,
        )
        sandbox("up")
    print("== deploy/full.py against the sandbox box", flush=True)
    run = deploy()
    if run.rc != 0 or run.failed_hosts:
        # its output was shown as it ran, the error included
        print(f"deploy failed (rc {run.rc}); the box is still up: gpubox sandbox ssh", flush=True)
        return 1
    print(f"== container image for the checks: {load_check_image()}", flush=True)
    print("== host checks (pytest tests/host --inventory inventories/sandbox.py)", flush=True)
    result = checks()
    print(result.output)
    print("== summary")
    print(f"  stages:  {', '.join(run.stages) or 'none'} converged")
    print(
        f"  deploy:  {run.operations} operations, {run.changed} changed, {run.seconds:.1f}s"
        + ("  (converged: nothing to change)" if run.no_change else "")
    )
    print(f"  checks:  {result.passed} passed, {result.failed} failed, {result.skipped} skipped")
    print(f"  total:   {time.monotonic() - start:.1f}s")
    print("  look:    gpubox sandbox ssh -- nvidia-smi   |   stop it: make demo-down")
    return 0 if result.rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
