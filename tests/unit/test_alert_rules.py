"""gpubox's alert rules (src/gpubox/files/monitoring/alerts.yml), tested by promtool, the real
one: Debian 12's prometheus package, unpacked by `make promtool` (.ci/promtool) and never
installed. Without it these tests fail, they do not skip: run `make promtool`, or set
GPUBOX_PROMTOOL.

- `promtool check rules` passes, and `promtool test rules` runs tests/monitoring/*_test.yml;
- every alert has a promtool case that fires it and one that does not (the YAML read), and
  both have teeth: with the rule's expression made never to fire its firing case fails, made
  always to fire its quiet case fails;
- every alert keeps the host label (each expected alert in the cases carries it, and promtool
  compares whole label sets), has a severity, and its annotations say what to run next: a
  gpubox command that exists, a check id of `gpubox checks`, a page of docs/;
- the rules name gpubox's metrics and jobs as knowledge/metrics.py defines them;
- docs/monitoring.md's rules table is this file's (``python tests/unit/test_alert_rules.py``
  prints it)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpubox import checks, cli
from gpubox.knowledge import metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "src" / "gpubox" / "files" / "monitoring" / "alerts.yml"
CASES = sorted((ROOT / "tests" / "monitoring").glob("*_test.yml"))
DOC = ROOT / "docs" / "monitoring.md"
BEGIN = "<!-- the rules table: python tests/unit/test_alert_rules.py prints it -->"
END = "<!-- end of the rules table -->"
SEVERITIES = ("critical", "warning", "info")
ANNOTATIONS = ("summary", "description", "next_step")


def promtool() -> str:
    given = os.environ.get("GPUBOX_PROMTOOL")
    if given:
        return given
    cache_dir = Path(os.environ.get("GPUBOX_CACHE_DIR") or Path.home() / ".cache" / "gpubox")
    tool = cache_dir / "promtool" / "root" / "usr" / "bin" / "promtool"
    if tool.is_file():
        return str(tool)
    pytest.fail(
        f"promtool is not at {tool}: run `make promtool` (.ci/promtool unpacks Debian 12's "
        "prometheus package there), or set GPUBOX_PROMTOOL to a promtool 2.42"
    )


def run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *argv], input=stdin, capture_output=True, text=True, timeout=300
    )


@cache
def groups() -> list[dict[str, Any]]:
    return yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]


def alerts() -> list[dict[str, Any]]:
    return [rule for group in groups() for rule in group["rules"] if "alert" in rule]


ALERT_NAMES = [rule["alert"] for rule in alerts()]


@cache
def case_files() -> dict[Path, dict[str, Any]]:
    return {path: yaml.safe_load(path.read_text(encoding="utf-8")) for path in CASES}


def cases_of(alert: str) -> tuple[list[tuple[Path, dict[str, Any]]], list[str], list[str]]:
    """The promtool test groups that evaluate ``alert`` (with their file), and the names of
    those that expect it to fire and of those that expect it quiet."""
    found, firing, quiet = [], [], []
    for path, data in case_files().items():
        for group in data["tests"]:
            evals = [t for t in group.get("alert_rule_test") or [] if t["alertname"] == alert]
            if not evals:
                continue
            found.append((path, group))
            if any(t.get("exp_alerts") for t in evals):
                firing.append(group["name"])
            if any(not t.get("exp_alerts") for t in evals):
                quiet.append(group["name"])
    return found, firing, quiet


# --------------------------------------------------------------------------- promtool


def test_promtool_checks_the_rules() -> None:
    done = run("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_runs_every_rules_test() -> None:
    done = run("test", "rules", *map(str, CASES))
    assert done.returncode == 0, done.stdout + done.stderr


def mutant(alert: str, expr: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on ``alert``'s own cases, with its expression replaced by ``expr``."""
    data = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in data["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = expr
    rules = tmp_path / "alerts.yml"
    rules.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    found, _, _ = cases_of(alert)
    files = []
    for path in {path for path, _ in found}:
        test = {
            "rule_files": [str(rules)],
            "evaluation_interval": case_files()[path].get("evaluation_interval", "1m"),
            "tests": [group for p, group in found if p == path],
        }
        files.append(tmp_path / path.name)
        files[-1].write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    return run("test", "rules", *map(str, files))


@pytest.mark.parametrize("alert", ALERT_NAMES)
def test_every_rule_has_a_case_that_fires_it_and_one_that_does_not(
    alert: str, tmp_path: Path
) -> None:
    _, firing, quiet = cases_of(alert)
    assert firing, f"{alert}: no promtool case expects it to fire (tests/monitoring/)"
    assert quiet, f"{alert}: no promtool case expects it quiet (tests/monitoring/)"
    # The cases have teeth: a rule that never fires fails its firing cases ...
    never = mutant(alert, "vector(0) > 1", tmp_path)
    assert never.returncode != 0, f"{alert}: its cases pass with a rule that never fires"
    for name in firing:
        assert f"name: {name}," in never.stderr, (name, never.stdout + never.stderr)
    # ... and one that always fires fails its quiet cases.
    always = mutant(alert, 'label_replace(vector(1), "host", "mutant", "", "")', tmp_path)
    assert always.returncode != 0, f"{alert}: its cases pass with a rule that always fires"
    for name in quiet:
        assert f"name: {name}," in always.stderr, (name, always.stdout + always.stderr)


def test_every_case_is_about_a_rule() -> None:
    for data in case_files().values():
        for group in data["tests"]:
            for test in group.get("alert_rule_test") or []:
                assert test["alertname"] in ALERT_NAMES, (group["name"], test["alertname"])


# --------------------------------------------------------------------------- labels, annotations


def test_every_alert_the_cases_expect_carries_the_host_label() -> None:
    """promtool compares whole label sets, so each rule's alerts carry ``host``."""
    for data in case_files().values():
        for group in data["tests"]:
            for test in group.get("alert_rule_test") or []:
                for alert in test.get("exp_alerts") or []:
                    assert metrics.HOST_LABEL in alert["exp_labels"], group["name"]


@pytest.mark.parametrize("alert", ALERT_NAMES)
def test_every_rule_has_a_severity_and_says_what_to_run_next(alert: str) -> None:
    rule = next(r for r in alerts() if r["alert"] == alert)
    assert rule.get("labels", {}).get("severity") in SEVERITIES, alert
    annotations = rule.get("annotations", {})
    assert set(ANNOTATIONS) <= set(annotations), (alert, sorted(annotations))
    assert "{{ $labels.host }}" in annotations["summary"], alert
    steps = next_steps(annotations["next_step"])
    assert steps, f"{alert}: next_step names no gpubox command, check or docs page"
    assert not [s for s in steps if s.startswith("unknown")], (alert, steps)


def next_steps(text: str) -> list[str]:
    """The gpubox commands, check ids and docs pages a next_step names ('unknown ...' for one
    that does not exist)."""
    text = " ".join(text.split())
    found = []
    commands = gpubox_commands()
    for command in re.findall(r"\bgpubox ([a-z-]+)", text):
        found.append(f"gpubox {command}" if command in commands else f"unknown command {command}")
    ids = {check.id for check in checks.ALL}
    for selector in re.findall(r" -k ([\w.-]+)", text):
        known = selector in ids or any(i.startswith(selector + ".") for i in ids)
        found.append(f"check {selector}" if known else f"unknown check {selector}")
    for page, anchor in re.findall(r"\bdocs/([\w-]+\.md)(?:#([\w-]+))?", text):
        path = ROOT / "docs" / page
        if not path.is_file():
            found.append(f"unknown page docs/{page}")
        elif anchor and anchor not in anchors(path.read_text(encoding="utf-8")):
            found.append(f"unknown anchor docs/{page}#{anchor}")
        else:
            found.append(f"docs/{page}")
    return found


@cache
def gpubox_commands() -> set[str]:
    """The subcommands `gpubox --help` lists."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cli.main(["--help"])
    choices = re.search(r"\{([a-z,-]+)\}", out.getvalue())
    assert choices, out.getvalue()
    return set(choices.group(1).split(","))


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings (those of tests/unit/test_docs_keys.py)."""
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower())
        found.add(slug.replace(" ", "-"))
    return found


