"""The reads of a host that the deploy, the checks and doctor share: each one read-only command
and the parser of its output, defined once here.

The deploy's pyinfra facts (gpubox.infra.host_facts: ``command`` and ``process``) and the checks'
facts (gpubox.checks.facts, which doctor reads through the checks' ``Reading``) are both made
from these, so a stage and a check never read the same thing two ways. Every command exits 0:
absence is data (an empty file, "no", None), which a pyinfra fact needs (a failing fact
command fails the host)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gpubox import parsers
from gpubox.base import kernels, layout
from gpubox.knowledge import secure_boot, users
from gpubox.parsers.secure_boot import parse_mok_state

T = TypeVar("T")


@dataclass(frozen=True)
class Read(Generic[T]):
    """One read: its command (a string, or a function of the read's arguments: the module,
    the OS family, the users) and the parser of its whole standard output. ``parser_name``
    names the parser where it is a wrapper (as `gpubox checks` shows it)."""

    command: str | Callable[..., str]
    parse: Callable[[str], T]
    parser_name: str = ""

    def command_for(self, *args: Any) -> str:
        """The command for these arguments (none for a read without any)."""
        return self.command if isinstance(self.command, str) else self.command(*args)


def section(name: str) -> str:
    """The command that starts section ``name`` of a multi-command read (its output is read
    back with parsers.parse_sections)."""
    return f"echo {shlex.quote(parsers.SECTION + name)}"


def _module_loaded(module: str) -> str:
    return f"test -d {layout.SYS_MODULE}/{module} && echo yes || echo no"


def _kernel_state(text: str) -> kernels.KernelState:
    return kernels.parse_kernel_state(text.splitlines())


# /etc/os-release (ID, VERSION_ID, VERSION_CODENAME, PRETTY_NAME, ...); {} without the file
OS_RELEASE = Read("cat /etc/os-release 2>/dev/null || true", parsers.parse_os_release)

# NVIDIA devices on the PCI bus: lspci -Dnn, or sysfs in lspci's format where lspci is absent
NVIDIA_PCI = Read(
    "if command -v lspci >/dev/null 2>&1; then lspci -Dnn -d 10de: ; else "
    "for d in /sys/bus/pci/devices/*; do "
    '[ "$(cat $d/vendor 2>/dev/null)" = 0x10de ] || continue; '
    "c=$(cut -c3-6 $d/class); v=$(cut -c3- $d/vendor); i=$(cut -c3- $d/device); "
    'echo "${d##*/} Class [$c]: NVIDIA Corporation Device [$v:$i]"; '
    "done; fi 2>/dev/null || true",
    parsers.parse_lspci,
)

# Secure Boot: True/False as the firmware says, None without EFI variables
# (gpubox.knowledge.secure_boot)
SECURE_BOOT = Read(secure_boot.SB_STATE_COMMAND, parsers.parse_secure_boot)

# DKMS's signing key, its enrolment and the NVIDIA modules' signer and taint; of the OS family
MOK_STATE = Read(secure_boot.state_command, parse_mok_state)

# Each named user's groups, None for a user the box does not have; of the users (docker_users)
USER_GROUPS = Read(users.groups_command, parsers.parse_user_groups)

# The packages apt holds
HELD_PACKAGES = Read("apt-mark showhold 2>/dev/null || true", parsers.parse_showhold)

# The loaded NVIDIA module's version ("mismatch", None: parsers.parse_loaded_driver): sysfs, and
# nvidia-smi where sysfs has no version file (a box whose /sys/module shows no nvidia: the
# sandbox's stand-in GPUs answer through nvidia-smi)
LOADED_DRIVER = Read(
    f"cat {layout.NVIDIA_MODULE_VERSION} 2>/dev/null || "
    "nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -n 3 || true",
    parsers.parse_loaded_driver,
)

# Whether a kernel module is loaded (its /sys/module directory); of the module's name
MODULE_LOADED = Read(_module_loaded, parsers.parse_yes)

# The running kernel, the bootable ones, their headers and what DKMS installed (gpubox.base.kernels)
KERNEL_STATE = Read(
    kernels.KERNEL_STATE_COMMAND, _kernel_state, parser_name="kernels.parse_kernel_state"
)

# Every GPU's state in one nvidia-smi query (the checks' smi_query; the driver stage reads its
# persistence mode from it): one dict per GPU, the fields by these names
GPU_QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "persistence_mode",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "power.limit",
)


def _gpu_query(text: str) -> list[dict[str, str | None]]:
    return parsers.parse_query_gpu(text, list(GPU_QUERY_FIELDS))


GPU_QUERY = Read(
    f"nvidia-smi --query-gpu={','.join(GPU_QUERY_FIELDS)} --format=csv,noheader,nounits",
    _gpu_query,
    parser_name="parsers.parse_query_gpu",
)


# Every GPU's NVLink links, active (with their speed) or not: GPU index -> links (the checks'
# nvlink; the driver stage's record of the links up before a move, gpubox.rules.driver_rollback)
NVLINK_STATUS = Read("nvidia-smi nvlink -s", parsers.parse_nvlink_status)


def _unit_states(*units: str) -> str:
    return "systemctl show -p Id,LoadState,ActiveState,UnitFileState " + " ".join(units)


# Each named unit's load, active and enablement state (Id without .service -> properties)
UNIT_STATES = Read(_unit_states, parsers.parse_unit_states)
