"""`gpubox doctor INVENTORY [--json]`: the whole box on one screen per host, and every way it
differs from its inventory, each with the command that fixes it.

Three steps, so that the judging is pure and tested on real outputs:

- ``gather(run, config)`` runs each read-only command once on the host (the commands the host
  checks in tests/host run) and keeps every output, failures included: a missing tool or a
  command that fails is a finding, never a crash. Nothing here changes the host.
- ``describe(config, facts)`` reads the outputs with gpubox.parsers into one JSON-able view
  (OS, GPUs, NVLink, driver, CUDA, Docker, DCGM, backend, burn-in; with the last figures
  `gpubox bench` kept for the host on this machine, if any); ``evaluate(config, facts)``
  turns every deviation from the configuration into a ``Finding`` with its fix.
- ``render_text`` / ``render_json`` print them.

Exit status: 0 when no host deviates, 1 when one does, 2 when the inventory is unusable."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shlex
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpubox import bench, kernels, parsers
from gpubox.config import ConfigError, HostConfig, load_host_config, target_for

QUERY_FIELDS = [
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
]
APPS_FIELDS = ["gpu_uuid", "pid", "process_name", "used_memory"]
BACKEND_UNITS = {"llamacpp": "gpubox-llama-server", "vllm": "gpubox-vllm"}
SERVICES = ["nvidia-persistenced", "docker", "nvidia-dcgm", *BACKEND_UNITS.values()]
BURNIN_RECORD = "/var/lib/gpubox/burnin.json"
DPKG_QUERY = "dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'"
NOT_FOUND = 127  # the shell's "command not found"


@dataclass(frozen=True)
class Output:
    """One command's result on the host."""

    rc: int
    stdout: str
    stderr: str = ""
    command: str = ""

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    @property
    def missing(self) -> bool:
        return self.rc == NOT_FOUND

    def first_error_line(self) -> str:
        lines = [ln.strip() for ln in (self.stderr or self.stdout).splitlines() if ln.strip()]
        return lines[0] if lines else f"exit status {self.rc}"


Runner = Callable[[str], Output]
Facts = dict[str, Output]


@dataclass(frozen=True)
class Finding:
    """A deviation from the inventory: what is wrong and the command that fixes it."""

    area: str  # "gpu", "nvlink", "driver", "cuda", "docker", "dcgm", "backend", "burnin", ...
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.message} -> {self.fix}"


# --------------------------------------------------------------------------- gather


def commands(config: HostConfig, family: str | None) -> dict[str, str]:
    """Every read-only command doctor runs, by fact name. ``family`` (ubuntu/debian, from
    os-release) names the driver packages; without it apt-cache policy is not run."""
    cmds = {
        "os_release": "cat /etc/os-release",
        "kernel": "uname -r",
        "smi_query": (
            f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"
        ),
        "smi_apps": (
            f"nvidia-smi --query-compute-apps={','.join(APPS_FIELDS)} --format=csv,noheader,nounits"
        ),
        "nvlink": "nvidia-smi nvlink -s",
        "topo": "nvidia-smi topo -m",
        "lspci": "lspci -Dnn -d 10de:",
        "module_version": "cat /sys/module/nvidia/version",
        "kernels": kernels.KERNEL_STATE_COMMAND,
        "dpkg": DPKG_QUERY,
        "holds": "apt-mark showhold",
        "nvcc": "bash -lc 'command -v nvcc && nvcc --version'",
        "cuda_link": "readlink -e /usr/local/cuda",
        "services": "systemctl show -p Id,LoadState,ActiveState,UnitFileState "
        + " ".join(SERVICES),
        "docker_info": "docker info --format '{{json .}}'",
        "dcgm_discovery": "dcgmi discovery -l",
        "burnin": f"cat {BURNIN_RECORD}",
    }
    if family is not None:
        packages = config.driver_packages(family).installed
        cmds["policy"] = "LC_ALL=C apt-cache policy " + " ".join(packages)
    if config.backend in BACKEND_UNITS:
        cmds["health"] = "curl -sS --max-time 5 -o /dev/null -w '%{http_code}' " + shlex.quote(
            f"http://{_api_address(config)}:{config.api_port}/health"
        )
    return cmds


def _api_address(config: HostConfig) -> str:
    host = str(config.api_host)
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _family(config: HostConfig, facts: Mapping[str, Output]) -> str | None:
    out = facts.get("os_release")
    if out is None or out.rc != 0:
        return None
    try:
        target = target_for(parsers.parse_os_release(out.stdout), config.catalog)
    except parsers.ParseError:
        return None
    return target.family if target else None


class Unreachable(Exception):
    """The host could not be reached at all."""


def gather(run: Runner, config: HostConfig) -> Facts:
    """Run each command of ``commands`` once; keep every output. A runner that raises on the
    first command (no connection) raises Unreachable; later exceptions become outputs."""
    facts: Facts = {}

    def take(name: str, command: str) -> None:
        try:
            out = run(command)
        except Exception as exc:  # a broken connection mid-way is one more finding
            out = Output(255, "", f"{type(exc).__name__}: {exc}")
        facts[name] = Output(out.rc, out.stdout, out.stderr, command)

    first = commands(config, None)["os_release"]
    try:
        out = run(first)
    except Exception as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
    facts["os_release"] = Output(out.rc, out.stdout, out.stderr, first)
    for name, command in commands(config, _family(config, facts)).items():
        if name not in facts:
            take(name, command)
    return facts


