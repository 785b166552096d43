"""Layer 11, entry points: gpubox sandbox, a local stand-in box to try gpubox on.

The sandbox: a local stand-in box to try and test gpubox on.

A Debian 12 systemd host in systemd-nspawn, in its own network namespace, reached over SSH
like any other host, plus a stand-in NVIDIA apt repository and stand-in GPUs, the catalog's
llama.cpp source on a PyPI stand-in (llamacpp.py), a tiny GGUF model (tinymodel.py)
and a compiler cache that outlives the box. Nothing here is ever shipped to a real box, and
no stage knows the sandbox exists: inventories/sandbox.py turns ``box_info()`` into ordinary
host data. Up to four boxes run at once; ``box.py`` ties the parts together (its docstring
names them).

    gpubox sandbox up | down | status | ssh -- CMD | exec -- CMD | fault NAME | mok-screen | image
"""

from gpubox.sandbox.box import down, down_all, ensure_served_files, status, up, up_boxes
from gpubox.sandbox.box_ssh import ssh, ssh_argv, wait_ready
from gpubox.sandbox.common import SandboxError, SandboxNotUp
from gpubox.sandbox.faults import (
    FAULTS,
    clear_fault,
    clear_faults,
    hardware_state,
    mok_screen,
    plant_fault,
    save_hardware_state,
)
from gpubox.sandbox.fleet import (
    cut,
    empty_model_volume,
    fill_model_volume,
    fleet_port,
    monitoring_targets,
    restore,
)
from gpubox.sandbox.identity import Box, current, netns_argv, state_dir, use_box
from gpubox.sandbox.images import (
    CHECK_IMAGE,
    EXPORTER_IMAGE,
    load_check_image,
    load_check_images,
    load_exporter_image,
)
from gpubox.sandbox.processes import box_info, box_infos, is_up
from gpubox.sandbox.supervisor import CCACHE_DIR

__all__ = [
    "CCACHE_DIR",
    "CHECK_IMAGE",
    "EXPORTER_IMAGE",
    "FAULTS",
    "Box",
    "SandboxError",
    "SandboxNotUp",
    "box_info",
    "box_infos",
    "clear_fault",
    "clear_faults",
    "cut",
    "empty_model_volume",
    "fill_model_volume",
    "fleet_port",
    "monitoring_targets",
    "restore",
    "current",
    "down",
    "down_all",
    "ensure_served_files",
    "hardware_state",
    "is_up",
    "load_check_image",
    "load_check_images",
    "load_exporter_image",
    "mok_screen",
    "netns_argv",
    "plant_fault",
    "save_hardware_state",
    "ssh",
    "ssh_argv",
    "state_dir",
    "status",
    "up",
    "up_boxes",
    "use_box",
    "wait_ready",
]
