"""The hardware state the sandbox's stand-ins report: nvidia-smi, lspci, dcgmi, nv-hostengine and
the stand-in gpu-burn (gpubox sandbox only; the stand-ins are never shipped to a real box). See
STATE.md for the file and its format.

The state describes the reference box: two Tesla V100-SXM2-32GB joined by two NVLink links
behind a PLX PEX 8749 switch, a GeForce GT 710 display card, and the host's own PCI devices.
Faults are planted by editing the state (set_gpu_present, set_link_active, ...) and saving it
into the box; the stand-ins read it on every call, so a change shows at once."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

FORMAT = 1

# Where the stand-ins look, inside the box (each can be moved by an environment variable,
# which the unit tests use).
STATE_PATH = Path("/var/lib/gpubox-standin/state.json")
STATE_ENV = "GPUBOX_STANDIN_STATE"
RUN_DIR = Path("/run/gpubox-standin")
RUN_ENV = "GPUBOX_STANDIN_RUN"
# Written at boot by the stand-in module unit: the version of the "loaded" kernel module.
LOADED_DRIVER_FILE = "loaded-driver"
# Present while the stand-in nvidia-persistenced runs with persistence mode on.
PERSISTENCE_FILE = "persistence"
# Written by the stand-in nvidia-persistenced while it runs ("PID VERSION"): nvidia-smi -pm
# talks to the daemon while it runs (and sets the driver's legacy persistence mode otherwise).
PERSISTENCED_FILE = "nvidia-persistenced"
# Written by the stand-in nv-hostengine while it runs ("PID ADDRESS"); dcgmi reads it.
HOSTENGINE_FILE = "nv-hostengine.pid"
# DCGM's profiling module, installed by datacenter-gpu-manager-4-proprietary; the stand-in
# dcgmi serves profiling fields (1001-1012) only while this file exists.
PROFILING_MODULE = Path("/usr/lib/x86_64-linux-gnu/libdcgmmoduleprofiling.so.4")
PROFILING_MODULE_ENV = "GPUBOX_STANDIN_DCGM_PROFILING_MODULE"
# The loaded kernel modules (/sys/module in the box), moved by the unit tests.
SYS_MODULE_ENV = "GPUBOX_STANDIN_SYS_MODULE"
# Seconds between two progress reports of the stand-in gpu_burn.
BURN_TICK_ENV = "GPUBOX_STANDIN_BURN_TICK"

State = dict[str, Any]


def _gpu(
    bus_id: str,
    uuid: str,
    temperature_c: int,
    power_draw_w: float,
) -> dict[str, Any]:
    return {
        "name": "Tesla V100-SXM2-32GB",
        "uuid": uuid,
        "bus_id": bus_id,
        "present": True,
        "driver_bound": True,
        "pci": {
            "class_name": "3D controller",
            "class_code": "0302",
            "description": "NVIDIA Corporation GV100GL [Tesla V100 SXM2 32GB]",
            "vendor_id": "10de",
            "device_id": "1db5",
            "revision": "a1",
        },
        "memory_total_mib": 32768,
        "memory_used_mib": 0,
        "temperature_c": temperature_c,
        "perf": "P0",
        "power_draw_w": power_draw_w,
        "power_cap_w": 300,
        "compute_cap": "7.0",
        "pcie_gen": 3,
        "pcie_width": 16,
        "ecc": "Enabled",
        "nvlink_ports": 6,
        # What CUDA reports (cuDeviceTotalMem) and what a CUDA context leaves free, as real
        # V100-SXM2-32GB transcripts show them: 32510 MB total, 32138 MB available.
        "cuda_total_bytes": 34089730048,
        "cuda_context_mib": 372,
        # gpu-burn's Gflop/s for this GPU (illustrative V100 figures) and whether its
        # results are wrong (it then ends FAULTY, and DCGM's memory tests fail on it).
        "burn_gflops_floats": 14000.0,
        "burn_gflops_doubles": 6100.0,
        "burn_faulty": False,
        # What dcgmi dmon reads: GPU utilisation (%, field 203), NVLink bandwidth (MB/s,
        # field 449) and the profiling counters (bytes/s, fields 1009-1012).
        "gpu_util": 0,
        "nvlink_bandwidth_total": 0,
        "nvlink_tx_bytes": 0,
        "nvlink_rx_bytes": 0,
        "pcie_tx_bytes": 0,
        "pcie_rx_bytes": 0,
    }


# PCI devices other than the GPUs: (slot, class name, class code, description, vendor id,
# device id, revision), as lspci 3.9.0 names them with Debian 12's pci.ids.
_PLX = (
    "PLX Technology, Inc. PEX 8749 48-Lane, 18-Port PCI Express Gen 3 (8.0 GT/s) Multi-Root "
    "Switch with DMA"
)
_HOST_BRIDGE = (
    "Intel Corporation 8th/9th Gen Core 8-core Desktop Processor Host Bridge/DRAM Registers "
    "[Coffee Lake S]"
)
_PCI_DEVICES = [
    ("0000:00:00.0", "Host bridge", "0600", _HOST_BRIDGE, "8086", "3e30", "0d"),
    (
        "0000:00:01.0",
        "PCI bridge",
        "0604",
        "Intel Corporation 6th-10th Gen Core Processor PCIe Controller (x16)",
        "8086",
        "1901",
        "0d",
    ),
    (
        "0000:00:14.0",
        "USB controller",
        "0c03",
        "Intel Corporation Cannon Lake PCH USB 3.1 xHCI Host Controller",
        "8086",
        "a36d",
        "10",
    ),
    (
        "0000:00:17.0",
        "SATA controller",
        "0106",
        "Intel Corporation Cannon Lake PCH SATA AHCI Controller",
        "8086",
        "a352",
        "10",
    ),
    (
        "0000:00:1c.0",
        "PCI bridge",
        "0604",
        "Intel Corporation Cannon Lake PCH PCI Express Root Port #1",
        "8086",
        "a338",
        "f0",
    ),
    (
        "0000:00:1f.6",
        "Ethernet controller",
        "0200",
        "Intel Corporation Ethernet Connection (7) I219-V",
        "8086",
        "15bc",
        "10",
    ),
    ("0000:01:00.0", "PCI bridge", "0604", _PLX, "10b5", "8749", "ca"),
    ("0000:02:08.0", "PCI bridge", "0604", _PLX, "10b5", "8749", "ca"),
    ("0000:02:10.0", "PCI bridge", "0604", _PLX, "10b5", "8749", "ca"),
    # The display card: Kepler, which the R570/R580 drivers do not support, so nvidia-smi
    # never lists it.
    (
        "0000:09:00.0",
        "VGA compatible controller",
        "0300",
        "NVIDIA Corporation GK208B [GeForce GT 710]",
        "10de",
        "128b",
        "a1",
    ),
    (
        "0000:09:00.1",
        "Audio device",
        "0403",
        "NVIDIA Corporation GK208 HDMI/DP Audio Controller",
        "10de",
        "0e0f",
        "a1",
    ),
]
_PCI_KEYS = (
    "slot",
    "class_name",
    "class_code",
    "description",
    "vendor_id",
    "device_id",
    "revision",
)


def default_state() -> State:
    """The reference box. Every value comes from a real capture (tests/fixtures/SOURCES.md):
    GPU bus ids 07:00.0/08:00.0 and the 2-link NVLink pair of a real dual V100-SXM2 box,
    UUIDs of a real 2x V100-SXM2-32GB `nvidia-smi -L`, idle readings of real V100-SXM2-32GB
    tables, PCI names as real lspci 3.9.0 prints them with Debian 12's pci.ids."""
    return {
        "format": FORMAT,
        "gpus": [
            _gpu("00000000:07:00.0", "GPU-dae76d0e-3414-958a-8f3e-fc6682b36f31", 32, 41.0),
            _gpu("00000000:08:00.0", "GPU-60f2c95a-c564-a078-2a14-b4ff488806ca", 28, 39.0),
        ],
        # Each NVLink joins a port of one GPU to a port of another (positions in "gpus").
        # As on a real 2x V100-SXM2 board: GPU 0 uses ports 0 and 2, GPU 1 ports 1 and 2.
        "nvlinks": [
            {"a": [0, 0], "b": [1, 1], "active": True},
            {"a": [0, 2], "b": [1, 2], "active": True},
        ],
        "nvlink_speed_gbs": "25.781",
        # What `nvidia-smi topo -m` shows for a GPU pair with no active NVLink: both GPUs sit
        # on one PLX switch.
        "pcie_path": "PIX",
        "cpu_affinity": "0-7",
        "numa_affinity": "0",
        "persistence_forced_off": False,
        # dcgmi dmon shows N/A for profiling fields in its first samples (two in a real
        # capture, tests/fixtures/dcgmi/), then values.
        "dcgm_prof_warmup_samples": 2,
        # PCI devices other than the GPUs above, as `lspci -Dnn` lists them.
        "pci_devices": [dict(zip(_PCI_KEYS, device, strict=True)) for device in _PCI_DEVICES],
    }


