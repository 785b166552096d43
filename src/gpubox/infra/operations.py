"""pyinfra operations that upstream lacks. Like pyinfra's own, each reads the host only
through facts and yields nothing (a noop) when the host is already as asked. ``ManagedFiles``:
a stage's (or the dpkg wait's) small files, read in one fact and uploaded only when they
differ."""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import time
from collections.abc import Iterator
from typing import Any

from gevent import sleep
from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, OperationError, StringCommand, operation
from pyinfra.api.command import PyinfraCommand
from pyinfra.operations import files

from gpubox.base import layout
from gpubox.base.rendering import as_file
from gpubox.infra.host_facts import (
    AptComponentEnabled,
    BootId,
    FileDigests,
    HeldPackages,
    JsonFile,
    KeyringFingerprints,
    MissingPackageFiles,
    RealPath,
)


@operation()
def apt_keyring(url: str, dest: str, fingerprint: str):
    """Install the key at ``url`` as an apt keyring at ``dest``, only if its fingerprint is the
    one the catalog pins. Never apt-key: sources name the keyring with ``signed-by``."""
    fingerprint = fingerprint.replace(" ", "").upper()
    if fingerprint in host.get_fact(KeyringFingerprints, path=dest):
        host.noop(f"keyring {dest} holds {fingerprint}")
        return
    q = shlex.quote
    yield StringCommand(
        "set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
        f'curl -fsSL --retry 3 -o "$t/key" {q(url)}; '
        "if grep -q -- '-----BEGIN PGP' \"$t/key\"; then "
        'gpg --homedir "$t" --batch --dearmor -o "$t/key.gpg" "$t/key"; '
        'else cp "$t/key" "$t/key.gpg"; fi; '
        'got=$(gpg --homedir "$t" --batch --show-keys --with-colons "$t/key.gpg" '
        "| awk -F: '$1==\"fpr\"{print $10}'); "
        f'if ! echo "$got" | grep -qix {q(fingerprint)}; then '
        f'echo "gpubox: key from {url} has fingerprint(s) $got, the catalog pins '
        f'{fingerprint}; refusing it" >&2; exit 1; fi; '
        f'install -m 0644 "$t/key.gpg" {q(dest)}'
    )


@operation()
def apt_hold(packages: list[str]):
    """apt-mark hold the packages (that are not held yet)."""
    held = host.get_fact(HeldPackages)
    missing = [name for name in packages if name not in held]
    if not missing:
        host.noop("packages already held")
        return
    yield "apt-mark hold " + " ".join(shlex.quote(name) for name in missing)


@operation()
def apt_enable_component(component: str):
    """Enable an archive component (Debian's contrib) on every source line of the distro's
    mirror, one-line and deb822 alike."""
    if host.get_fact(AptComponentEnabled, component=component):
        host.noop(f"{component} is enabled")
        return
    c = shlex.quote(component)
    yield StringCommand(
        'for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do [ -f "$f" ] && '
        f"sed -i -E '/^deb(-src)? /{{/ {c}( |$)/!s/ main( |$)/ main {c}\\1/}}' \"$f\"; done; "
        'for f in /etc/apt/sources.list.d/*.sources; do [ -f "$f" ] && '
        f"sed -i -E '/^Components:/{{/ {c}( |$)/!s/ main( |$)/ main {c}\\1/}}' \"$f\"; done; true"
    )


@operation()
def cuda_symlink(prefix: str, link: str = layout.USR_LOCAL_CUDA):
    """Point /usr/local/cuda at ``prefix`` (through update-alternatives when the toolkit
    registered it, as NVIDIA's packages do)."""
    if host.get_fact(RealPath, path=link) == prefix:
        host.noop(f"{link} -> {prefix}")
        return
    p = shlex.quote(prefix)
    yield (
        f"if update-alternatives --list cuda 2>/dev/null | grep -qx {p}; then "
        f"update-alternatives --set cuda {p}; else ln -sfn {p} {shlex.quote(link)}; fi"
    )


@operation(is_idempotent=False)
def fail(message: str):
    """Stop this host's deploy here with ``message`` (after the operations before it ran): a
    command that prints it on stderr and exits 1, so pyinfra shows the message as the host's
    error (a Python exception here would show as a traceback)."""
    yield f"printf '%s\\n' {shlex.quote(message)} >&2; exit 1"


@operation(is_idempotent=False)
def reboot_and_wait(reason: str, timeout: int = 900, interval: float = 2.0):
    """Reboot and wait until the host is back with a new boot id.

    pyinfra's server.reboot compares uptimes, which a container (the sandbox) shares with its
    host; the kernel's boot id is new after every boot, containers included."""
    yield from reboot_commands(reason, timeout, interval)


