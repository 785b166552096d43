"""The vLLM image (catalog ``vllm.image``, 10-13 GB compressed) pulled in the background: a
systemd unit (gpubox-vllm-pull) running ``docker pull``, started by the stage
``vllm_image_pull`` right after the container toolkit's stage, and waited for by the vLLM
stage before it needs the image (a long step with the host's received bytes and rate).

Why after the container toolkit, not after Docker: that stage restarts Docker when it
installs the toolkit (dockerd reads the NVIDIA runtime only when it starts), and a restart
of the daemon aborts a pull in flight. Why not enabled (unlike the model's download unit):
the driver's reboot comes before Docker is installed, so no reboot interrupts it within a
deploy; a deploy that finds the image absent starts the unit again. A pull resumes at layer
granularity: Docker keeps the layers it finished, and fetches a layer cut short again. The
unit retries a failed pull (ATTEMPTS times); the wait fails with the unit's journal lines.
The pull itself runs in dockerd, so the unit's low priority covers only the docker client:
the gain is the overlap with the stages that follow (and the checkpoint's download)."""

from __future__ import annotations

import re
import shlex

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import systemd

from gpubox.base import layout
from gpubox.config import HostConfig
from gpubox.infra import progress
from gpubox.infra.host_facts import CommandOutput
from gpubox.infra.operations import ManagedFiles
from gpubox.ops import units
from gpubox.plans import model_script
from gpubox.preflight import gate as preflight
from gpubox.stages import current_config

UNIT = "gpubox-vllm-pull"
UNIT_FILE = layout.unit_file(UNIT)
ATTEMPTS = 3
RETRY_S = 10
# an image reference as docker takes it; nothing systemd or the shell would read otherwise
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")


def present_command(image: str) -> str:
    """The fact: the image's ID when Docker has it (nothing otherwise, Docker absent too)."""
    return f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}"


def unit_text(image: str) -> str:
    """The pull unit: ``docker pull`` tried ATTEMPTS times, RETRY_S apart; after Docker;
    low priority (the client only: dockerd pulls); not enabled, not restarted by systemd."""
    if not _IMAGE.fullmatch(image):
        raise ValueError(f"vllm.image {image!r} is not an image reference")
    pull = (
        f"for i in {' '.join(str(i) for i in range(1, ATTEMPTS + 1))}; do "
        f"docker pull {image} && exit 0; "
        f"echo gpubox: the pull of {image} failed, again in {RETRY_S} s; sleep {RETRY_S}; "
        "done; exit 1"
    )
    return (
        "# gpubox: the vLLM image pulled in the background (docs/models.md)\n"
        "[Unit]\n"
        f"Description=gpubox: pull {image}\n"
        "Requires=docker.service\n"
        "After=docker.service network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=exec\n"
        f'ExecStart=/bin/sh -c "{pull}"\n'
        "Nice=19\n"
        "CPUSchedulingPolicy=batch\n"
        "IOSchedulingClass=best-effort\n"
        "IOSchedulingPriority=7\n"
        "Restart=no\n"
    )


def wait_command(image: str) -> str:
    """The vLLM stage's wait for the pull unit: done when Docker has the image."""
    return model_script.wait_for(
        present_command(image) + " >/dev/null 2>&1",
        f"{image} pulled",
        f"{image} pulled",
        unit=UNIT,
        what="image pull",
    )


# per pyinfra state and host: whether this run started the pull (None: the image is there)
_begun: dict[object, dict[str, bool]] = {}


def begin_pull(config: HostConfig) -> bool:
    """Start the pull once per run when Docker lacks the image (the unit written, reloaded,
    started; restarted when the unit changed). Whether the image is to be waited for."""
    done = _begun.setdefault(host.state, {})
    if host.name in done:
        return done[host.name]
    image = config.catalog["vllm"]["image"]
    present = host.get_fact(CommandOutput, command=present_command(image)).strip()
    if present:
        done[host.name] = False
        return False
    unit_op = ManagedFiles({UNIT_FILE: unit_text(image)}).put(f"Unit {UNIT}", UNIT_FILE)
    units.reload_units(unit_op, label="vLLM image pull")
    logger.info(f"{host.name}: pulling {image} in the background ({UNIT})")
    start = systemd.service(
        name=f"Start {UNIT} (pull {image} in the background)",
        service=f"{UNIT}.service",
        running=True,
    )
    units.restart_on_change(
        f"{UNIT}.service", f"Restart {UNIT} with its new unit", unit_op, unless=start
    )
    done[host.name] = True
    return True


def wait_for_pull(config: HostConfig) -> None:
    """In the vLLM stage: start the pull when no earlier stage did, then wait for it."""
    if not begin_pull(config):
        return
    image = config.catalog["vllm"]["image"]
    progress.long_step(
        name=f"Pull {image} (once, in the background: wait for {UNIT})",
        command=wait_command(image),
        probe=progress.docker_pull_probe(image),
    )


@deploy("vLLM image pull")
def vllm_image_pull():
    """The stage after the container toolkit's: the vLLM image's pull started in the
    background (the vLLM backend only)."""
    config = current_config()
    preflight.run(config)
    if config.backend == "vllm":
        begin_pull(config)