# --------------------------------------------------------------------------- describe


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _tool_error(out: Output | None, tool: str) -> str | None:
    """Why a command's output cannot be read, or None when it can."""
    if out is None:
        return "not run"
    if out.missing:
        return f"{tool} not found"
    return None


def _describe_os(facts: Mapping[str, Output], config: HostConfig) -> dict[str, Any]:
    out = facts["os_release"]
    kernel = facts.get("kernel")
    view: dict[str, Any] = {"kernel": kernel.stdout.strip() if kernel and kernel.rc == 0 else None}
    if out.rc != 0:
        return {**view, "error": out.first_error_line()}
    try:
        release = parsers.parse_os_release(out.stdout)
    except parsers.ParseError as exc:
        return {**view, "error": str(exc)}
    target = target_for(release, config.catalog)
    return {
        **view,
        "pretty_name": release.get("PRETTY_NAME", ""),
        "id": release.get("ID", ""),
        "version_id": release.get("VERSION_ID", ""),
        "supported": target is not None,
        "family": target.family if target else None,
    }


def _describe_gpus(facts: Mapping[str, Output]) -> dict[str, Any]:
    out = facts.get("smi_query")
    error = _tool_error(out, "nvidia-smi")
    if error or out is None:
        return {"error": error, "gpus": None}
    kind = parsers.parse_smi_error(out.text)
    if kind is not None:
        return {"error": kind, "detail": out.first_error_line(), "gpus": None}
    if "No devices were found" in out.text:
        return {"error": None, "gpus": []}
    if out.rc != 0:
        return {"error": "nvidia-smi failed", "detail": out.first_error_line(), "gpus": None}
    try:
        rows = parsers.parse_query_gpu(out.stdout, QUERY_FIELDS)
    except parsers.ParseError as exc:
        return {"error": "unreadable", "detail": str(exc), "gpus": None}
    apps = _compute_apps(facts.get("smi_apps"))
    gpus = []
    for row in rows:
        uuid = row["uuid"] or ""
        gpus.append(
            {
                "index": _int(row["index"]),
                "name": row["name"],
                "uuid": uuid,
                "bus_id": row["pci.bus_id"],
                "driver_version": row["driver_version"],
                "persistence": row["persistence_mode"],
                "memory_used_mib": _int(row["memory.used"]),
                "memory_total_mib": _int(row["memory.total"]),
                "temperature_c": _int(row["temperature.gpu"]),
                "power_draw_w": _float(row["power.draw"]),
                "power_limit_w": _float(row["power.limit"]),
                "apps": None if apps is None else apps.get(uuid, []),
            }
        )
    return {"error": None, "gpus": gpus}


def _compute_apps(out: Output | None) -> dict[str, list[dict[str, Any]]] | None:
    """Compute apps by GPU UUID; None when nvidia-smi could not list them."""
    if out is None or out.rc != 0:
        return None
    try:
        rows = parsers.parse_query_gpu(out.stdout, APPS_FIELDS)
    except parsers.ParseError:
        return None
    apps: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        apps.setdefault(row["gpu_uuid"] or "", []).append(
            {
                "pid": _int(row["pid"]),
                "name": row["process_name"],
                "memory_mib": _int(row["used_memory"]),
            }
        )
    return apps


def _describe_nvlink(facts: Mapping[str, Output]) -> dict[str, Any]:
    view: dict[str, Any] = {"links": None, "topology": None, "errors": []}
    out = facts.get("nvlink")
    error = _tool_error(out, "nvidia-smi")
    if error is None and out is not None:
        try:
            status = parsers.parse_nvlink_status(out.stdout) if out.rc == 0 else None
            if status is None:
                view["errors"].append(f"nvlink -s: {out.first_error_line()}")
            else:
                view["links"] = [
                    {
                        "gpu": gpu,
                        "up": [link.link for link in links if link.active],
                        "down": [link.link for link in links if not link.active],
                        "speed_gbs": next((ln.speed_gbs for ln in links if ln.active), None),
                    }
                    for gpu, links in sorted(status.items())
                ]
        except parsers.ParseError as exc:
            view["errors"].append(f"nvlink -s: {exc}")
    elif error:
        view["errors"].append(error)
    topo = facts.get("topo")
    if topo is not None and topo.rc == 0:
        try:
            matrix = parsers.parse_topo_matrix(topo.stdout)
            devices = matrix.gpus + matrix.nics
            view["topology"] = {
                "devices": devices,
                "matrix": [
                    [("X" if a == b else matrix.links.get((a, b), "?")) for b in devices]
                    for a in devices
                ],
                "cpu_affinity": [matrix.cpu_affinity.get(d) for d in devices],
            }
        except parsers.ParseError as exc:
            view["errors"].append(f"topo -m: {exc}")
    elif topo is not None and not topo.missing:
        view["errors"].append(f"topo -m: {topo.first_error_line()}")
    return view


