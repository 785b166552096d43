"""doctor's view of a host: everything it shows, read from the host's facts (pure, JSON-able):
OS, GPUs, NVLink, driver, CUDA, Docker, DCGM, backend and burn-in, with the last figures
`gpubox bench` kept for the host on this machine. Each fact is read as the checks read it
(``checks.core.Reading``: the fact's own parser, gpubox.checks.facts); the raw output is
looked at only for why a fact could not be read."""

from __future__ import annotations

import datetime
import json
from typing import Any

from gpubox import parsers
from gpubox.base import kernels, layout
from gpubox.checks.core import FACTS, Facts, Output, Reading, Recorded, Unreadable
from gpubox.checks.facts import api_base
from gpubox.config import HostConfig, target_for
from gpubox.knowledge import secure_boot
from gpubox.knowledge.panel import PanelState
from gpubox.rules import driver_lifecycle

BACKEND_UNITS = layout.BACKEND_UNITS


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


def _read(r: Reading, name: str) -> tuple[Any, str | None]:
    """The fact as the checks read it: (its parsed value, None), or (None, why not): the
    command's first error line when it failed, the parser's complaint when its output does not
    parse, "not read" when it was not read on this host."""
    try:
        return r.get(name), None
    except Unreadable as exc:
        out = r.facts.get(name)
        if out is None:
            return None, "not read"
        if out.rc not in FACTS[name].ok:
            return None, out.first_error_line()
        return None, str(exc.__cause__ or exc)


def _value(r: Reading, name: str) -> Any:
    """The fact's parsed value, None when it cannot be read."""
    return _read(r, name)[0]


def _tool_error(out: Output | None, tool: str) -> str | None:
    """Why a command's output cannot be read, or None when it can."""
    if out is None:
        return "not run"
    if out.missing:
        return f"{tool} not found"
    return None


def _describe_os(r: Reading, config: HostConfig) -> dict[str, Any]:
    kernel = _value(r, "kernel")
    view: dict[str, Any] = {"kernel": kernel.strip() if kernel is not None else None}
    release, error = _read(r, "os_release")
    if error is not None:
        return {**view, "error": error}
    target = target_for(release, config.catalog)
    return {
        **view,
        "pretty_name": release.get("PRETTY_NAME", ""),
        "id": release.get("ID", ""),
        "version_id": release.get("VERSION_ID", ""),
        "supported": target is not None,
        "family": target.family if target else None,
    }


def _describe_gpus(r: Reading) -> dict[str, Any]:
    out = r.facts.get("smi_query")
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
    rows, error = _read(r, "smi_query")
    if error is not None:
        return {"error": "unreadable", "detail": error, "gpus": None}
    apps = _compute_apps(r)
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


def _compute_apps(r: Reading) -> dict[str, list[dict[str, Any]]] | None:
    """Compute apps by GPU UUID; None when nvidia-smi could not list them."""
    rows = _value(r, "smi_apps")
    if rows is None:
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


def _describe_nvlink(r: Reading) -> dict[str, Any]:
    view: dict[str, Any] = {"links": None, "topology": None, "errors": []}
    out = r.facts.get("nvlink")
    error = _tool_error(out, "nvidia-smi")
    if error is None and out is not None:
        status, why = _read(r, "nvlink")
        if why is not None:
            view["errors"].append(f"nvlink -s: {why}")
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
    elif error:
        view["errors"].append(error)
    topo = r.facts.get("topo")
    if topo is not None and not topo.missing:
        matrix, why = _read(r, "topo")
        if why is not None:
            view["errors"].append(f"topo -m: {why}")
        else:
            devices = matrix.gpus + matrix.nics
            view["topology"] = {
                "devices": devices,
                "matrix": [
                    [("X" if a == b else matrix.links.get((a, b), "?")) for b in devices]
                    for a in devices
                ],
                "cpu_affinity": [matrix.cpu_affinity.get(d) for d in devices],
            }
    return view


def _describe_lspci(r: Reading) -> list[dict[str, str]] | None:
    devices = _value(r, "lspci")
    if devices is None:
        return None
    return [
        {"slot": d.slot, "class_code": d.class_code, "description": d.description}
        for d in devices
        if d.vendor_id == "10de" and d.class_code in ("0300", "0302")
    ]


