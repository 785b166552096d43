"""The container images the sandbox builds inside a box, never pulled from a registry: the
host checks' image (busybox and python3 from the box's own Debian packages, enough to run the
stand-in nvidia-smi that the stand-in container toolkit mounts) and the stand-in
dcgm-exporter (one layer on it: the stand-in program, the recorded metrics of
``packages/dcgm-exporter`` and the product's own ``exporter_label.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpubox.knowledge import exporter_label
from gpubox.sandbox import repo_debs
from gpubox.sandbox.box_ssh import ssh
from gpubox.sandbox.common import SandboxError, SandboxNotUp
from gpubox.sandbox.processes import box_info, box_infos
from gpubox.sandbox.rootfs import Progress, stderr_progress

# The container image the host checks run in the box (load_check_image), never from a registry.
CHECK_IMAGE = "gpubox.local/check:1"
# The stand-in dcgm-exporter (load_exporter_image): one layer on the check image, never pulled;
# inventories/sandbox.py names it in catalog_overrides' dcgm.exporter_image, as a mirror would.
EXPORTER_IMAGE = "gpubox.local/dcgm-exporter:4.4.1-4.6.0-standin"


def load_check_image(info: dict[str, Any] | None = None) -> str:
    """The container image for the host checks, built in the box and loaded into its Docker
    (once; quick when it is there): busybox and python3 from the box's own Debian packages,
    enough to run the stand-in nvidia-smi that the stand-in container toolkit mounts. Needs
    Docker installed in the box. Returns the image name (box.json ``check_image``)."""
    info = info or box_info()
    name = info.get("check_image", CHECK_IMAGE)
    script = (repo_debs.PACKAGES_DIR / "check-image" / "build-check-image").read_text()
    result = ssh(["python3", "-", name], check=False, timeout=600, info=info, input=script)
    if result.returncode != 0 or result.stdout.strip().splitlines()[-1:] != [name]:
        raise SandboxError(
            f"could not build the check image {name} in the box (exit {result.returncode}):\n"
            f"{result.stderr}{result.stdout}"
        )
    return name


def load_exporter_image(info: dict[str, Any] | None = None) -> str:
    """The stand-in dcgm-exporter image, built in the box on the check image (loaded first)
    and loaded into its Docker (once; quick when it is there): the stand-in program and the
    recorded metrics of ``packages/dcgm-exporter``, and the product's own ``exporter_label.py``
    (the Hostname rule, written once). Returns the image name (box.json ``exporter_image``)."""
    info = info or box_info()
    name = info.get("exporter_image", EXPORTER_IMAGE)
    check = load_check_image(info)
    here = repo_debs.PACKAGES_DIR / "dcgm-exporter"
    files = {
        "dcgm-exporter": (here / "dcgm-exporter").read_text(),
        "metrics.prom": (here / "metrics.prom").read_text(),
        "exporter_label.py": Path(exporter_label.__file__).read_text(),
    }
    script = f"FILES = {json.dumps(files)}\n" + (here / "build-exporter-image").read_text()
    result = ssh(["python3", "-", name, check], check=False, timeout=300, info=info, input=script)
    if result.returncode != 0 or result.stdout.strip().splitlines()[-1:] != [name]:
        raise SandboxError(
            f"could not build the stand-in exporter image {name} in the box "
            f"(exit {result.returncode}):\n{result.stderr}{result.stdout}"
        )
    return name


def load_check_images(
    progress: Progress = stderr_progress,
) -> list[tuple[dict[str, Any], str | SandboxError]]:
    """load_check_image in every box that is up, box 1 first: (its box.json, the image's name
    or why it could not be loaded there). A box that fails does not keep the others from
    theirs. Raises SandboxNotUp when no box is up."""
    infos = box_infos()
    if not infos:
        raise SandboxNotUp("sandbox is not up: run gpubox sandbox up")
    results: list[tuple[dict[str, Any], str | SandboxError]] = []
    for info in infos:
        try:
            image = load_check_image(info)
        except SandboxError as exc:
            results.append((info, exc))  # the caller says why
        else:
            results.append((info, image))
            progress(f"{info['name']}: check image {image} loaded")
    return results