def _describe_lspci(facts: Mapping[str, Output]) -> list[dict[str, str]] | None:
    out = facts.get("lspci")
    if out is None or out.rc != 0:
        return None
    try:
        devices = parsers.parse_lspci(out.stdout)
    except parsers.ParseError:
        return None
    return [
        {"slot": d.slot, "class_code": d.class_code, "description": d.description}
        for d in devices
        if d.vendor_id == "10de" and d.class_code in ("0300", "0302")
    ]


def _describe_driver(
    facts: Mapping[str, Output], config: HostConfig, family: str | None
) -> dict[str, Any]:
    view: dict[str, Any] = {
        "expected": config.driver_version,
        "loaded": None,
        "packages": None,
        "errors": [],
    }
    module = facts.get("module_version")
    if module is not None and module.rc == 0 and module.stdout.strip():
        view["loaded"] = module.stdout.split()[0]
    out = facts.get("kernels")
    if out is not None and out.rc == 0:
        state = kernels.parse_kernel_state(out.stdout.splitlines())
        view["kernels"] = {
            "kernels": state.kernels,
            "dkms": state.dkms is not None,
            "lacking": kernels.kernels_lacking_module(state, config.driver_version),
        }
    if family is None:
        view["errors"].append("unknown OS family: driver packages not read")
        return view
    want = config.driver_packages(family)
    view["package_version"] = want.package_version
    dpkg: dict[str, parsers.DpkgPackage] = {}
    held: set[str] | None = None
    policy: dict[str, parsers.AptPolicy] | None = None
    try:
        out = facts.get("dpkg")
        if out is not None and out.rc == 0:
            dpkg = parsers.parse_dpkg_query(out.stdout)
        else:
            view["errors"].append("dpkg-query failed")
        out = facts.get("holds")
        if out is not None and out.rc == 0:
            held = parsers.parse_showhold(out.stdout)
        out = facts.get("policy")
        if out is not None and out.rc == 0:
            policy = parsers.parse_apt_policy(out.stdout)
    except parsers.ParseError as exc:
        view["errors"].append(str(exc))
    packages = []
    for name in want.installed:
        pkg = dpkg.get(name)
        packages.append(
            {
                "name": name,
                "installed": pkg.version if pkg and pkg.installed else None,
                "held": None if held is None else (name in held),
                "candidate": (
                    None if policy is None else (policy[name].candidate if name in policy else None)
                ),
            }
        )
    view["packages"] = packages
    view["holds_known"] = held is not None
    view["policy_known"] = policy is not None
    view["other_flavour"] = sorted(
        n for n in want.refused + want.forbidden if n in dpkg and dpkg[n].installed
    )
    return view


def _describe_cuda(facts: Mapping[str, Output], config: HostConfig) -> dict[str, Any]:
    view: dict[str, Any] = {
        "expected": config.cuda_version,
        "prefix": config.cuda["prefix"],
        "nvcc": None,
        "release": None,
        "usr_local_cuda": None,
    }
    out = facts.get("nvcc")
    if out is not None and out.rc == 0:
        lines = out.stdout.splitlines()
        view["nvcc"] = lines[0].strip() if lines else None
        with contextlib.suppress(parsers.ParseError):
            view["release"] = parsers.parse_nvcc_version(out.stdout).version
    link = facts.get("cuda_link")
    if link is not None and link.rc == 0 and link.stdout.strip():
        view["usr_local_cuda"] = link.stdout.strip()
    return view


def parse_systemctl_show(text: str) -> dict[str, dict[str, str]]:
    """`systemctl show -p Id,... UNIT...`: the properties of each unit (blocks separated by
    blank lines), by unit name without ".service"."""
    units: dict[str, dict[str, str]] = {}
    for block in text.replace("\r\n", "\n").split("\n\n"):
        props = dict(ln.split("=", 1) for ln in block.splitlines() if "=" in ln)
        if "Id" in props:
            units[props["Id"].removesuffix(".service")] = props
    return units


def _service(services: dict[str, dict[str, str]] | None, name: str) -> dict[str, Any]:
    if services is None or name not in services:
        return {"active": None, "enabled": None, "exists": None}
    props = services[name]
    return {
        "active": props.get("ActiveState"),
        "enabled": props.get("UnitFileState") or None,
        "exists": props.get("LoadState") != "not-found",
    }


def _describe_docker(facts: Mapping[str, Output], services: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "service": _service(services, "docker"),
        "version": None,
        "runtimes": None,
        "default_runtime": None,
        "error": None,
    }
    out = facts.get("docker_info")
    if out is None or out.missing:
        view["error"] = "docker not found"
        return view
    try:
        info = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
    except (ValueError, IndexError):
        info = {}
    if not info.get("ServerVersion"):
        view["error"] = "the Docker daemon does not answer: " + out.first_error_line()
        return view
    view["version"] = info.get("ServerVersion")
    view["runtimes"] = sorted(info.get("Runtimes") or {})
    view["default_runtime"] = info.get("DefaultRuntime")
    return view


