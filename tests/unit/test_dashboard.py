"""gpubox's Grafana dashboard (src/gpubox/files/monitoring/dashboard.json, issue 31 D):

- every query is PromQL that Prometheus parses: `promtool check rules` on a rules file with one
  recording rule per query (promtool has no command that parses a bare query; a rule's
  expression is parsed by Prometheus's own parser), with a broken query shown to fail it;
- every query selects its boxes by the template variable (host=~"$host") in every selector;
- every metric name is one its source defines: gpubox's (knowledge/metrics.py), the rules'
  recordings (alerts.yml), Prometheus's `up`, dcgm-exporter's default counters at the pinned tag
  or those docs/monitoring.md says gpubox's counters file enables, the node exporter's that
  docs/monitoring.md lists, llama.cpp's and vLLM's as their pinned sources declare them
  (tests/fixtures/metrics/, each naming its file and commit);
- the panels' JSON: the datasource uid the Grafana stage provisions, targets with refId and expr,
  gridPos inside the 24 columns without overlaps, rows for the four areas;
- ``knowledge.dashboard.queries`` returns each area's and backend's queries, substituted."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_alert_rules import promtool, run

from gpubox.knowledge import dashboard as board
from gpubox.knowledge import metrics

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "metrics"
RULES = ROOT / "src" / "gpubox" / "files" / "monitoring" / "alerts.yml"
DOC = ROOT / "docs" / "monitoring.md"
LLAMACPP = FIXTURES / "llamacpp-0c1e570_server-task.txt"
VLLM = FIXTURES / "vllm-0.19.1_loggers.txt"
DCGM = FIXTURES / "dcgm-exporter-4.4.1-4.6.0_default-counters.txt"
LLAMACPP_REAL = ROOT / "tests" / "fixtures" / "watchdog" / "llamacpp-metrics-idle.txt"


@cache
def dashboard() -> dict[str, Any]:
    return board.load()


def declared(path: Path) -> dict[str, str]:
    """A fixture's TYPE NAME lines: name -> type."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            kind, name = line.split()
            out[name] = kind
    return out


def prometheus_client_names(name: str, kind: str) -> set[str]:
    """The names prometheus_client serves for a metric declared as ``name`` (vLLM's library)."""
    if kind == "counter":
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    return {name}


def vllm_names() -> set[str]:
    return {n for name, kind in declared(VLLM).items() for n in prometheus_client_names(name, kind)}


def enabled_dcgm_names() -> set[str]:
    """The counters docs/monitoring.md says gpubox's counters file enables: the names of its
    paragraph "dcgm-exporter's counters." (not the whole page: the dashboard's own section names
    the dashboard's names, which would vouch for themselves)."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("**dcgm-exporter's counters.**")
    paragraph = text[start : text.index("\n\n", start)]
    return set(re.findall(r"`(DCGM_[A-Z0-9_]+)", paragraph))


def node_exporter_names() -> set[str]:
    """The node exporter's names docs/monitoring.md's sources table lists in its row."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    rows = [r for r in lines if r.startswith("| node exporter")]
    assert rows, "docs/monitoring.md's sources table has no node exporter row"
    return set(re.findall(r"`(node_[a-z_]+)`", rows[0]))


