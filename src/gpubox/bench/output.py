"""A report shown: the table `gpubox bench` prints (vLLM's labels, one column per concurrency
level) and the --plot figure (throughput and median TPOT against concurrency)."""

from __future__ import annotations

from typing import Any

ROWS: tuple[tuple[str, str, str], ...] = (
    ("Successful requests:", "completed", "d"),
    ("Failed requests:", "failed", "d"),
    ("Benchmark duration (s):", "duration", ".2f"),
    ("Total input tokens:", "total_input_tokens", "d"),
    ("Total generated tokens:", "total_output_tokens", "d"),
    ("Request throughput (req/s):", "request_throughput", ".2f"),
    ("Output token throughput (tok/s):", "output_throughput", ".2f"),
    ("Peak output token throughput (tok/s):", "max_output_tokens_per_s", ".2f"),
    ("Total token throughput (tok/s):", "total_token_throughput", ".2f"),
    *(
        (
            f"{stat.capitalize() if stat != 'p99' else 'P99'} {name.upper()} (ms):",
            f"{stat}_{name}_ms",
            ".2f",
        )
        for name in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "p99")
    ),
    ("Decode per request (tok/s, 1/TPOT):", "mean_decode_tps", ".2f"),
    ("Server-reported decode (tok/s):", "mean_server_decode_tps", ".2f"),
)


def format_table(report: dict[str, Any]) -> str:
    info = report["endpoint"]
    levels = report["levels"]
    version = f" {info['backend_version']}" if info.get("backend_version") else ""
    lines = [f"{info['url']}  model {info['model']}  backend {info.get('backend')}{version}"]
    header = "Maximum request concurrency:"
    lines.append(f"{header:<40}" + "".join(f"{lv['max_concurrency']:>12}" for lv in levels))
    for label, key, fmt in ROWS:
        cells = []
        for lv in levels:
            value = lv.get(key)
            cells.append(f"{'-' if value is None else format(value, fmt):>12}")
        lines.append(f"{label:<40}" + "".join(cells))
    for lv in levels:
        for error, count in lv.get("errors", {}).items():
            lines.append(f"  concurrency {lv['max_concurrency']}: {count} failed: {error}")
    return "\n".join(lines)


COMPARED: tuple[tuple[str, str, str], ...] = (
    ("output tok/s", "output_throughput", ".1f"),
    ("median TTFT (ms)", "median_ttft_ms", ".1f"),
    ("median TPOT (ms)", "median_tpot_ms", ".2f"),
    ("failed requests", "failed", "d"),
)


def format_comparison(reports: dict[str, dict[str, Any]]) -> str:
    """One table, a column per endpoint (host), a row per figure and concurrency level: the
    same seeded prompts on every host, side by side."""
    names = list(reports)
    levels = sorted({lv["max_concurrency"] for r in reports.values() for lv in r["levels"]})
    by_level = {
        name: {lv["max_concurrency"]: lv for lv in report["levels"]}
        for name, report in reports.items()
    }
    width = max(12, *(len(n) + 2 for n in names))
    label_width = max(len(f"{label}, {n} stream(s)") for label, _, _ in COMPARED for n in levels)
    lines = [" " * label_width + "".join(n.rjust(width) for n in names)]
    for label, key, fmt in COMPARED:
        for n in levels:
            cells = []
            for name in names:
                value = by_level[name].get(n, {}).get(key)
                cells.append(("-" if value is None else format(value, fmt)).rjust(width))
            lines.append(f"{label}, {n} stream(s)".ljust(label_width) + "".join(cells))
    return "\n".join(lines)


def write_plot(reports: dict[str, dict[str, Any]], path: str) -> str | None:
    """Output throughput and median TPOT against concurrency, two panels, one line per
    endpoint; an error message or None. matplotlib (the optional extra "plot") is imported
    here only, with the Agg backend: no display needed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            "--plot needs matplotlib, the optional extra 'plot' (pip install 'gpubox[plot]'); "
            "no plot was drawn"
        )

    def figure(value: Any) -> float:
        return float("nan") if value is None else float(value)  # a gap, never a fake 0

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    try:
        for name, report in reports.items():
            levels = report["levels"]
            label = name or report["endpoint"].get("url", "")
            xs = [lv["max_concurrency"] for lv in levels]
            ax1.plot(xs, [figure(lv.get("output_throughput")) for lv in levels], "o-", label=label)
            ax2.plot(xs, [figure(lv.get("median_tpot_ms")) for lv in levels], "o-", label=label)
        ax1.set(
            title="Output token throughput",
            xlabel="concurrency",
            ylabel="output token throughput (tok/s)",
        )
        ax2.set(title="Median TPOT", xlabel="concurrency", ylabel="median TPOT (ms)")
        ticks = sorted({lv["max_concurrency"] for r in reports.values() for lv in r["levels"]})
        for ax in (ax1, ax2):
            ax.set_xticks(ticks)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(path, format="png")
    except OSError as exc:
        return f"cannot write --plot {path}: {exc}"
    finally:
        plt.close(fig)
    return None