# --------------------------------------------------------------------------- metric names


METRIC = r"\b(?:DCGM_\w+|llamacpp:\w+|vllm:\w+|node_\w+|gpubox[_:][\w:]+|up)\b"


def named_metrics(expr: str) -> list[str]:
    """The metric names an expression reads (the prefixes of the sources this file uses;
    ``{__name__=~"a_(b|c)_d"}`` expanded to a_b_d, a_c_d)."""
    names = []
    for pattern in re.findall(r'__name__=~"([^"]+)"', expr):
        head, alternatives, tail = re.match(r"^(.*)\((.*)\)(.*)$", pattern).groups()  # type: ignore[union-attr]
        names += [head + alternative + tail for alternative in alternatives.split("|")]
    expr = re.sub(r"\{[^}]*\}", "", expr)
    names += re.findall(METRIC, expr)
    return list(dict.fromkeys(names))


def test_the_rules_name_gpuboxs_metrics_and_jobs_as_metrics_py_defines_them() -> None:
    recorded = {rule["record"] for group in groups() for rule in group["rules"] if "record" in rule}
    for group in groups():
        for rule in group["rules"]:
            for name in named_metrics(rule["expr"]):
                if name.startswith("gpubox_"):
                    assert name in metrics.BY_NAME, (rule.get("alert"), name)
                if name.startswith("gpubox:"):
                    assert name in recorded, (rule.get("alert"), name)
            for jobs in re.findall(r'job!?=~?"([^"]+)"', rule["expr"]):
                for job in jobs.split("|"):
                    assert job in metrics.JOBS, (rule.get("alert"), job)


