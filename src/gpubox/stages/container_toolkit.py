"""Stage: the NVIDIA Container Toolkit for Docker.

NVIDIA's libnvidia-container repository (signed-by keyring, fingerprint pinned), its four
packages at one catalog version (pinned, held), the `nvidia` runtime registered in
daemon.json only when it lacks one (merged: every other key kept), Docker reloaded only when
daemon.json changed, a CDI spec regenerated when the driver version changes, and the
/dev/char symlinks that keep containers' GPUs across `systemctl daemon-reload`.
"""

from __future__ import annotations

import posixpath
import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from gpubox import operations, preflight
from gpubox.config import HostConfig
from gpubox.facts import CommandOutput
from gpubox.stages import FILES, ManagedFiles, current_config, render
from gpubox.stages.apt_repo import apt_repo
from gpubox.stages.docker import DAEMON_JSON, reload_docker

PIN_FILE = "/etc/apt/preferences.d/90-gpubox-nvidia-container-toolkit"
UDEV_RULE = "/etc/udev/rules.d/71-gpubox-nvidia-dev-char.rules"
CDI_STAMP = "/var/lib/gpubox/cdi-driver-version"
# What nvidia-ctk runtime configure writes.
NVIDIA_RUNTIME = {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}


def runtime_settings(config: HostConfig) -> tuple[dict, dict]:
    """(keys gpubox sets, keys it sets only where daemon.json has none)."""
    values = {"default-runtime": "nvidia"} if config.docker_default_runtime_nvidia else {}
    return values, NVIDIA_RUNTIME


@deploy("NVIDIA Container Toolkit")
def container_toolkit() -> None:
    config = current_config()
    target = preflight.run(config)
    toolkit = config.catalog["container_toolkit"]
    packages, version = toolkit["packages"], toolkit["version"]

    managed = ManagedFiles(
        {
            PIN_FILE: render(
                "apt-pin-exact.j2",
                what="the NVIDIA Container Toolkit",
                version=version,
                packages=packages,
            ),
            UDEV_RULE: (FILES / "71-gpubox-nvidia-dev-char.rules").read_text(),
        }
    )
    pin = managed.put("Pin the container toolkit to one version", PIN_FILE)
    apt_repo(config, "nvidia_container_toolkit", target, "NVIDIA container toolkit", [pin])
    installed = apt.packages(
        name=f"Install the NVIDIA Container Toolkit {version}",
        packages=[f"{name}={version}" for name in packages],
        allow_downgrades=True,
        extra_install_args="--allow-change-held-packages",
    )
    operations.apt_hold(name="Hold the container toolkit packages", packages=packages)

    values, if_missing = runtime_settings(config)
    daemon = operations.json_file_merge(
        name="daemon.json: the nvidia runtime",
        path=DAEMON_JSON,
        values=values,
        if_missing=if_missing,
    )
    # dockerd looks for nvidia-container-runtime-hook (its --gpus support) only when it starts.
    systemd.service(
        name="Restart Docker (the toolkit was installed or changed)",
        service="docker",
        restarted=True,
        _if=installed.did_change,
    )
    reload_docker(daemon, set(values) | set(if_missing), unless=installed)

    # Every value interpolated into a shell command is quoted: one word, whatever it holds.
    spec, version_word = shlex.quote(toolkit["cdi_spec"]), shlex.quote(config.driver_version)
    stamp_word, stamp_dir = shlex.quote(CDI_STAMP), shlex.quote(posixpath.dirname(CDI_STAMP))
    stamp = host.get_fact(
        CommandOutput, command=f"cat {stamp_word} {spec} >/dev/null && cat {stamp_word}"
    ).strip()
    if stamp != config.driver_version:
        server.shell(
            name=f"CDI spec for driver {config.driver_version}",
            commands=[
                f"nvidia-ctk cdi generate --output={spec}",
                f"mkdir -p {stamp_dir} && printf '%s\\n' {version_word} > {stamp_word}",
            ],
        )
    managed.put("/dev/char symlinks for NVIDIA devices at every driver load", UDEV_RULE)
    links = host.get_fact(
        CommandOutput,
        command='for d in /dev/nvidia[0-9]* /dev/nvidiactl; do [ -c "$d" ] || continue; '
        'l=/dev/char/$((0x$(stat -c %t "$d"))):$((0x$(stat -c %T "$d"))); '
        '[ -e "$l" ] || echo missing; done',
    )
    if "missing" in links:
        server.shell(
            name="Create the /dev/char symlinks now",
            commands=["nvidia-ctk system create-dev-char-symlinks --create-all"],
        )