def t4_state() -> State:
    """A one-GPU box with a Tesla T4 and no NVLink (the sandbox's second box). From a real
    capture: the name, bus id 00000001:01:00.0, 15360 MiB total and idle readings (26 C,
    9.31 W) of a 1x T4 `nvidia-smi --query-gpu` (tests/fixtures/nvidia-smi/
    query-gpu_csv_1xT4_NA.csv); the PCI id 10de:1eb8 and compute capability 7.5 as
    gpubox.base.compat has them; the PCI description as Debian 12's pci.ids names it. Guessed,
    for want of a capture: the UUID (made up), the 70 W power cap (the T4's rated board
    power), CUDA's total bytes (15360 MiB less what the driver reserves, as on the V100)
    and gpu-burn's Gflop/s (illustrative)."""
    gpu = _gpu("00000001:01:00.0", "GPU-7e4f5a12-0c1d-4b7e-9a3f-2d5c6b8e9f10", 26, 9.31)
    gpu.update(
        name="Tesla T4",
        memory_total_mib=15360,
        power_cap_w=70,
        compute_cap="7.5",
        nvlink_ports=0,
        cuda_total_bytes=15843721216,
        burn_gflops_floats=7000.0,
        burn_gflops_doubles=230.0,
    )
    gpu["pci"].update(description="NVIDIA Corporation TU104GL [Tesla T4]", device_id="1eb8")
    state = default_state()
    state.update(gpus=[gpu], nvlinks=[])
    return state


