"""doctor's screens: one per host (its view, then every failed check with its fix), and one
JSON document for all."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from gpubox import checks
from gpubox.bench.llamabench_results import summary_line
from gpubox.checks import Verdict
from gpubox.config import HostConfig

ACTIVE = sum(c.active for c in checks.ALL)


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
        text += "; " + summary_line(record["llama_bench"])
    return text


def format_watchdog(watchdog: dict[str, Any]) -> str:
    """The watchdog's line: its timer, how often it restarted the server, the last time."""
    state = f"timer {watchdog['active'] or 'unknown'}/{watchdog['enabled'] or 'not installed'}"
    if watchdog.get("error"):
        return f"{state}, {watchdog['error']}"
    if watchdog["restarts"] is None:
        return f"{state}, no run recorded yet"
    text = f"{state}, {watchdog['restarts']} restart(s)"
    if watchdog["last_restart"]:
        text += f", last {watchdog['last_restart']}: {watchdog['last_reason']}"
    if watchdog["failures"]:
        text += f"; {watchdog['failures']} failed probe(s) now"
    return text


def format_alerts(alerts: dict[str, Any]) -> str:
    """The alerts line: "GpuMissing (critical), BackendDown (critical)", "none", or why the
    monitor's Alertmanager could not say."""
    if alerts.get("error"):
        return f"? {alerts['error']}"
    firing = alerts.get("firing") or []
    if not firing:
        return "none"
    return ", ".join(f"{a['alert']} ({a['severity'] or 'no severity'})" for a in firing)


def format_panel(panel: dict[str, Any]) -> str:
    """The server panel's line: version, units, port, socket, login page."""
    if panel.get("error"):
        return f"1Panel: {panel['error']}"
    if not panel["installed"]:
        return "1Panel not installed"
    units = ", ".join(f"{u.removeprefix('1panel-')} {s}" for u, s in panel["units"].items())
    return (
        f"1Panel {panel['version'] or '?'}, {units}, port {panel['port'] or '?'}, agent socket "
        f"{'there' if panel['socket'] else 'MISSING'}, login page "
        f"{'answers' if panel['login'] else 'NOT answering'}"
    )