def _describe_dcgm(facts: Mapping[str, Output], services: Any) -> dict[str, Any]:
    view: dict[str, Any] = {"service": _service(services, "nvidia-dcgm"), "gpus": None}
    out = facts.get("dcgm_discovery")
    error = _tool_error(out, "dcgmi")
    if error or out is None:
        view["error"] = error
        return view
    try:
        view["gpus"] = len(parsers.parse_dcgmi_discovery(out.stdout))
        view["error"] = None
    except parsers.ParseError:
        kind = parsers.parse_dcgmi_error(out.text)
        view["error"] = kind or out.first_error_line()
    return view


def _describe_backend(
    facts: Mapping[str, Output],
    config: HostConfig,
    services: Any,
    last_bench: dict[str, Any] | None = None,
) -> dict[str, Any]:
    unit = BACKEND_UNITS.get(config.backend)
    view: dict[str, Any] = {
        "backend": config.backend,
        "unit": unit,
        "model": config.model_alias,
        "url": f"http://{_api_address(config)}:{config.api_port}",
        "health": None,
        "last_bench": last_bench,
        "others_active": [
            u
            for u in BACKEND_UNITS.values()
            if u != unit and _service(services, u)["active"] == "active"
        ],
    }
    if unit is None:
        return view
    view["service"] = _service(services, unit)
    out = facts.get("health")
    if out is not None and out.stdout.strip().isdigit():
        view["health"] = int(out.stdout.strip())
    return view


def _describe_burnin(facts: Mapping[str, Output], now: datetime.datetime) -> dict[str, Any]:
    out = facts.get("burnin")
    if out is None or out.rc != 0:
        return {"record": False}
    try:
        record = json.loads(out.stdout)
        date = datetime.datetime.fromisoformat(record["date"])
    except (ValueError, KeyError, TypeError):
        return {"record": True, "error": f"{BURNIN_RECORD} is not a gpubox burn-in record"}
    gpus = (record.get("gpu_burn") or {}).get("gpus") or {}
    return {
        "record": True,
        "date": record["date"],
        "age_days": (now - date).days if date.tzinfo else None,
        "passed": bool(record.get("passed")),
        "gpus": gpus,
        "seconds": record.get("seconds"),
        "dcgm_diag": record.get("dcgm_diag"),
        "problems": record.get("problems") or [],
    }


