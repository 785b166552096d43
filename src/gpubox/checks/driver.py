"""Checks of the OS, the GPUs, NVLink and the NVIDIA driver (deploy/driver.py fixes them)."""

from __future__ import annotations

import contextlib
import itertools
import re

from gpubox import parsers
from gpubox.base import kernels, layout
from gpubox.checks.core import Check, Finding, Reading, Unreadable
from gpubox.config import HostConfig

OS_FIX = "gpubox supports Ubuntu 24.04 and Debian 12: reinstall the host with one of them"
REBOOT = 'sudo reboot (or {deploy} with "allow_reboot": True)'
_NVIDIA = re.compile(r"^(lib)?nvidia-|^libcuda|^firmware-nvidia|^xserver-xorg-video-nvidia")
_INSTALLED = ("ii", "hi")


def os_supported(c: HostConfig, r: Reading) -> str | None:
    release = r.get("os_release")
    if r.target is None:
        return f"unsupported OS {release.get('PRETTY_NAME', '?')}"
    return None


def smi_gpus(r: Reading) -> list[dict]:
    """nvidia-smi's GPUs; Unreadable (naming why) when nvidia-smi cannot list them."""
    out = r.out("smi_query")
    if out.missing:
        raise Unreadable("nvidia-smi not found: no NVIDIA driver installed")
    kind = parsers.parse_smi_error(out.text)
    if kind == "no_driver":
        raise Unreadable("nvidia-smi cannot talk to the driver: no NVIDIA kernel module loaded")
    if kind == "version_mismatch":
        raise Unreadable(
            "driver/library version mismatch: the loaded kernel module is not the installed "
            "driver (reboot)"
        )
    if "No devices were found" in out.text:
        return []
    return list(r.get("smi_query"))


def gpus_listed(c: HostConfig, r: Reading) -> list[Finding]:
    gpus = smi_gpus(r)
    model, want = c.gpu_model, c.gpu_count
    problems = []
    if len(gpus) < want:
        seen = ""
        with contextlib.suppress(Unreadable):
            lspci = r.get("lspci")
            seen = f"; lspci shows {sum(d.class_code == '0302' for d in lspci)} NVIDIA 3D "
            seen += "controller(s)"
        found = ", ".join(f"GPU {g['index']} {g['name']} {g['pci.bus_id']}" for g in gpus)
        problems.append(
            Finding(
                f"nvidia-smi lists {len(gpus)} GPU(s), expected {want} {model}{seen}; "
                f"found: {found or 'none'}",
                "check the card/power/PCIe; lspci -d 10de:",
            )
        )
    elif len(gpus) > want:
        problems.append(
            Finding(
                f"more GPUs than the inventory: expected {want}, nvidia-smi lists {len(gpus)}",
                f"set gpu_count = {len(gpus)} in the inventory",
            )
        )
    problems += [
        Finding(
            f"GPU {g['index']} ({g['pci.bus_id']}) is {g['name']}, expected {model}",
            "set gpu_model in the inventory, or check which card is installed",
        )
        for g in gpus
        if g["name"] != model
    ]
    return problems


def persistence(c: HostConfig, r: Reading) -> str | None:
    off = [
        f"GPU {g['index']} ({g['pci.bus_id']})"
        for g in smi_gpus(r)
        if g["persistence_mode"] != "Enabled"
    ]
    return f"persistence mode is not Enabled on {', '.join(off)}" if off else None


def loaded_driver(c: HostConfig, r: Reading) -> Finding | None:
    versions = {g["driver_version"] for g in smi_gpus(r) if g["driver_version"]}
    with contextlib.suppress(Unreadable):
        module = r.get("module_version")  # None: none loaded; "mismatch": nvidia-smi's word
        if module and module != "mismatch":
            versions.add(module)
    if versions and versions != {c.driver_version}:
        return Finding(
            f"loaded driver {', '.join(sorted(versions))}, configured {c.driver_version}", REBOOT
        )
    return None


def _wanted(c: HostConfig, r: Reading):
    if r.target is None:
        raise Unreadable("the OS is not a supported one: no driver packages to compare")
    return c.driver_packages(r.target.family)


def packages_at_version(c: HostConfig, r: Reading) -> str | None:
    want, dpkg = _wanted(c, r), r.get("dpkg")
    wrong = {
        name: (dpkg[name].version if name in dpkg else "not installed")
        for name in want.installed
        if name not in dpkg
        or dpkg[name].version != want.package_version
        or not dpkg[name].status.startswith(_INSTALLED)
    }
    if not wrong:
        return None
    shown = ", ".join(f"{n} {v}" for n, v in list(wrong.items())[:6])
    more = f" and {len(wrong) - 6} more" if len(wrong) > 6 else ""
    return f"driver packages not at {want.package_version}: {shown}{more}"


