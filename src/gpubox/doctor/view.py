"""doctor's view of a host: everything it shows, read from the host's facts (pure, JSON-able):
OS, GPUs, NVLink, driver, CUDA, Docker, DCGM, backend and burn-in, with the last figures
`gpubox bench` kept for the host on this machine."""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Mapping
from typing import Any

from gpubox import kernels, layout, parsers, secure_boot
from gpubox.checks.core import Output
from gpubox.checks.facts import APPS_FIELDS, QUERY_FIELDS, api_base, parse_systemctl_show
from gpubox.config import HostConfig, target_for
from gpubox.parsers.secure_boot import parse_mok_state

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
    out = facts.get("health")
    if out is not None and out.stdout.strip().isdigit():
        view["health"] = int(out.stdout.strip())
    return view


def _describe_watchdog(facts: Mapping[str, Output], config: HostConfig) -> dict[str, Any]:
    """The watchdog's timer and its record: how often it restarted the server, the last time
    and why (gpubox.watchdog's state file)."""
    from gpubox.checks.watchdog import parse_watchdog

    view: dict[str, Any] = {
        "wanted": config.backend != "none" and config.watchdog,
        "active": None,
        "enabled": None,
        "restarts": None,
        "last_restart": None,
        "last_reason": None,
        "failures": None,
    }
    out = facts.get("watchdog")
    if out is None or out.rc != 0:
        return view
    read = parse_watchdog(out.stdout)
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


def _describe_panel(facts: Mapping[str, Output], config: HostConfig) -> dict[str, Any] | None:
    """The server panel (gpubox.panel), when the inventory asks for one: its version, units,
    port, agent socket and login page (never its entrance or password)."""
    from gpubox.panel import parse_state

    if config.panel == "none":
        return None
    out = facts.get("panel")
    if out is None or out.rc != 0:
        return {"error": "not read"}
    state = parse_state(out.stdout)
    return {
        "installed": state.installed,
        "version": state.installed_version,
        "units": {u: "/".join(state.unit(u)) for u in ("1panel-core", "1panel-agent")},
        "port": state.port,
        "socket": state.socket,
        "login": state.page == "login" and state.page_status == 200,
    }


def _describe_burnin(facts: Mapping[str, Output], now: datetime.datetime) -> dict[str, Any]:
    out = facts.get("burnin")
    if out is None or out.rc != 0:
        return {"record": False}
    try:
        record = json.loads(out.stdout)
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


def _describe_secure_boot(facts: Mapping[str, Output]) -> dict[str, Any]:
    """Secure Boot's state, DKMS's signing key (enrolled?), and the NVIDIA modules' signer and
    taint (gpubox.secure_boot)."""
    view: dict[str, Any] = {"enabled": None, "error": None}
    out = facts.get("sb_state")
    if out is None or out.rc != 0:
        view["error"] = "not read"
        return view
    try:
        view["enabled"] = parsers.parse_secure_boot(out.stdout)
    except parsers.ParseError as exc:
        view["error"] = str(exc)
        return view
    mok = facts.get("mok")
    if not view["enabled"] or mok is None or mok.rc != 0:
        return view
    try:
        state = parse_mok_state(mok.stdout)
    except parsers.ParseError as exc:
        view["error"] = str(exc)
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
        "secure_boot": _describe_secure_boot(facts),
        "persistenced": _service(services, "nvidia-persistenced"),
        "cuda": _describe_cuda(facts, config),
        "docker": _describe_docker(facts, services),
        "dcgm": _describe_dcgm(facts, services),
        "backend": _describe_backend(facts, config, services, last_bench),
        "watchdog": _describe_watchdog(facts, config),
        "panel": _describe_panel(facts, config),
        "burnin": _describe_burnin(facts, now),
    }