def describe(
    config: HostConfig,
    facts: Mapping[str, Output],
    now: datetime.datetime | None = None,
    last_bench: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything doctor shows, read from the facts (pure; JSON-able). ``last_bench`` is the
    host's record from ``bench.load_record``, read on this machine by ``main``."""
    now = now or datetime.datetime.now(datetime.UTC)
    services = None
    out = facts.get("services")
    if out is not None and out.rc == 0:
        services = parse_systemctl_show(out.stdout)
    os_view = _describe_os(facts, config)
    family = os_view.get("family")
    return {
        "os": os_view,
        "gpus": _describe_gpus(facts),
        "lspci_gpus": _describe_lspci(facts),
        "nvlink": _describe_nvlink(facts),
        "driver": _describe_driver(facts, config, family),
        "persistenced": _service(services, "nvidia-persistenced"),
        "cuda": _describe_cuda(facts, config),
        "docker": _describe_docker(facts, services),
        "dcgm": _describe_dcgm(facts, services),
        "backend": _describe_backend(facts, config, services, last_bench),
        "burnin": _describe_burnin(facts, now),
    }


# --------------------------------------------------------------------------- evaluate


def evaluate(
    config: HostConfig,
    facts: Mapping[str, Output],
    inventory: str = "INVENTORY",
    now: datetime.datetime | None = None,
) -> list[Finding]:
    """Every deviation of the host from its configuration, each with its fix (pure)."""
    view = describe(config, facts, now)
    inv = shlex.quote(inventory)

    def deploy(stage: str) -> str:
        return f"pyinfra {inv} deploy/{stage}.py"

    found: list[Finding] = []
    add = lambda area, message, fix: found.append(Finding(area, message, fix))  # noqa: E731

    os_view = view["os"]
    if "error" in os_view:
        add("os", f"cannot read /etc/os-release: {os_view['error']}", "check the host's OS install")
    elif not os_view["supported"]:
        add(
            "os",
            f"unsupported OS {os_view['pretty_name']}",
            "gpubox supports Ubuntu 24.04 and Debian 12: reinstall the host with one of them",
        )

    _evaluate_gpus(config, view, add, deploy)
    _evaluate_nvlink(config, view, add)
    _evaluate_driver(config, view, add, deploy)
    _evaluate_cuda(view, add, deploy)
    _evaluate_services(config, view, add, deploy, inv)
    return found


Add = Callable[[str, str, str], None]


def _evaluate_gpus(config: HostConfig, view: dict[str, Any], add: Add, deploy: Any) -> None:
    smi = view["gpus"]
    model, want = config.gpu_model, config.gpu_count
    if smi["gpus"] is None:
        error = smi["error"]
        if error == "nvidia-smi not found":
            add("gpu", "nvidia-smi not found: no NVIDIA driver installed", deploy("driver"))
        elif error == "no_driver":
            add(
                "gpu",
                "nvidia-smi cannot talk to the driver: no NVIDIA kernel module loaded",
                f"{deploy('driver')} (reboots when allow_reboot; else sudo reboot)",
            )
        elif error == "version_mismatch":
            add(
                "gpu",
                "driver/library version mismatch: the loaded kernel module is not the installed "
                "driver",
                f"sudo reboot (or {deploy('driver')} with allow_reboot true)",
            )
        else:
            add("gpu", f"nvidia-smi fails: {smi.get('detail') or error}", deploy("driver"))
        return
    gpus = smi["gpus"]
    if len(gpus) < want:
        lspci = view["lspci_gpus"]
        seen = (
            f"; lspci shows {sum(d['class_code'] == '0302' for d in lspci)} NVIDIA 3D controller(s)"
            if lspci is not None
            else ""
        )
        add(
            "gpu",
            f"GPU missing: expected {want} {model}, found {len(gpus)}{seen}",
            "check the card/power/PCIe; lspci -d 10de:",
        )
    elif len(gpus) > want:
        add(
            "gpu",
            f"more GPUs than the inventory: expected {want}, found {len(gpus)}",
            f"set gpu_count = {len(gpus)} in the inventory",
        )
    for gpu in gpus:
        if gpu["name"] != model:
            add(
                "gpu",
                f"GPU {gpu['index']} is {gpu['name']}, expected {model}",
                "set gpu_model in the inventory, or check which card is installed",
            )
    if config.persistence_mode:
        for gpu in gpus:
            if gpu["persistence"] != "Enabled":
                add(
                    "gpu",
                    f"persistence mode off on GPU {gpu['index']}",
                    f"sudo systemctl restart nvidia-persistenced; {deploy('driver')}",
                )


def _evaluate_nvlink(config: HostConfig, view: dict[str, Any], add: Add) -> None:
    if not config.nvlink or view["gpus"]["gpus"] is None:
        return
    nv = view["nvlink"]
    want = config.nvlink_links
    fix = "reseat the NVLink bridge/board, check the GPUs' seating; nvidia-smi nvlink -s"
    if nv["links"] is not None:
        links = {entry["gpu"]: entry for entry in nv["links"]}
        for gpu in view["gpus"]["gpus"]:
            entry = links.get(gpu["index"])
            if not entry or not (entry["up"] or entry["down"]):
                add("nvlink", f"GPU {gpu['index']} reports no NVLink links", fix)
                continue
            up = len(entry["up"])
            if (want is None and up == 0) or (want is not None and up < want):
                expected = want if want is not None else "at least 1"
                add(
                    "nvlink",
                    f"NVLink link down on GPU {gpu['index']}: {up} active, expected {expected} "
                    f"(inactive: {', '.join(map(str, entry['down'])) or 'none'})",
                    fix,
                )
    topo = nv["topology"]
    if topo is not None:
        gpus = [d for d in topo["devices"] if d.startswith("GPU")]
        for i, a in enumerate(gpus):
            for j in range(i + 1, len(gpus)):
                relation = topo["matrix"][i][j]
                if not relation.startswith("NV"):
                    add("nvlink", f"{a} and {gpus[j]} not joined by NVLink ({relation})", fix)


def _evaluate_driver(config: HostConfig, view: dict[str, Any], add: Add, deploy: Any) -> None:
    drv = view["driver"]
    fix = deploy("driver")
    smi_versions = {g["driver_version"] for g in view["gpus"]["gpus"] or []}
    loaded = {drv["loaded"]} if drv["loaded"] else set()
    loaded |= {v for v in smi_versions if v}
    if loaded and loaded != {config.driver_version}:
        add(
            "driver",
            f"loaded driver {', '.join(sorted(loaded))}, configured {config.driver_version}",
            f"sudo reboot (or {fix} with allow_reboot true)",
        )
    kern = drv.get("kernels")
    if kern and kern["lacking"]:
        add(
            "driver",
            f"no NVIDIA {config.driver_version} module (dkms status) for kernel(s) "
            f"{', '.join(kern['lacking'])}: booting one of them gives no driver",
            f"{fix} (runs dkms autoinstall -k KERNEL, or installs that kernel's headers)",
        )
    packages = drv["packages"]
    if packages is None:
        return
    version = drv["package_version"]
    wrong = [p for p in packages if p["installed"] != version]
    if wrong:
        shown = ", ".join(f"{p['name']} {p['installed'] or 'not installed'}" for p in wrong[:4])
        more = f" and {len(wrong) - 4} more" if len(wrong) > 4 else ""
        add("driver", f"driver packages not at {version}: {shown}{more}", fix)
    if drv["holds_known"]:
        unheld = [p["name"] for p in packages if p["installed"] and not p["held"]]
        if unheld:
            add("driver", f"driver packages not held: {', '.join(unheld)}", fix)
    if drv["policy_known"]:
        cands = {p["candidate"] for p in packages if p["candidate"] != version}
        if cands:
            add(
                "driver",
                f"apt would install driver {', '.join(sorted(c or 'nothing' for c in cands))}, "
                f"not {version} (the pin is missing or broken)",
                fix,
            )
    if drv["other_flavour"]:
        add(
            "driver",
            f"installed but must not be: {', '.join(drv['other_flavour'])}",
            fix,
        )
    if config.persistence_mode and view["persistenced"]["active"] not in (None, "active"):
        add(
            "driver",
            f"nvidia-persistenced is {view['persistenced']['active']}",
            f"sudo systemctl start nvidia-persistenced; {fix}",
        )


def _evaluate_cuda(view: dict[str, Any], add: Add, deploy: Any) -> None:
    cuda = view["cuda"]
    fix = deploy("cuda")
    prefix = cuda["prefix"]
    if cuda["release"] is None:
        add("cuda", "no nvcc on a login shell's PATH", fix)
    elif not cuda["release"].startswith(cuda["expected"] + ".") or cuda["nvcc"] != (
        f"{prefix}/bin/nvcc"
    ):
        add(
            "cuda",
            f"login shell finds {cuda['nvcc']} (CUDA {cuda['release']}), expected "
            f"{prefix}/bin/nvcc (CUDA {cuda['expected']})",
            fix,
        )
    if cuda["usr_local_cuda"] != prefix:
        add(
            "cuda",
            f"/usr/local/cuda resolves to {cuda['usr_local_cuda'] or 'nothing'}, not {prefix}",
            fix,
        )


def _evaluate_services(
    config: HostConfig, view: dict[str, Any], add: Add, deploy: Any, inv: str
) -> None:
    docker = view["docker"]
    if docker["error"]:
        add("docker", docker["error"], f"sudo systemctl start docker; {deploy('docker')}")
    elif "nvidia" not in (docker["runtimes"] or []):
        add(
            "docker",
            f"Docker has no nvidia runtime (runtimes: {', '.join(docker['runtimes'] or [])})",
            deploy("container_toolkit"),
        )
    elif config.docker_default_runtime_nvidia and docker["default_runtime"] != "nvidia":
        add(
            "docker",
            f"Docker's default runtime is {docker['default_runtime']}, not nvidia",
            deploy("container_toolkit"),
        )

    dcgm = view["dcgm"]
    if dcgm["service"]["active"] not in (None, "active"):
        add(
            "dcgm",
            f"nvidia-dcgm is {dcgm['service']['active']}",
            f"sudo systemctl start nvidia-dcgm; {deploy('dcgm')}",
        )
    if dcgm["gpus"] is None:
        if dcgm.get("error") and dcgm["service"]["active"] in (None, "active"):
            add("dcgm", f"dcgmi discovery fails: {dcgm['error']}", deploy("dcgm"))
    elif view["gpus"]["gpus"] is not None and dcgm["gpus"] != len(view["gpus"]["gpus"]):
        add(
            "dcgm",
            f"DCGM discovers {dcgm['gpus']} GPU(s), nvidia-smi lists {len(view['gpus']['gpus'])}",
            "sudo systemctl restart nvidia-dcgm",
        )

    backend = view["backend"]
    unit = backend["unit"]
    for other in backend["others_active"]:
        add("backend", f"{other} runs too (backend is {config.backend})", deploy("backend"))
    if unit is not None:
        service = backend["service"]
        if service["active"] not in (None, "active"):
            add(
                "backend",
                f"{unit} is {service['active']}",
                f"journalctl -u {unit} -n 50; {deploy('backend')}",
            )
        elif backend["health"] != 200:
            add(
                "backend",
                f"/health answers {backend['health'] or 'nothing'} on {backend['url']}",
                f"journalctl -u {unit} -n 50; sudo systemctl restart {unit}",
            )

    burnin = view["burnin"]
    fix = f"gpubox burnin {inv}"
    if not burnin["record"]:
        if config.burnin_required:
            add("burnin", f"no burn-in record ({BURNIN_RECORD})", fix)
    elif "error" in burnin:
        add("burnin", burnin["error"], fix)
    elif not burnin["passed"]:
        add("burnin", f"the last burn-in failed: {'; '.join(burnin['problems'])}", fix)
    elif (
        config.burnin_required
        and burnin["age_days"] is not None
        and burnin["age_days"] > config.burnin_max_age_days
    ):
        add(
            "burnin",
            f"the last burn-in is {burnin['age_days']} days old "
            f"(burnin_max_age_days {config.burnin_max_age_days})",
            fix,
        )


# --------------------------------------------------------------------------- render


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value}"


