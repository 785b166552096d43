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
from pyinfra.operations import server

from gpubox.base import layout
from gpubox.base.rendering import FILES, render
from gpubox.config import HostConfig
from gpubox.infra import operations
from gpubox.infra.host_facts import CommandOutput
from gpubox.infra.operations import ManagedFiles
from gpubox.ops import units
from gpubox.ops.apt_repo import apt_repo
from gpubox.ops.packages import install_pinned
from gpubox.preflight import answers
from gpubox.preflight import gate as preflight
from gpubox.stages import current_config
from gpubox.stages.docker import reload_docker

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
            layout.TOOLKIT_PIN: render(
                "apt-pin-exact.j2",
                what="the NVIDIA Container Toolkit",
                version=version,
                packages=packages,
            ),
            layout.DEV_CHAR_UDEV_RULE: (FILES / "71-gpubox-nvidia-dev-char.rules").read_text(),
        }
    )
    pin = managed.put("Pin the container toolkit to one version", layout.TOOLKIT_PIN)
    apt_repo(config, "nvidia_container_toolkit", target, "NVIDIA container toolkit", [pin])
    installed = install_pinned(
        f"Install the NVIDIA Container Toolkit {version}",
        packages,
        version,
        hold="Hold the container toolkit packages",
    )

    values, if_missing = runtime_settings(config)
    daemon = operations.json_file_merge(
        name="daemon.json: the nvidia runtime",
        path=layout.DAEMON_JSON,
        values=values,
        if_missing=if_missing,
    )
    # dockerd looks for nvidia-container-runtime-hook (its --gpus support) only when it starts.
    units.restart_on_change(
        layout.DOCKER, "Restart Docker (the toolkit was installed or changed)", installed
    )
    reload_docker(daemon, set(values) | set(if_missing), unless=installed)

    # Every value interpolated into a shell command is quoted: one word, whatever it holds.
    spec, version_word = shlex.quote(toolkit["cdi_spec"]), shlex.quote(config.driver_version)
    stamp_word = shlex.quote(layout.CDI_STAMP)
    stamp_dir = shlex.quote(posixpath.dirname(layout.CDI_STAMP))
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
    managed.put(
        "/dev/char symlinks for NVIDIA devices at every driver load", layout.DEV_CHAR_UDEV_RULE
    )
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
    answers.keep_answers()  # this run's answers, kept (only if they changed)