def _describe_driver(r: Reading, config: HostConfig, family: str | None) -> dict[str, Any]:
    view: dict[str, Any] = {
        "expected": config.driver_version,
        "loaded": None,
        "packages": None,
        "errors": [],
    }
    loaded = _value(r, "module_version")  # None: none loaded; "mismatch": nvidia-smi's word
    if loaded and loaded != "mismatch":
        view["loaded"] = loaded
    state = _value(r, "kernels")
    if state is not None:
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
    found, why = _read(r, "dpkg")
    dpkg: dict[str, parsers.DpkgPackage] = found or {}
    out = r.facts.get("dpkg")
    if why is not None:
        view["errors"].append("dpkg-query failed" if out is None or out.rc != 0 else why)
    held: set[str] | None = None
    policy: dict[str, parsers.AptPolicy] | None = None
    for name in ("holds", "policy"):
        found, why = _read(r, name)
        out = r.facts.get(name)
        if why is not None and out is not None and out.rc == 0:
            view["errors"].append(why)  # read, but not what its parser reads
        if name == "holds":
            held = found
        else:
            policy = found
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


def _describe_cuda(r: Reading, config: HostConfig) -> dict[str, Any]:
    view: dict[str, Any] = {
        "expected": config.cuda_version,
        "prefix": config.cuda["prefix"],
        "nvcc": None,
        "release": None,
        "usr_local_cuda": None,
    }
    out = r.facts.get("nvcc")
    if out is not None and out.rc == 0:
        lines = out.stdout.splitlines()
        view["nvcc"] = lines[0].strip() if lines else None  # `command -v nvcc`
        found = _value(r, "nvcc")
        view["release"] = found.version if found else None
    link, _ = _read(r, "cuda_link")
    out = r.facts.get("cuda_link")
    if link and link.strip() and out is not None and out.rc == 0:
        view["usr_local_cuda"] = link.strip()
    return view


def _service(services: dict[str, dict[str, str]] | None, name: str) -> dict[str, Any]:
    if services is None or name not in services:
        return {"active": None, "enabled": None, "exists": None}
    props = services[name]
    return {
        "active": props.get("ActiveState"),
        "enabled": props.get("UnitFileState") or None,
        "exists": props.get("LoadState") != "not-found",
    }


def _describe_docker(r: Reading, services: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "service": _service(services, "docker"),
        "version": None,
        "runtimes": None,
        "default_runtime": None,
        "error": None,
    }
    out = r.facts.get("docker_info")
    if out is None or out.missing:
        view["error"] = "docker not found"
        return view
    info = _value(r, "docker_info")
    if not isinstance(info, dict) or not info.get("ServerVersion"):
        view["error"] = "the Docker daemon does not answer: " + out.first_error_line()
        return view
    view["version"] = info.get("ServerVersion")
    view["runtimes"] = sorted(info.get("Runtimes") or {})
    view["default_runtime"] = info.get("DefaultRuntime")
    return view


def _describe_dcgm(r: Reading, services: Any) -> dict[str, Any]:
    view: dict[str, Any] = {"service": _service(services, "nvidia-dcgm"), "gpus": None}
    out = r.facts.get("dcgm_discovery")
    error = _tool_error(out, "dcgmi")
    if error or out is None:
        view["error"] = error
        return view
    gpus = _value(r, "dcgm_discovery")
    if gpus is not None:
        view["gpus"] = len(gpus)
        view["error"] = None
    else:  # why dcgmi could not list them, from its message
        view["error"] = parsers.parse_dcgmi_error(out.text) or out.first_error_line()
    return view