def _num(value: float | int | None, unit: str) -> str:
    if value is None:
        return "?"
    return f"{value:.0f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def _apps(apps: list[dict[str, Any]] | None) -> str:
    if apps is None:
        return "apps ?"
    if not apps:
        return "no apps"
    return "apps " + ", ".join(f"{a['name']}({a['pid']}) {_mib(a['memory_mib'])} MiB" for a in apps)


def _state(service: dict[str, Any]) -> str:
    if service["active"] is None:
        return "?"
    if service["exists"] is False:
        return "not installed"
    enabled = f", {service['enabled']}" if service["enabled"] else ""
    return f"{service['active']}{enabled}"


def _ms(value: Any) -> str:
    return "?" if value is None else f"{value:.0f} ms" if value >= 100 else f"{value:.1f} ms"


def format_bench(record: dict[str, Any] | None, model: str | None = None) -> str:
    """'last bench 2026-11-30: 1 stream 65 tok/s, TTFT 120 ms, TPOT 15.2 ms; ...' (median TTFT
    and TPOT) or 'no bench yet'; the record's model is named when it is not ``model``."""
    if not record:
        return "no bench yet (gpubox bench --inventory INVENTORY)"
    parts = []
    for lv in record.get("levels") or []:
        n = lv.get("concurrency")
        tps = lv.get("output_throughput")
        part = (
            f"{n} stream{'' if n == 1 else 's'} "
            f"{'?' if tps is None else format(tps, '.0f')} tok/s, "
            f"TTFT {_ms(lv.get('median_ttft_ms'))}, TPOT {_ms(lv.get('median_tpot_ms'))}"
        )
        if lv.get("failed"):
            part += f", {lv['failed']} FAILED"
        parts.append(part)
    date = str(record.get("date") or "?")[:10]
    other = record.get("model")
    named = f" of model {other}" if other and other != model else ""
    text = f"last bench {date}{named}: " + ("; ".join(parts) or "no level measured")
    if isinstance(record.get("llama_bench"), dict):  # gpubox bench --llama-bench
        from gpubox.llamabench import summary_line

        text += "; " + summary_line(record["llama_bench"])
    return text