def state_path() -> Path:
    """The state file: $GPUBOX_STANDIN_STATE, else /var/lib/gpubox-standin/state.json."""
    env = os.environ.get(STATE_ENV)
    return Path(env) if env else STATE_PATH


def run_dir() -> Path:
    """The runtime directory: $GPUBOX_STANDIN_RUN, else /run/gpubox-standin."""
    env = os.environ.get(RUN_ENV)
    return Path(env) if env else RUN_DIR


def load_state(path: Path | str | None = None) -> State:
    with open(path or state_path(), encoding="utf-8") as f:
        state: State = json.load(f)
    if state.get("format") != FORMAT:
        raise ValueError(f"stand-in state format {state.get('format')!r}, expected {FORMAT}")
    return state


def dumps_state(state: State) -> str:
    return json.dumps(state, indent=2, sort_keys=True) + "\n"


def save_state(state: State, path: Path | str | None = None) -> Path:
    """Write the state atomically (the stand-ins may read it at the same moment)."""
    target = Path(path or state_path())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(dumps_state(state), encoding="utf-8")
    os.replace(tmp, target)
    return target


def _gpu_at(state: State, index: int) -> dict[str, Any]:
    gpus: list[dict[str, Any]] = state["gpus"]
    if not 0 <= index < len(gpus):
        raise IndexError(f"the state has GPUs 0..{len(gpus) - 1}, not {index}")
    return gpus[index]


def set_gpu_present(state: State, index: int, present: bool) -> State:
    """A GPU falls off the bus (present False): gone from lspci and from every nvidia-smi
    output, where the remaining GPUs are renumbered. ``index`` is the GPU's position in the
    state, which does not change."""
    _gpu_at(state, index)["present"] = present
    return state


def set_gpu_driver_bound(state: State, index: int, bound: bool) -> State:
    """The GPU stays on the bus (lspci lists it) but the driver does not bind it, so
    nvidia-smi does not see it."""
    _gpu_at(state, index)["driver_bound"] = bound
    return state