def reboot_commands(
    reason: str, timeout: int = 900, interval: float = 2.0
) -> Iterator[PyinfraCommand]:
    """reboot_and_wait's commands, for another operation to reboot the host and wait for it
    (gpubox.infra.driver_rollback): the boot id read, the reboot, the wait for a new one (an
    OperationError after ``timeout`` seconds)."""
    before: list[str] = []

    def _boot_id(state, host) -> None:
        before.append(host.get_fact(BootId))

    yield FunctionCommand(_boot_id, (), {})
    logger.info(f"{host.name}: rebooting: {reason}")
    yield StringCommand("( sleep 1 && systemctl reboot ) </dev/null >/dev/null 2>&1 &")

    def _wait(state, host) -> None:
        sleep(3)
        host.disconnect()
        start = time.monotonic()
        last_note = start
        while True:
            waited = time.monotonic() - start
            if waited > timeout:
                raise OperationError(
                    f"{host.name} did not come back within {timeout}s of the reboot "
                    "(reboot_timeout); check its console"
                )
            host.connect(show_errors=False)
            if host.connected:
                status, output = host.run_shell_command(
                    "cat /proc/sys/kernel/random/boot_id; systemctl is-system-running --wait",
                    print_output=False,
                )
                lines = output.stdout_lines
                if lines and lines[0].strip() not in before:
                    logger.info(f"{host.name}: back after {waited:.0f}s ({lines[-1].strip()})")
                    return
                host.disconnect()
            if time.monotonic() - last_note > 15:
                logger.info(f"{host.name}: waiting for the reboot ({waited:.0f}s)")
                last_note = time.monotonic()
            sleep(interval)

    yield FunctionCommand(_wait, (), {})


def merge_json(current: dict[str, Any], values: dict[str, Any], overwrite: bool) -> dict[str, Any]:
    """``values`` merged into a copy of ``current``, dicts recursively; every key of
    ``current`` that ``values`` does not name is kept. With ``overwrite`` false a leaf is set
    only where ``current`` has none."""
    merged = dict(current)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_json(merged[key], value, overwrite)
        elif overwrite or key not in merged:
            merged[key] = value
    return merged


@operation()
def json_file_merge(
    path: str, values: dict[str, Any] | None = None, if_missing: dict[str, Any] | None = None
):
    """Merge keys into a JSON file (e.g. /etc/docker/daemon.json) that other tools share:
    read it first, keep every key gpubox does not set, write only when something changes.
    An invalid file is an error, never silently replaced."""
    state = host.get_fact(JsonFile, path=path)
    if state["error"]:
        raise OperationError(
            f"{path} is not valid JSON ({state['error']}); gpubox will not replace it: "
            "fix or remove it, then deploy again"
        )
    current = state["data"] or {}
    merged = merge_json(merge_json(current, values or {}, True), if_missing or {}, False)
    if state["exists"] and merged == current:
        host.noop(f"{path} already holds these settings")
        return
    content = json.dumps(merged, indent=4, sort_keys=False) + "\n"
    yield from files.put._inner(src=io.StringIO(content), dest=path, mode="0644")


@operation()
def reinstall(packages: list[str] | None = None, paths: list[str] | None = None):
    """Reinstall, at its installed version (the pinned one on a converged host), each
    installed package of ``packages``, or owning one of ``paths``, that misses a file it ships
    (say nvcc was deleted): apt still counts such a package installed, so a plain install
    would not bring the file back. Existence only (gpubox.infra.host_facts.MissingPackageFiles); a
    noop
    when every file is there. A deleted conffile comes back too (--force-confmiss); a changed
    one is kept."""
    missing = host.get_fact(
        MissingPackageFiles, packages=tuple(packages or ()), paths=tuple(paths or ())
    )
    if not missing:
        host.noop("every file of the packages is there")
        return
    pins: dict[str, str] = {}
    for package, version, _ in missing:
        pins.setdefault(package, version)
    shown = ", ".join(path for _, _, path in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    if state.is_executing:
        logger.warning(
            f"{host.name}: missing {shown}{more}: reinstalling "
            + ", ".join(f"{name} {version}" for name, version in pins.items())
        )
    yield StringCommand(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --reinstall "
        "--no-install-recommends -o Dpkg::Options::=--force-confdef "
        "-o Dpkg::Options::=--force-confold -o Dpkg::Options::=--force-confmiss "
        + " ".join(shlex.quote(f"{name}={version}") for name, version in pins.items())
    )


class _Unchanged:
    """What a managed file that needs no operation reports to `_if` conditions."""

    @staticmethod
    def did_change() -> bool:
        return False


class ManagedFiles:
    """A stage's small managed files (content rendered here), checked in one fact; an upload
    operation is added only for a file whose content or mode differs."""

    def __init__(self, files: dict[str, str], mode: str = "0644"):
        self.files = files
        self.mode = mode
        self.current = host.get_fact(FileDigests, paths=tuple(sorted(files)))

    def differs(self, dest: str) -> bool:
        """Whether the box's file differs (content or mode): `put` will upload it."""
        content = self.files[dest]
        want = (self.mode.lstrip("0") or "0", hashlib.sha256(content.encode()).hexdigest())
        return self.current.get(dest) != want

    def put(self, name: str, dest: str) -> Any:
        if not self.differs(dest):
            return _Unchanged()
        return files.put(name=name, src=as_file(self.files[dest]), dest=dest, mode=self.mode)
