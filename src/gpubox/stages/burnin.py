"""Stage: burn-in (only when asked: deploy/burnin.py, `gpubox burnin INVENTORY`).

gpu-burn on all GPUs for burnin_seconds, then `dcgmi diag -r burnin_dcgm_level`. gpu-burn
exits 0 even when a GPU is FAULTY, so its output is parsed: every GPU tested and OK. The
result, with its date, is recorded in /var/lib/gpubox/burnin.json for the host checks."""

from __future__ import annotations

import datetime
import io
import json
import shlex
from typing import Any

from pyinfra import logger
from pyinfra.api import FunctionCommand, OperationError, deploy, operation

from gpubox import parsers
from gpubox.base import layout
from gpubox.preflight import gate as preflight
from gpubox.stages import current_config


def judge(gpu_count: int, burn: Any, burn_rc: int, diag: Any | None) -> list[str]:
    """Every reason the burn-in failed, per GPU where it can say (pure)."""
    problems: list[str] = []
    if burn is None:
        problems.append(f"gpu-burn failed (exit status {burn_rc}) before reporting any GPU")
    else:
        if burn.tested != gpu_count:
            problems.append(f"gpu-burn tested {burn.tested} GPU(s), expected {gpu_count}")
        for index in range(gpu_count):
            status = burn.gpus.get(index)
            if status != "OK":
                problems.append(f"GPU {index}: gpu-burn says {status or 'nothing'}")
        # the parser's other reasons (aborted, a worker died, no progress ever reported, ...)
        problems += [
            p for p in burn.problems(gpu_count) if not p.startswith(("FAULTY", "gpu-burn tested"))
        ]
    if diag is None:
        problems.append("dcgmi diag gave no result")
    elif not diag.passed:
        for test in diag.tests:
            for gpu, status in sorted(test.results.items()):
                if status.lower() in ("fail", "failed", "error"):
                    why = "; ".join(test.messages)
                    problems.append(
                        f"GPU {gpu}: dcgmi diag test {test.name!r} {status}"
                        + (f": {why}" if why else "")
                    )
        if not any(p.startswith("GPU") and "dcgmi" in p for p in problems):
            problems.append("dcgmi diag did not pass")
    return problems


def gpu_burn_command(seconds: int, doubles: bool, tensor_cores: bool) -> str:
    flags = (["-d"] if doubles else []) + (["-tc"] if tensor_cores else [])
    return " ".join(["gpu-burn", *flags, str(seconds)])


@operation(is_idempotent=False)
def burn_in(gpu_count: int, seconds: int, doubles: bool, tensor_cores: bool, dcgm_level: int):
    """Run the burn-in and record it; fail with a per-GPU report."""

    def _run(state, host) -> None:
        sudo = {"_sudo": True} if host.data.get("_sudo") else {}
        started = datetime.datetime.now(datetime.UTC)
        command = gpu_burn_command(seconds, doubles, tensor_cores)
        logger.info(f"{host.name}: {command} (about {seconds}s), then dcgmi diag -r {dcgm_level}")
        _, output = host.run_shell_command(
            f'{command} 2>&1; echo "gpubox-exit=$?"',
            print_output=False,
            _timeout=seconds + 600,
            **sudo,
        )
        text = "\n".join(output.stdout_lines)
        rc = int(text.rsplit("gpubox-exit=", 1)[1].strip()) if "gpubox-exit=" in text else -1
        try:
            burn = parsers.parse_gpu_burn(text.rsplit("gpubox-exit=", 1)[0])
        except parsers.ParseError:
            burn = None
        _, output = host.run_shell_command(
            f"dcgmi diag -r {int(dcgm_level)} -j", print_output=False, _timeout=3600, **sudo
        )
        try:
            diag = parsers.parse_dcgmi_diag_json("\n".join(output.stdout_lines))
        except parsers.ParseError:
            diag = None
        problems = judge(gpu_count, burn, rc, diag)
        record = {
            "date": started.isoformat(timespec="seconds"),
            "passed": not problems,
            "gpu_count": gpu_count,
            "seconds": seconds,
            "command": command,
            "gpu_burn": {
                "exit_status": rc,
                "tested": burn.tested if burn else None,
                "gpus": {str(k): v for k, v in (burn.gpus if burn else {}).items()},
            },
            "dcgm_diag": {"level": dcgm_level, "passed": bool(diag and diag.passed)},
            "problems": problems,
        }
        host.run_shell_command(f"mkdir -p {shlex.quote(layout.STATE_DIR)}", **sudo)
        host.put_file(
            io.BytesIO((json.dumps(record, indent=2) + "\n").encode()), layout.BURNIN_RECORD, **sudo
        )
        if problems:
            raise OperationError(
                f"{host.name}: burn-in failed:\n  - "
                + "\n  - ".join(problems)
                + f"\n(recorded in {layout.BURNIN_RECORD})"
            )
        logger.info(f"{host.name}: burn-in passed on {gpu_count} GPU(s)")

    yield FunctionCommand(_run, (), {})


@deploy("Burn-in")
def burnin() -> None:
    config = current_config()
    preflight.run(config)
    burn_in(
        name=f"Burn-in: gpu-burn {config.burnin_seconds}s, dcgmi diag -r "
        f"{config.burnin_dcgm_level}",
        gpu_count=config.gpu_count,
        seconds=config.burnin_seconds,
        doubles=config.burnin_doubles,
        tensor_cores=config.burnin_tensor_cores,
        dcgm_level=config.burnin_dcgm_level,
    )