def set_link_active(state: State, gpu: int, link: int, active: bool) -> State:
    """NVLink port ``link`` of GPU ``gpu`` (its position in the state) goes down or up: the
    link shows <inactive> on both GPUs it joins, and topo -m counts one NVLink fewer."""
    _gpu_at(state, gpu)
    for nvlink in state["nvlinks"]:
        if [gpu, link] in (nvlink["a"], nvlink["b"]):
            nvlink["active"] = active
            return state
    raise ValueError(f"GPU {gpu} port {link} is not cabled to another GPU in this state")


def set_persistence_forced_off(state: State, forced_off: bool) -> State:
    """Persistence mode reads Disabled/Off even while nvidia-persistenced runs with it on."""
    state["persistence_forced_off"] = forced_off
    return state


def set_gpu_burn_faulty(state: State, index: int, faulty: bool) -> State:
    """The GPU computes wrong results: gpu-burn counts errors on it and ends "GPU n: FAULTY"
    (still exiting 0), and `dcgmi diag` from level 2 fails its memory tests on it."""
    _gpu_at(state, index)["burn_faulty"] = faulty
    return state


def set_gpu_nvlink_traffic(
    state: State,
    index: int,
    tx_bytes: int,
    rx_bytes: int,
    bandwidth_total_mbs: int | None = None,
) -> State:
    """What `dcgmi dmon` shows for the GPU: NVLink tx/rx bytes per second (fields 1011/1012)
    and the total NVLink bandwidth in MB/s (field 449; tx + rx when not given)."""
    gpu = _gpu_at(state, index)
    gpu["nvlink_tx_bytes"] = tx_bytes
    gpu["nvlink_rx_bytes"] = rx_bytes
    if bandwidth_total_mbs is None:
        bandwidth_total_mbs = (tx_bytes + rx_bytes) // 1_000_000
    gpu["nvlink_bandwidth_total"] = bandwidth_total_mbs
    return state


# The GPU's error counters DCGM reads (the stand-in dcgm-exporter serves them through the
# stand-in nv-hostengine; absent fields read 0: STATE.md "Errors DCGM counts").
ERROR_FIELDS = (
    "xid_last",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    "thermal_violation_us",
    "nvlink_crc_flit_errors",
    "nvlink_crc_data_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
)


def set_gpu_errors(state: State, index: int, **counts: int) -> State:
    """Errors DCGM counts on the GPU, e.g. ``xid_last=79`` (the last XID seen),
    ``ecc_dbe_volatile=2``, ``retired_pages_pending=1``, ``nvlink_crc_data_errors=12``
    (ERROR_FIELDS); raises ValueError on another name."""
    unknown = sorted(set(counts) - set(ERROR_FIELDS))
    if unknown:
        raise ValueError(f"unknown GPU error field(s) {unknown}; known: {ERROR_FIELDS}")
    _gpu_at(state, index).update(counts)
    return state


def profiling_module_path() -> Path:
    """Where the stand-in dcgmi looks for DCGM's profiling module: $GPUBOX_STANDIN_DCGM_
    PROFILING_MODULE, else /usr/lib/x86_64-linux-gnu/libdcgmmoduleprofiling.so.4."""
    env = os.environ.get(PROFILING_MODULE_ENV)
    return Path(env) if env else PROFILING_MODULE


# --------------------------------------------------------------------------- firmware


def secure_boot(state: State) -> dict[str, Any] | None:
    """The box's stand-in UEFI variables (STATE.md "secure_boot"), or None: no EFI."""
    section: dict[str, Any] | None = state.get("secure_boot")
    return section


def set_secure_boot(state: State, enabled: bool, efi: bool = True) -> State:
    """The box boots through UEFI (``efi``) with Secure Boot ``enabled`` or not; keeps the
    enrolled keys and any pending request. ``efi=False``: no EFI variables at all (the box's
    default: `mokutil` then says "EFI variables are not supported on this system")."""
    if not efi:
        state.pop("secure_boot", None)
        return state
    section = state.setdefault("secure_boot", {})
    section.update(efi=True, enabled=enabled)
    section.setdefault("enrolled", [])
    section.setdefault("pending", [])
    section.setdefault("pending_password_hash", None)
    return state


