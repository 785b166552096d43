"""What both API backends (gpubox.stages.llamacpp, gpubox.stages.vllm) need to serve: the API
key, the other backend's unit stopped, the unit (re)started only when it is not running or
something it serves changed, and a wait for its /health."""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, operation
from pyinfra.operations import server, systemd

from gpubox.config import HostConfig
from gpubox.infra.host_facts import CommandOutput
from gpubox.knowledge import reads
from gpubox.ops import units


@operation(is_idempotent=False)
def wait_for_health(port: int, unit: str, timeout: int):
    """Wait until the API answers /health with 200 (model loading takes minutes)."""

    def _wait(state, host) -> None:
        import time

        from gevent import sleep

        start = time.monotonic()
        last = start
        while time.monotonic() - start < timeout:
            _, out = host.run_shell_command(
                f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health || true"
            )
            code = "".join(out.stdout_lines).strip()
            if code == "200":
                logger.info(f"{host.name}: {unit} healthy after {time.monotonic() - start:.0f}s")
                return
            if time.monotonic() - last > 15:
                logger.info(
                    f"{host.name}: waiting for {unit} (/health {code or 'no answer'}, "
                    f"{time.monotonic() - start:.0f}s)"
                )
                last = time.monotonic()
            sleep(1)
        _, out = host.run_shell_command(f"journalctl -u {unit} -n 30 --no-pager")
        raise OperationError(
            f"{unit} did not answer /health within {timeout}s (health_timeout); its last log "
            "lines:\n" + "\n".join(out.stdout_lines)
        )

    yield FunctionCommand(_wait, (), {})


def api_key(config: HostConfig):
    """A key generated on the box at the first deploy, root-only; never in the repository."""
    q = shlex.quote(config.api_key_file)
    present = host.get_fact(CommandOutput, command=f"test -s {q} && echo yes").strip()
    if present == "yes":
        return None
    return server.shell(
        name=f"Generate the API key ({config.api_key_file}, root only)",
        commands=[
            f"mkdir -p $(dirname {q}) && umask 077 && "
            f"head -c 32 /dev/urandom | base64 | tr -d '/+=\\n' > {q} && chmod 600 {q}"
        ],
    )


def stop_other(unit: str) -> None:
    """Stop and disable the unit of a backend that is not configured, where it is installed."""
    present = host.get_fact(
        CommandOutput, command=f"systemctl list-unit-files {unit}.service --no-legend"
    ).strip()
    if present:
        systemd.service(
            name=f"Stop and disable {unit} (another backend is configured)",
            service=unit,
            running=False,
            enabled=False,
        )


def is_running(unit: str) -> bool:
    """Whether ``unit`` is active now (a fact, read at plan time)."""
    out = host.get_fact(CommandOutput, command=reads.UNIT_STATES.command_for(unit))
    return reads.UNIT_STATES.parse(out).get(unit, {}).get("ActiveState") == "active"


def start(
    config: HostConfig,
    unit: str,
    label: str,
    unit_file: Any,
    *changes: Any,
    running: bool,
    restart_name: str,
    health_name: str,
) -> None:
    """The backend's unit: systemd reloaded when ``unit_file`` changed, the unit enabled,
    (re)started (``restart_name``: the operation's name) when it is not ``running`` or when
    ``unit_file`` or any of ``changes`` changed, and then waited for until its API answers
    /health (``health_name``: the operation's name)."""
    units.reload_units(unit_file, label=label)
    systemd.service(name=f"{label} enabled", service=unit, enabled=True)
    units.restart_on_change(unit, restart_name, unit_file, *changes, stopped=not running)
    wait_for_health(
        name=health_name,
        port=config.api_port,
        unit=unit,
        timeout=config.health_timeout,
        _if=units.changed(unit_file, *changes, stopped=not running),
    )