def render_text(host: str, view: dict[str, Any], findings: list[Finding]) -> str:
    """One screen for one host."""
    lines: list[str] = []
    w = lines.append
    os_view = view["os"]
    if "error" in os_view:
        w(f"== {host}: OS unknown ({os_view['error']}), kernel {os_view['kernel'] or '?'}")
    else:
        w(f"== {host}: {os_view['pretty_name']}, kernel {os_view['kernel'] or '?'}")

    smi = view["gpus"]
    if smi["gpus"] is None:
        w(f"GPUs      nvidia-smi: {smi.get('detail') or smi['error']}")
    else:
        versions = sorted({g["driver_version"] for g in smi["gpus"] if g["driver_version"]})
        w(f"GPUs      {len(smi['gpus'])} found, driver {', '.join(versions) or '?'}")
        for g in smi["gpus"]:
            pm = "on" if g["persistence"] == "Enabled" else "OFF"
            w(
                f"  GPU {g['index']}  {g['name']}  {g['bus_id']}  "
                f"mem {_mib(g['memory_used_mib'])}/{_mib(g['memory_total_mib'])} MiB  "
                f"{_num(g['temperature_c'], ' C')}  "
                f"{_num(g['power_draw_w'], '')}/{_num(g['power_limit_w'], ' W')}  "
                f"persistence {pm}  {_apps(g['apps'])}"
            )

    nv = view["nvlink"]
    if nv["links"] is not None:
        parts = [
            f"GPU {e['gpu']} {len(e['up'])} up"
            + (f" ({', '.join(map(str, e['up']))})" if e["up"] else "")
            + f", {len(e['down'])} down"
            for e in nv["links"]
        ]
        speed = next((e["speed_gbs"] for e in nv["links"] if e["speed_gbs"]), None)
        w("NVLink    " + "; ".join(parts) + (f"; {speed} GB/s per link" if speed else ""))
    else:
        w("NVLink    " + ("; ".join(nv["errors"]) or "?"))
    topo = nv["topology"]
    if topo is not None:
        devices = topo["devices"]
        width = max(6, *(len(d) + 2 for d in devices))
        w("  " + " " * width + "".join(d.ljust(width) for d in devices) + "CPU Affinity")
        for name, row, cpu in zip(devices, topo["matrix"], topo["cpu_affinity"], strict=True):
            w("  " + name.ljust(width) + "".join(c.ljust(width) for c in row) + (cpu or ""))

    drv = view["driver"]
    if drv["packages"] is None:
        w(f"Driver    loaded {drv['loaded'] or '?'}; packages unknown ({'; '.join(drv['errors'])})")
    else:
        packages = drv["packages"]
        installed = sorted({p["installed"] or "not installed" for p in packages})
        held = sum(bool(p["held"]) for p in packages)
        cands = sorted({p["candidate"] or "none" for p in packages})
        w(
            f"Driver    installed {', '.join(installed)}, loaded {drv['loaded'] or '?'}, "
            f"apt candidate {', '.join(cands) if drv['policy_known'] else '?'}, "
            f"held {held}/{len(packages) if drv['holds_known'] else '?'}; "
            f"nvidia-persistenced {_state(view['persistenced'])}"
        )
    kern = drv.get("kernels")
    if kern:
        built = [k for k in kern["kernels"] if k not in kern["lacking"]]
        w(
            f"Kernels   module built for {', '.join(built) or 'none'}"
            + (f"; MISSING for {', '.join(kern['lacking'])}" if kern["lacking"] else "")
            + ("" if kern["dkms"] else " (dkms not installed)")
        )

    cuda = view["cuda"]
    w(
        f"CUDA      nvcc {cuda['release'] or 'not found'}"
        + (f" ({cuda['nvcc']})" if cuda["nvcc"] else "")
        + f", /usr/local/cuda -> {cuda['usr_local_cuda'] or 'nothing'}"
    )

    docker = view["docker"]
    if docker["error"]:
        w(f"Docker    {_state(docker['service'])}: {docker['error']}")
    else:
        w(
            f"Docker    {_state(docker['service'])}, {docker['version']}, runtimes "
            f"{', '.join(docker['runtimes'] or [])} (default {docker['default_runtime']})"
        )

    dcgm = view["dcgm"]
    found = f"{dcgm['gpus']} GPU(s) discovered" if dcgm["gpus"] is not None else dcgm.get("error")
    w(f"DCGM      nvidia-dcgm {_state(dcgm['service'])}, {found}")

    backend = view["backend"]
    if backend["unit"] is None:
        w("Backend   none")
    else:
        w(
            f"Backend   {backend['backend']}: {backend['unit']} {_state(backend['service'])}, "
            f"/health {backend['health'] or 'no answer'}, model {backend['model']} "
            f"({backend['url']})"
        )
        w(f"          {format_bench(backend.get('last_bench'), backend['model'])}")

    burnin = view["burnin"]
    if not burnin["record"]:
        w("Burn-in   none recorded")
    elif "error" in burnin:
        w(f"Burn-in   {burnin['error']}")
    else:
        gpus = ", ".join(f"GPU {k} {v}" for k, v in sorted(burnin["gpus"].items()))
        age = f", {burnin['age_days']} day(s) ago" if burnin["age_days"] is not None else ""
        w(
            f"Burn-in   {'passed' if burnin['passed'] else 'FAILED'} {burnin['date']}{age} "
            f"({gpus or 'no GPU'})"
        )

    if findings:
        w(f"Warnings ({len(findings)}):")
        lines.extend(f"  ! {f}" for f in findings)
    else:
        w("OK: no deviation from the inventory")
    return "\n".join(lines) + "\n"