def _describe_backend(
    r: Reading,
    config: HostConfig,
    services: Any,
    last_bench: dict[str, Any] | None = None,
) -> dict[str, Any]:
    unit = BACKEND_UNITS.get(config.backend)
    view: dict[str, Any] = {
        "backend": config.backend,
        "unit": unit,
        "model": config.model_alias,
        "url": api_base(config),
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
    # curl's HTTP status ("000": no answer, curl failing), as the check backend.health reads it
    out = r.facts.get("health")
    if out is not None and out.stdout.strip().isdigit():
        view["health"] = int(out.stdout.strip())
    return view


def _describe_watchdog(r: Reading, config: HostConfig) -> dict[str, Any]:
    """The watchdog's timer and its record: how often it restarted the server, the last time
    and why (gpubox.knowledge.watchdog's state file)."""
    view: dict[str, Any] = {
        "wanted": config.backend != "none" and config.watchdog,
        "active": None,
        "enabled": None,
        "restarts": None,
        "last_restart": None,
        "last_reason": None,
        "failures": None,
    }
    read = _value(r, "watchdog")
    if read is None:
        return view
    timer, state = read["timer"], read["state"] or {}
    view["active"] = timer.get("ActiveState")
    view["enabled"] = timer.get("UnitFileState") or None
    if "error" in state:
        view["error"] = state["error"]
        return view
    if read["state"] is not None:
        view["restarts"] = _int(str(state.get("restarts", 0)))
        view["failures"] = _int(str(state.get("failures", 0)))
        view["last_restart"] = state.get("last_restart") or None
        view["last_reason"] = state.get("last_reason") or None
    return view


def _describe_panel(r: Reading, config: HostConfig) -> dict[str, Any] | None:
    """The server panel (gpubox.knowledge.panel), when the inventory asks for one: its version,
    units,
    port, agent socket and login page (never its entrance or password)."""
    if config.panel == "none":
        return None
    state: PanelState | None = _value(r, "panel")
    if state is None:
        return {"error": "not read"}
    return {
        "installed": state.installed,
        "version": state.installed_version,
        "units": {u: "/".join(state.unit(u)) for u in ("1panel-core", "1panel-agent")},
        "port": state.port,
        "socket": state.socket,
        "login": state.page == "login" and state.page_status == 200,
    }


def _describe_burnin(r: Reading, now: datetime.datetime) -> dict[str, Any]:
    text = _value(r, "burnin")  # the record file, as the check tools.burnin reads it
    if text is None:
        return {"record": False}
    try:
        record = json.loads(text)
        date = datetime.datetime.fromisoformat(record["date"])
    except (ValueError, KeyError, TypeError):
        return {"record": True, "error": f"{layout.BURNIN_RECORD} is not a gpubox burn-in record"}
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


def _describe_secure_boot(r: Reading) -> dict[str, Any]:
    """Secure Boot's state, DKMS's signing key (enrolled?), and the NVIDIA modules' signer and
    taint (gpubox.knowledge.secure_boot)."""
    view: dict[str, Any] = {"enabled": None, "error": None}
    out = r.facts.get("sb_state")
    if out is None or out.rc != 0:
        view["error"] = "not read"
        return view
    view["enabled"], why = _read(r, "sb_state")
    if why is not None:
        view["error"] = why
        return view
    mok = r.facts.get("mok")
    if not view["enabled"] or mok is None or mok.rc != 0:
        return view
    state, why = _read(r, "mok")
    if why is not None:
        view["error"] = why
        return view
    view.update(
        certificate=state.certificate,
        key=state.test_key,
        signer=state.certificate_info.subject_cn if state.certificate_info else None,
        modules=[{"path": m.path, "signer": m.signer, "sig_key": m.sig_key} for m in state.modules],
        loaded={m.name: m.taint for m in state.loaded},
        problems=secure_boot.module_problems(state),
    )
    return view


def describe(
    config: HostConfig,
    facts: Facts | Recorded,
    now: datetime.datetime | None = None,
    last_bench: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything doctor shows, read from the facts as the checks read them (pure; JSON-able).
    ``last_bench`` is the host's record from ``bench.load_record``, read on this machine by
    ``main``."""
    now = now or datetime.datetime.now(datetime.UTC)
    r = Reading(config, facts)
    services = _value(r, "services")
    os_view = _describe_os(r, config)
    family = os_view.get("family")
    driver = _describe_driver(r, config, family)
    note = driver_lifecycle.host_note(config, now.date())  # the pinned branch's, as check's
    driver["lifecycle"] = None if note is None else note.text
    return {
        "os": os_view,
        "gpus": _describe_gpus(r),
        "lspci_gpus": _describe_lspci(r),
        "nvlink": _describe_nvlink(r),
        "driver": driver,
        "secure_boot": _describe_secure_boot(r),
        "persistenced": _service(services, "nvidia-persistenced"),
        "cuda": _describe_cuda(r, config),
        "docker": _describe_docker(r, services),
        "dcgm": _describe_dcgm(r, services),
        "backend": _describe_backend(r, config, services, last_bench),
        "watchdog": _describe_watchdog(r, config),
        "panel": _describe_panel(r, config),
        "burnin": _describe_burnin(r, now),
    }