def test_gpuboxs_metrics_pass_promtools_lint() -> None:
    """Prometheus's own naming lint (`promtool check metrics`) on every metric, with a value."""
    samples = [(m.name, {label: "x" for label in m.labels}, 1.0) for m in metrics.METRICS]
    done = run("check", "metrics", stdin=metrics.exposition(samples))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr


# --------------------------------------------------------------------------- the docs' table

SOURCES = (
    ("DCGM_", "dcgm-exporter"),
    ("llamacpp:", "llama.cpp"),
    ("vllm:", "vLLM"),
    ("node_", "node exporter"),
    ("gpubox_", "gpubox"),
    ("gpubox:", "recorded"),
    ("up", "Prometheus"),
)


def watches() -> dict[str, str]:
    """Each alert's `# watches:` comment, the line above it in the rules file."""
    found = dict(re.findall(r"# watches: (.+)\n\s+- alert: (\w+)", RULES.read_text("utf-8")))
    return {alert: text for text, alert in found.items()}


def cell(text: str) -> str:
    text = " ".join(text.split())
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: m.group(1).upper(), text)
    return text.replace("|", "\\|")


def rules_table() -> str:
    said = watches()
    lines = [
        "| alert | severity | what it watches | metrics (source) | what to run next |",
        "|---|---|---|---|---|",
    ]
    for rule in alerts():
        sources = []
        for name in named_metrics(rule["expr"]):
            source = next(s for prefix, s in SOURCES if name.startswith(prefix))
            sources.append(f"`{name}` ({source})")
        row = (
            f"`{rule['alert']}`",
            rule["labels"]["severity"],
            cell(said.get(rule["alert"], "")),
            ", ".join(sources),
            cell(rule["annotations"]["next_step"]),
        )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def test_every_alert_says_what_it_watches() -> None:
    assert sorted(watches()) == sorted(ALERT_NAMES)


def test_docs_monitoring_md_holds_the_rules_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"docs/monitoring.md: {BEGIN} ... {END} missing"
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip() + "\n"
    assert shown == rules_table(), (
        "docs/monitoring.md's rules table is not the rules file's: "
        "`python tests/unit/test_alert_rules.py` prints it"
    )


if __name__ == "__main__":  # print docs/monitoring.md's rules table
    sys.stdout.write(rules_table())