def host_report(host: str, view: dict[str, Any], findings: list[Finding]) -> dict[str, Any]:
    return {
        "host": host,
        "ok": not findings,
        "findings": [asdict(f) for f in findings],
        **view,
    }


def render_json(reports: list[dict[str, Any]]) -> str:
    """Every host's report as one JSON document."""
    return json.dumps({"hosts": reports}, indent=2, sort_keys=False) + "\n"


# --------------------------------------------------------------------------- main


def _runner(host: Any) -> Runner:
    def run(command: str) -> Output:
        result = host.run(command)
        return Output(result.rc, result.stdout, result.stderr, command)

    return run


def main(argv: list[str]) -> int:
    import testinfra

    from gpubox import inventory

    parser = argparse.ArgumentParser(
        prog="gpubox doctor",
        description="Show each host of the inventory on one screen, and every deviation from "
        "its configuration with the command that fixes it. Read-only.",
    )
    parser.add_argument("inventory")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    try:
        hosts = inventory.load(args.inventory)
    except Exception as exc:  # a broken inventory file is the user's to see, whole
        print(f"gpubox doctor: cannot read {args.inventory}: {exc}", file=sys.stderr)
        return 2
    if not hosts:
        print(f"gpubox doctor: {args.inventory} defines no hosts", file=sys.stderr)
        return 2
    configs: dict[str, HostConfig] = {}
    for name, data in hosts:
        try:
            configs[name] = load_host_config(name, data)
        except ConfigError as exc:
            print(f"gpubox doctor: {exc}\n(gpubox check {args.inventory})", file=sys.stderr)
            return 2
    reports = []
    deviations = False
    with tempfile.TemporaryDirectory(prefix="gpubox-doctor-") as tmp:
        ssh_config = Path(tmp) / "ssh_config"
        ssh_config.write_text("".join(inventory.ssh_config_entry(n, d) for n, d in hosts))
        for name, data in hosts:
            config = configs[name]
            host = testinfra.get_host(
                f"paramiko://{name}", ssh_config=str(ssh_config), sudo=inventory.uses_sudo(data)
            )
            try:
                facts = gather(_runner(host), config)
            except Unreachable as exc:
                finding = Finding(
                    "ssh", f"cannot reach {name}: {exc}", "check ssh_* in the inventory"
                )
                deviations = True
                if args.json:
                    reports.append({"host": name, "ok": False, "findings": [asdict(finding)]})
                else:
                    print(f"== {name}: unreachable\n  ! {finding}\n")
                continue
            url = bench.host_url(name, data.get("ssh_hostname"), config.api_port)
            view = describe(config, facts, last_bench=bench.load_record(name, url))
            findings = evaluate(config, facts, args.inventory)
            deviations = deviations or bool(findings)
            if args.json:
                reports.append(host_report(name, view, findings))
            else:
                print(render_text(name, view, findings))
    if args.json:
        print(render_json(reports), end="")
    return 1 if deviations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