def packages_held(c: HostConfig, r: Reading) -> str | None:
    want = _wanted(c, r)
    unheld = sorted(set(want.installed) - r.get("holds"))
    return f"driver packages not held: {', '.join(unheld)}" if unheld else None


def apt_candidate(c: HostConfig, r: Reading) -> str | None:
    want, policy = _wanted(c, r), r.get("policy")
    wrong = {
        name: (policy[name].candidate if name in policy else "unknown to apt")
        for name in want.installed
        if name not in policy or policy[name].candidate != want.package_version
    }
    if not wrong:
        return None
    shown = ", ".join(f"{n} {v or 'nothing'}" for n, v in wrong.items())
    return f"apt would install {shown}, not {want.package_version} (the pin is missing or broken)"


def pins_in_place(c: HostConfig, r: Reading) -> list[Finding]:
    want = _wanted(c, r)
    pins = {
        layout.DRIVER_PIN: (want.package_version, "driver"),
        layout.TOOLKIT_PIN: (c.catalog["container_toolkit"]["version"], "container_toolkit"),
        layout.DCGM_PIN: (c.catalog["dcgm"]["version"], "dcgm"),
    }
    sections = r.get("pins")
    problems = []
    for path, (version, stage) in pins.items():
        fix = f"pyinfra {{inv}} deploy/{stage}.py"
        if path not in sections:
            problems.append(Finding(f"apt pin {path} is missing", fix))
        elif f"Pin: version {version}\n" not in sections[path]:
            problems.append(Finding(f"apt pin {path} does not hold {version}", fix))
    return problems


def one_branch(c: HostConfig, r: Reading) -> list[str]:
    want, dpkg = _wanted(c, r), r.get("dpkg")
    names = set(want.installed)
    not_driver = set(c.catalog["driver"].get("not_driver_builds", []))
    prefix = c.driver_version + "-"
    others = {
        name: pkg.version
        for name, pkg in dpkg.items()
        if pkg.status.startswith(("ii", "hi", "iU", "iF"))
        and _NVIDIA.match(name)
        and not name.startswith("libnvidia-container")
        and name not in not_driver
        and (name in names or re.search(r"\d{3}\.\d+", pkg.version))
        and not pkg.version.startswith(prefix)
    }
    unwanted = sorted(
        n
        for n in want.refused + want.forbidden
        if n in dpkg and dpkg[n].status.startswith(_INSTALLED)
    )
    problems = []
    if others:
        problems.append(f"NVIDIA packages of another driver: {others}")
    if unwanted:
        problems.append(
            f"installed but must not be ({c.driver_kernel_modules} modules, no driver metas): "
            + ", ".join(unwanted)
        )
    return problems


def unattended_blacklist(c: HostConfig, r: Reading) -> str | None:
    dump = r.get("unattended")
    patterns = re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', dump, re.M)
    uncovered = [n for n in _wanted(c, r).installed if not any(re.match(p, n) for p in patterns)]
    return f"unattended-upgrades may upgrade {', '.join(uncovered)}" if uncovered else None


def module_for_every_kernel(c: HostConfig, r: Reading) -> str | None:
    state = r.get("kernels")
    if state.dkms is None:
        return "dkms is not installed: no kernel gets the NVIDIA module"
    lacking = kernels.kernels_lacking_module(state, c.driver_version)
    if lacking:
        return (
            f"no NVIDIA {c.driver_version} module installed by DKMS for kernel(s) "
            f"{', '.join(lacking)}: booting one of them gives no driver"
        )
    return None


def nouveau(c: HostConfig, r: Reading) -> str | None:
    return "nouveau is loaded" if r.get("nouveau") else None


def service_up(unit: str, enabled: bool = True):
    """A judge: the systemd unit is active (and enabled)."""

    def judge(c: HostConfig, r: Reading) -> str | None:
        props = r.get("services").get(unit, {})
        active = props.get("ActiveState", "unknown")
        state = props.get("UnitFileState", "unknown")
        if props.get("LoadState") == "not-found":
            return f"{unit} is not installed"
        if active != "active" or (enabled and state not in ("enabled", "static", "alias")):
            return f"{unit} is {active}" + (f" and {state}" if enabled else "")
        return None

    return judge