def recorded_names() -> set[str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def known_names() -> dict[str, str]:
    """Every metric name the dashboard may read -> its source."""
    known: dict[str, str] = {"up": "Prometheus"}
    known |= {n: "gpubox (knowledge/metrics.py)" for n in metrics.BY_NAME}
    known |= {n: "gpubox's rules (alerts.yml)" for n in recorded_names()}
    dcgm = {n for n, kind in declared(DCGM).items() if kind != "label"}
    known |= {n: "dcgm-exporter's default counters" for n in dcgm}
    known |= {
        n: "dcgm-exporter, enabled by gpubox's counters file (docs/monitoring.md)"
        for n in enabled_dcgm_names() - dcgm
    }
    known |= {n: "node exporter (docs/monitoring.md)" for n in node_exporter_names()}
    known |= {n: "llama.cpp (tests/fixtures/metrics)" for n in declared(LLAMACPP)}
    known |= {n: "vLLM (tests/fixtures/metrics)" for n in vllm_names()}
    return known


def names_of(dash: dict[str, Any]) -> set[str]:
    return {n for q in board.all_queries(dash) for n in board.metric_names(q.expr)}


# --------------------------------------------------------------------------- PromQL


def rules_file(exprs: list[str], path: Path) -> Path:
    rules = [{"record": f"gpubox_dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return path


def test_every_query_is_promql_that_prometheus_parses(tmp_path: Path) -> None:
    exprs = [q.promql() for q in board.all_queries(dashboard())]
    assert len(exprs) >= 20
    done = run("check", "rules", str(rules_file(exprs, tmp_path / "dashboard.yml")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout, done.stdout


def test_the_parse_check_fails_a_broken_query(tmp_path: Path) -> None:
    """Teeth: an unclosed parenthesis, and a query left with Grafana's own variables."""
    good = board.all_queries(dashboard())[0]
    for expr in (good.promql() + ")", good.expr.replace('"$host"', "$host")):
        done = run("check", "rules", str(rules_file([expr], tmp_path / "broken.yml")))
        assert done.returncode != 0, expr


def test_the_substitution_leaves_no_grafana_variable() -> None:
    for q in board.all_queries(dashboard()):
        assert "$" not in q.promql(host="box1|box2", window="2m"), q


def test_every_selector_selects_the_boxes_of_the_host_variable() -> None:
    bare = [
        (q.panel, q.ref_id, name, matchers)
        for q in board.all_queries(dashboard())
        for name, matchers in board.selectors(q.expr)
        if board.HOST_SELECTOR not in matchers
    ]
    assert bare == []


def test_the_selector_check_finds_one_without_the_host() -> None:
    expr = 'sum by (host) (rate(x_total{host=~"$host"}[5m])) / on (host) y{job="node"}'
    assert board.selectors(expr) == [("x_total", '{host=~"$host"}'), ("y", '{job="node"}')]


def test_metric_names_leave_out_functions_labels_and_groupings() -> None:
    expr = (
        'histogram_quantile(0.5, sum by (host, le) (rate(vllm:ttft_bucket{host=~"$host", '
        'job="up"}[$__rate_interval]))) * on (host, mountpoint) group_left () max by (host) '
        "(gpubox_model_volume_info) or up"
    )
    assert board.metric_names(expr) == {"vllm:ttft_bucket", "gpubox_model_volume_info", "up"}


# --------------------------------------------------------------------------- names


def test_every_metric_name_is_one_its_source_defines() -> None:
    known = known_names()
    assert sorted(names_of(dashboard()) - set(known)) == []


def test_the_name_check_refuses_a_misspelt_name() -> None:
    dash = dashboard()
    wrong = {
        "panels": [
            {"type": "row", "title": "Serving"},
            {
                "type": "timeseries",
                "title": "x",
                "targets": [{"refId": "A", "expr": 'vllm:num_requests_runing{host=~"$host"}'}],
            },
        ]
    }
    assert names_of(wrong) - set(known_names()) == {"vllm:num_requests_runing"}
    assert names_of(dash)  # the real one reads names at all


def test_the_vllm_names_are_vllm_0_19_1s() -> None:
    """vLLM does not run in the sandbox: its names are checked against its pinned source."""
    used = {n for n in names_of(dashboard()) if n.startswith("vllm:")}
    assert used, "the dashboard reads no vLLM metric"
    assert sorted(used - vllm_names()) == []
    # the names gpubox's rules read too
    assert {"vllm:inter_token_latency_seconds_sum", "vllm:request_success_total"} <= vllm_names()


def test_the_vllm_record_names_its_source_and_commit() -> None:
    head = VLLM.read_text(encoding="utf-8")
    assert "vllm/v1/metrics/loggers.py" in head and "b1388b1fb" in head and "v0.19.1" in head
    from gpubox import catalog

    assert catalog.load()["vllm"]["image"].endswith(":v0.19.1")
    assert declared(VLLM)["vllm:time_to_first_token_seconds"] == "histogram"
    assert declared(VLLM)["vllm:num_requests_waiting"] == "gauge"


def test_the_llamacpp_record_is_what_the_real_server_serves() -> None:
    """The names read from the pinned commit's source are those the real llama-server of that
    commit served in the sandbox (but the labelled one, printed only with speculative decoding)."""
    from gpubox import catalog

    head = LLAMACPP.read_text(encoding="utf-8")
    assert catalog.load()["llamacpp"]["commit"] in head and "server-task.cpp" in head
    real = {
        line.split()[0].split("{")[0]
        for line in LLAMACPP_REAL.read_text(encoding="utf-8").splitlines()
        if line.startswith("llamacpp:")
    }
    assert real == set(declared(LLAMACPP)) - {
        "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
    }


def test_the_llamacpp_panels_read_names_the_real_server_serves() -> None:
    used = {n for n in names_of(dashboard()) if n.startswith("llamacpp:")}
    assert {"llamacpp:tokens_predicted_total", "llamacpp:requests_processing"} <= used
    assert sorted(used - set(declared(LLAMACPP))) == []


def test_every_dcgm_name_is_served_by_default_or_enabled_by_gpubox() -> None:
    """The pinned exporter serves its default counters and those gpubox's counters file adds
    (docs/monitoring.md lists them): nothing else."""
    dcgm = {n for n in names_of(dashboard()) if n.startswith("DCGM_")}
    defaults = set(declared(DCGM))
    enabled = enabled_dcgm_names()
    assert "DCGM_EXP_GPU_HEALTH_STATUS" in enabled and "DCGM_FI_DEV_GPU_UTIL" not in enabled
    assert sorted(dcgm - defaults - enabled) == []
    wanted = {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    }
    assert wanted <= dcgm and wanted <= defaults


def test_the_docs_name_every_panels_metric() -> None:
    """docs/monitoring.md's dashboard section names each metric a panel reads."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## The dashboard") :]
    section = section[: section.find("\n## ", 1)]
    missing = sorted(n for n in names_of(dashboard()) if f"`{n}" not in section)
    assert missing == []


# --------------------------------------------------------------------------- the JSON


def test_the_dashboard_is_grafana_11s_with_the_host_variable() -> None:
    dash = dashboard()
    assert dash["schemaVersion"] >= 39 and dash["uid"] and dash["title"]
    (variable,) = dash["templating"]["list"]
    assert variable["name"] == "host" and variable["type"] == "query"
    assert variable["datasource"] == board.DATASOURCE
    query = variable["query"]
    assert (query["query"] if isinstance(query, dict) else query) == "label_values(up, host)"
    assert variable["multi"] is True and variable["includeAll"] is True


def test_every_panel_has_the_datasource_targets_and_a_place() -> None:
    taken: set[tuple[int, int]] = set()
    for _area, panel in board.panels(dashboard()):
        title = panel["title"]
        assert panel["datasource"] == board.DATASOURCE, title
        assert panel["targets"], title
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs), title
        for target in panel["targets"]:
            assert target["datasource"] == board.DATASOURCE, title
            assert target["refId"] and target["expr"].strip(), title
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), title
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, title
        cells = {(grid["x"] + i, grid["y"] + j) for i in range(grid["w"]) for j in range(grid["h"])}
        assert not cells & taken, f"{title} overlaps another panel"
        taken |= cells
        assert panel.get("description"), f"{title}: its description names its metrics' source"
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(set(ids)) == len(ids)


def test_the_rows_are_the_four_areas() -> None:
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows == list(board.AREAS)
    assert {area for area, _ in board.panels(dashboard())} == set(board.AREAS.values())


def test_a_panel_above_the_first_row_or_an_unknown_row_is_refused() -> None:
    with pytest.raises(ValueError, match="above the first row"):
        list(board.panels({"panels": [{"type": "timeseries", "title": "x"}]}))
    with pytest.raises(ValueError, match="not one of the areas"):
        list(board.panels({"panels": [{"type": "row", "title": "Other"}]}))


# --------------------------------------------------------------------------- queries()


def test_queries_by_area_and_backend() -> None:
    dash = dashboard()
    gpu = board.queries(dash, "gpu")
    titles = {title for title, _ in gpu}
    assert {"GPU utilization", "GPU memory", "GPU temperature", "GPU power"} <= titles
    assert any("NVLink" in t for t in titles)
    assert all('host=~".*"' in expr and "$" not in expr for _, expr in gpu)
    llamacpp = board.queries(dash, "llamacpp", host="box-1|box-3", window="1m")
    assert llamacpp and all("llamacpp:" in e and "vllm:" not in e for _, e in llamacpp)
    assert all('host=~"box-1|box-3"' in e for _, e in llamacpp)
    assert any("[1m]" in e for _, e in llamacpp)
    vllm = board.queries(dash, "vllm")
    assert vllm and all("vllm:" in e and "llamacpp:" not in e for _, e in vllm)
    assert {t for t, _ in vllm} >= {"Time to first token (vLLM)", "Requests running and waiting"}
    for kind in ("watchdog", "disk", "serving"):
        assert board.queries(dash, kind), kind
    with pytest.raises(ValueError, match="kind must be one of"):
        board.queries(dash, "gpus")


def test_a_query_of_both_backends_is_refused() -> None:
    with pytest.raises(ValueError, match="both backends"):
        board.backend_of("llamacpp:a_total + vllm:b_total")


def test_promtool_is_there() -> None:
    assert Path(promtool()).is_file()


# --------------------------------------------------------------------------- real /metrics


def scraped(path: Path, host: str, job: str, instance: str) -> list[dict[str, str]]:
    """promtool input series for a real /metrics text as Prometheus scrapes it every minute for
    ten minutes: each sample line with the target's labels (host, job, instance), its value kept."""
    series = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        own = labels.rstrip("}")
        target = f'host="{host}",job="{job}",instance="{instance}"'
        series.append(
            {"series": f"{name}{{{target}{',' + own if own else ''}}}", "values": f"{value}x10"}
        )
    return series


def test_every_llamacpp_query_returns_series_on_the_real_servers_metrics(tmp_path: Path) -> None:
    """What the sandbox's integration test asks of Prometheus, asked of promtool: each llama.cpp
    query, on the real llama-server's /metrics (tests/fixtures/watchdog, the pinned build),
    returns at least one series (`count(QUERY) > bool 0` is 1, never absent)."""
    queries = board.queries(dashboard(), "llamacpp", host="box1|box3", window="5m")
    assert queries
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "llama.cpp's panels",
                "interval": "1m",
                "input_series": scraped(LLAMACPP_REAL, "box1", "backend", "127.0.0.1:8080"),
                "promql_expr_test": [
                    {
                        "expr": f"count({expr}) > bool 0",
                        "eval_time": "10m",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    }
                    for _, expr in queries
                ],
            }
        ],
    }
    path = tmp_path / "llamacpp_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = run("test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    # teeth: a box the host regex does not select returns nothing
    other = board.queries(dashboard(), "llamacpp", host="box2")
    tests["tests"][0]["promql_expr_test"] = [
        {
            "expr": f"count({e}) > bool 0",
            "eval_time": "10m",
            "exp_samples": [{"labels": "{}", "value": 1}],
        }
        for _, e in other[:1]
    ]
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    assert run("test", "rules", str(path)).returncode != 0