def render_text(host: str, view: dict[str, Any], verdicts: list[Verdict]) -> str:
    """One screen for one host: its view, then every failed check with its fix."""
    findings = [v for v in verdicts if v.failed]
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
    if drv.get("lifecycle"):
        w(f"          note: {drv['lifecycle']}")
    kern = drv.get("kernels")
    if kern:
        built = [k for k in kern["kernels"] if k not in kern["lacking"]]
        w(
            f"Kernels   module built for {', '.join(built) or 'none'}"
            + (f"; MISSING for {', '.join(kern['lacking'])}" if kern["lacking"] else "")
            + ("" if kern["dkms"] else " (dkms not installed)")
        )

    sb = view.get("secure_boot") or {}
    if sb.get("error"):
        w(f"SecureBoot ? ({sb['error']})")
    elif sb.get("enabled") is None:
        w("SecureBoot no EFI (BIOS boot or a container): not applicable")
    elif not sb["enabled"]:
        w("SecureBoot off")
    else:
        loaded = ", ".join(f"{n} {t}" for n, t in sorted((sb.get("loaded") or {}).items()))
        w(
            f"SecureBoot on; key {sb.get('certificate') or '?'} {sb.get('key') or '?'}"
            f" ('{sb.get('signer') or '?'}'); loaded {loaded or 'none'}"
            + ("; " + "; ".join(sb["problems"]) if sb.get("problems") else "; modules verified")
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

    watchdog = view.get("watchdog")
    if watchdog is not None and (watchdog["wanted"] or watchdog["active"] == "active"):
        w(f"Watchdog  {format_watchdog(watchdog)}")

    panel = view.get("panel")
    if panel is not None:
        w(f"Panel     {format_panel(panel)}")

    alerts = view.get("alerts")
    if alerts is not None:
        w(f"Alerts    {format_alerts(alerts)}")

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

    counts = {s: sum(v.status == s for v in verdicts) for s in ("pass", "fail", "error", "skip")}
    w(
        f"Checks    {counts['pass']} passed, {counts['fail'] + counts['error']} failed, "
        f"{counts['skip']} not applicable (the host checks run {ACTIVE} more that act on the "
        "box: pytest tests/host)"
    )
    if findings:
        w(f"Warnings ({len(findings)}):")
        lines.extend(f"  ! [{f.check}] {f}" for f in findings)
    else:
        w("OK: no deviation from the inventory")
    return "\n".join(lines) + "\n"


def host_report(host: str, view: dict[str, Any], verdicts: list[Verdict]) -> dict[str, Any]:
    findings = [v for v in verdicts if v.failed]
    return {
        "host": host,
        "ok": not findings,
        "findings": [asdict(f) for f in findings],
        "checks": {v.check: v.status for v in verdicts},
        **view,
    }


def render_json(reports: list[dict[str, Any]], fleet: list[dict[str, Any]] | None = None) -> str:
    """Every host's report as one JSON document, with the fleet table's rows."""
    document: dict[str, Any] = {"hosts": reports}
    if fleet is not None:
        document["fleet"] = fleet
    return json.dumps(document, indent=2, sort_keys=False) + "\n"


# --------------------------------------------------------------------------- the fleet

FLEET_COLUMNS = [
    ("host", "HOST"),
    ("os", "OS"),
    ("driver", "DRIVER inst/loaded"),
    ("gpus", "GPUS seen/want"),
    ("nvlink", "NVLINK"),
    ("backend", "BACKEND"),
    ("bench", "BENCH 1 stream"),
    ("burnin", "BURN-IN"),
    ("deviations", "DEVIATIONS"),
]


def fleet_row(
    host: str, config: HostConfig, view: dict[str, Any] | None, verdicts: list[Verdict]
) -> dict[str, Any]:
    """One host's line of the fleet table (JSON-able); ``view`` None: unreachable."""
    failed = sum(v.failed for v in verdicts)
    if view is None:
        return {
            "host": host,
            **{key: "-" for key, _ in FLEET_COLUMNS[1:-1]},
            "os": "unreachable",
            "deviations": "-",  # nothing judged
        }
    os_view = view["os"]
    if "error" in os_view:
        os_text = "?"
    else:
        os_text = f"{os_view.get('id', '?')} {os_view.get('version_id', '')}".strip()
    drv = view["driver"]
    installed = sorted({p["installed"] for p in drv["packages"] or [] if p["installed"]})
    version = ", ".join(v.split("-")[0] for v in installed) or "none"
    loaded = drv["loaded"] or "-"
    gpus = view["gpus"]["gpus"]
    seen = "?" if gpus is None else str(len(gpus))
    return {
        "host": host,
        "os": os_text,
        "driver": version if version == loaded else f"{version}/{loaded}",
        "gpus": f"{seen}/{config.gpu_count}",
        "nvlink": _fleet_nvlink(config, view),
        "backend": _fleet_backend(view["backend"]),
        "bench": _fleet_bench(view["backend"].get("last_bench")),
        "burnin": _fleet_burnin(view["burnin"]),
        "deviations": failed,
    }


def _fleet_nvlink(config: HostConfig, view: dict[str, Any]) -> str:
    if not config.nvlink:
        return "-"
    links = view["nvlink"]["links"]
    if links is None:
        return "?"
    want = config.nvlink_links
    up = [len(entry["up"]) for entry in links]
    worst = min(up) if up else 0
    ok = bool(up) and (worst == want if want is not None else worst > 0)
    return f"{worst}/{want if want is not None else '?'} up" + ("" if ok else " DOWN")


def _fleet_backend(backend: dict[str, Any]) -> str:
    if backend["unit"] is None:
        return "none"
    return f"{backend['backend']} {backend['health'] or 'no answer'}"


def _fleet_bench(record: dict[str, Any] | None) -> str:
    levels = (record or {}).get("levels") or []
    one = next((lv for lv in levels if lv.get("concurrency") == 1), levels[0] if levels else None)
    if not one or one.get("output_throughput") is None:
        return "-"
    return f"{one['output_throughput']:.0f} tok/s"


def _fleet_burnin(burnin: dict[str, Any]) -> str:
    if not burnin["record"]:
        return "none"
    if "error" in burnin:
        return "unreadable"
    age = f" {burnin['age_days']}d ago" if burnin.get("age_days") is not None else ""
    return ("passed" if burnin["passed"] else "FAILED") + age


def render_fleet(rows: list[dict[str, Any]]) -> str:
    """One table, a row per host, then a line that counts them."""
    widths = [
        max(len(title), *(len(str(row[key])) for row in rows)) for key, title in FLEET_COLUMNS
    ]
    lines = ["  ".join(t.ljust(w) for (_, t), w in zip(FLEET_COLUMNS, widths, strict=True))]
    for row in rows:
        cells = [str(row[key]) for key, _ in FLEET_COLUMNS]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    deviating = sum(1 for row in rows if row["deviations"] and row["os"] != "unreachable")
    unreachable = sum(1 for row in rows if row["os"] == "unreachable")
    fine = len(rows) - deviating - unreachable
    lines.append(
        f"{len(rows)} host(s): {fine} as the inventory says, {deviating} deviating"
        + (f", {unreachable} unreachable" if unreachable else "")
    )
    return "\n".join(lines) + "\n"