def enroll_certificate(state: State, der: bytes) -> State:
    """Put a DER certificate into MokListRT, as if its owner had enrolled it long ago."""
    section = secure_boot(state)
    if section is None:
        raise ValueError("the box has no EFI: set_secure_boot first")
    encoded = base64.b64encode(der).decode()
    if encoded not in section["enrolled"]:
        section["enrolled"].append(encoded)
    return state


def password_hash(password: str, salt: str | None = None) -> str:
    """What the stand-in mokutil keeps of an import password (standin/mokutil password_hash;
    the real one writes a SHA-512 crypt hash to MokAuth): "sha512$SALT$HEX"."""
    salt = salt or secrets.token_hex(8)
    return f"sha512${salt}${hashlib.sha512((salt + password).encode()).hexdigest()}"


def password_matches(stored: str | None, password: str) -> bool:
    if not stored or stored.count("$") != 2:
        return False
    _, salt, _ = stored.split("$")
    return secrets.compare_digest(password_hash(password, salt), stored)


MOK_ANSWERS = ("enroll", "timeout")


def mok_screen(state: State, answer: str, password: str | None = None) -> State:
    """What someone at the console will do at the next boot's MOK screen (shim's MokManager,
    which runs when MokNew is set): "enroll" with the import password, or "timeout" (nobody
    answers: MokManager deletes MokNew and boots on after about 10 s). Applied by
    ``apply_mok_screen`` when the box boots again; a boot with a request and no answer is a
    timeout."""
    if answer not in MOK_ANSWERS:
        raise ValueError(f"MOK screen answer {answer!r}: one of {', '.join(MOK_ANSWERS)}")
    section = secure_boot(state)
    if section is None:
        raise ValueError("the box has no EFI, so no MOK screen: plant a secure-boot fault first")
    if answer == "enroll" and password is None:
        raise ValueError("enrolling at the MOK screen needs the import password")
    section["mok_screen"] = {
        "answer": answer,
        "password_ok": answer == "enroll"
        and password_matches(section.get("pending_password_hash"), password or ""),
    }
    return state


def apply_mok_screen(state: State) -> str | None:
    """The MOK screen of a boot (run by the sandbox before the box boots again): with a
    pending request, "enroll" and the right password moves its keys to the enrolled ones;
    a wrong password (MokManager gives up after 3 tries: "Failed to enroll keys") or no
    answer enrolls nothing; the request is gone either way (MokManager deletes MokNew as it
    reads it). Returns what happened, or None when no request was pending."""
    section = secure_boot(state)
    if section is None:
        return None
    answer = section.pop("mok_screen", None) or {"answer": "timeout", "password_ok": False}
    pending = section.get("pending") or []
    if not pending:
        return None
    if answer["answer"] == "enroll" and answer["password_ok"]:
        for cert in reversed(pending):  # MokNew's first key was the last imported
            if cert not in section["enrolled"]:
                section["enrolled"].append(cert)
        outcome = f"enrolled {len(pending)} key(s)"
    elif answer["answer"] == "enroll":
        outcome = "wrong password 3 times: Failed to enroll keys; the request is discarded"
    else:
        outcome = "no answer: the request is discarded"
    section["pending"] = []
    section["pending_password_hash"] = None
    return outcome


def set_display_driver(state: State, driver: str | None) -> State:
    """The kernel driver the box's display card (the GT 710) gets at boot: "nouveau" (a
    desktop: loaded unless /etc/modprobe.d blacklists it) or None (no driver: the firmware
    framebuffer)."""
    state["display_driver"] = driver
    return state


def refuse_module(state: State, version: str) -> State:
    """The kernel refuses the nvidia module of driver ``version`` at the next boot (the module
    unit's load-module; the ``module-refuses`` fault): "refused_modules", a list of versions."""
    refused = state.setdefault("refused_modules", [])
    if version not in refused:
        refused.append(version)
    return state


def sys_module_dir() -> Path:
    """Where the stand-ins read the loaded kernel modules: $GPUBOX_STANDIN_SYS_MODULE, else
    /sys/module (in the box a tmpfs the sandbox mounts there, STANDINS.md)."""
    env = os.environ.get(SYS_MODULE_ENV)
    return Path(env) if env else Path("/sys/module")