def nvlink_links(c: HostConfig, r: Reading) -> list[str]:
    """Every GPU has ``nvlink_links`` links up (a V100 has six ports; a board wires fewer,
    the rest read <inactive>), or at least one when the inventory does not say."""
    status, want = r.get("nvlink"), c.nvlink_links
    problems = []
    for gpu in range(c.gpu_count):
        links = status.get(gpu, [])
        up = [link.link for link in links if link.active]
        down = [link.link for link in links if not link.active]
        if not links:
            problems.append(f"GPU {gpu} reports no NVLink links")
        elif (want is None and not up) or (want is not None and len(up) != want):
            problems.append(
                f"GPU {gpu}: {len(up)} NVLink link(s) active, expected "
                f"{want if want is not None else 'at least 1'} (active: "
                f"{', '.join(map(str, up)) or 'none'}; inactive: "
                f"{', '.join(map(str, down)) or 'none'})"
            )
    return problems


def nvlink_topology(c: HostConfig, r: Reading) -> list[str]:
    topo = r.get("topo")
    if len(topo.gpus) != c.gpu_count:
        return [f"topo -m shows {len(topo.gpus)} GPU(s), expected {c.gpu_count}"]
    return [
        f"{a} and {b} not joined by NVLink ({topo.links.get((a, b))})"
        for a, b in itertools.combinations(topo.gpus, 2)
        if topo.nvlinks(a, b) == 0
    ]


def _needs_nvlink(c: HostConfig) -> str | None:
    return None if c.nvlink else "nvlink is false in the inventory"


def _needs_persistence(c: HostConfig) -> str | None:
    return None if c.persistence_mode else "persistence_mode is false in the inventory"


NVLINK_FIX = "reseat the NVLink bridge/board, check the GPUs' seating; nvidia-smi nvlink -s"

CHECKS = [
    Check(
        "os.supported",
        "the OS is a supported one",
        "quick",
        ("os_release",),
        os_supported,
        fix=OS_FIX,
        stage="driver",
    ),
    Check(
        "gpu.listed",
        "nvidia-smi lists every GPU of the inventory",
        "gpu",
        ("smi_query", "lspci"),
        gpus_listed,
        stage="driver",
    ),
    Check(
        "gpu.persistence",
        "persistence mode is on for every GPU",
        "gpu",
        ("smi_query",),
        persistence,
        fix="sudo systemctl restart nvidia-persistenced; {deploy}",
        applies=_needs_persistence,
        stage="driver",
    ),
    Check(
        "driver.loaded",
        "the loaded driver is the installed one",
        "gpu",
        ("smi_query", "module_version"),
        loaded_driver,
        fix=REBOOT,
    ),
    Check(
        "driver.version",
        "the driver packages are at the pinned version",
        "quick",
        ("os_release", "dpkg"),
        packages_at_version,
    ),
    Check(
        "driver.held",
        "the driver packages are held",
        "quick",
        ("os_release", "holds"),
        packages_held,
    ),
    Check(
        "driver.candidate",
        "apt would install nothing but the pinned driver",
        "quick",
        ("os_release", "policy"),
        apt_candidate,
    ),
    Check(
        "driver.pins",
        "gpubox's apt pins are in place",
        "quick",
        ("os_release", "pins"),
        pins_in_place,
    ),
    Check(
        "driver.one-branch",
        "no other driver branch, flavour or meta package",
        "quick",
        ("os_release", "dpkg"),
        one_branch,
    ),
    Check(
        "driver.unattended",
        "unattended-upgrades leaves the driver alone",
        "quick",
        ("os_release", "unattended"),
        unattended_blacklist,
    ),
    Check(
        "driver.kernels",
        "every bootable kernel has the NVIDIA module",
        "quick",
        ("kernels",),
        module_for_every_kernel,
        fix="{deploy} (runs dkms autoinstall -k KERNEL, or installs that kernel's headers)",
    ),
    Check(
        "driver.nouveau",
        "nouveau is not loaded",
        "quick",
        ("nouveau",),
        nouveau,
        fix="{deploy} (blacklists nouveau), then sudo reboot",
    ),
    Check(
        "driver.persistenced",
        "nvidia-persistenced is running",
        "quick",
        ("services",),
        service_up(layout.PERSISTENCED, enabled=False),
        fix="sudo systemctl start nvidia-persistenced; {deploy}",
    ),
    Check(
        "nvlink.links",
        "every GPU has its NVLink links up",
        "gpu",
        ("nvlink",),
        nvlink_links,
        fix=NVLINK_FIX,
        applies=_needs_nvlink,
        stage="driver",
    ),
    Check(
        "nvlink.topology",
        "every GPU pair is joined by NVLink",
        "gpu",
        ("topo",),
        nvlink_topology,
        fix=NVLINK_FIX,
        applies=_needs_nvlink,
        stage="driver",
    ),
]
