"""The house rules of docs/design.md, checked on the source: no import circle (imports inside
functions count), the leaves import nothing of gpubox, and no module outside the sandbox
grows past about 500 lines."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "gpubox"
MAX_LINES = 500
LEAVES = ("gpubox.layout", "gpubox.errors", "gpubox.parsers")


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every gpubox module ``name`` imports, anywhere in the file. ``from pkg import mod``
    is an import of pkg.mod; ``from pkg import thing`` of pkg."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def graph(known: dict[str, Path]) -> dict[str, set[str]]:
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    edges = graph(modules())
    assert circles(edges) == []


def test_the_circle_finder_finds_a_planted_circle(tmp_path: Path):
    root = tmp_path / "gpubox"
    (root / "stages").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "stages" / "__init__.py").write_text("")
    (root / "stages" / "backend.py").write_text("def f():\n    from gpubox.stages import vllm\n")
    (root / "stages" / "vllm.py").write_text("from gpubox.stages.backend import f\n")
    (root / "layout.py").write_text("")
    assert circles(graph(modules(root))) == [["gpubox.stages.backend", "gpubox.stages.vllm"]]


@pytest.mark.parametrize("leaf", LEAVES)
def test_the_leaves_import_nothing_of_gpubox_but_themselves(leaf: str):
    known = modules()
    edges = graph(known)
    mine = {m for m in known if m == leaf or m.startswith(leaf + ".")}
    outside = {m: sorted(edges[m] - mine) for m in mine if edges[m] - mine}
    assert outside == {}


def test_no_module_outside_the_sandbox_is_longer_than_about_500_lines():
    long = {
        name: n
        for name, path in modules().items()
        if not name.startswith("gpubox.sandbox")
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


ROOT = SRC.parent


def test_docs_checks_lists_every_check_as_gpubox_checks_prints_it(capsys: pytest.CaptureFixture):
    """docs/checks.md's table is `gpubox checks --markdown`, whole (regenerate it after adding
    or changing a check)."""
    from gpubox import checks, cli

    assert cli.main(["checks", "--markdown"]) == 0
    table = capsys.readouterr().out
    assert table.count("\n| `") == len(checks.ALL)
    page = (ROOT / "docs" / "checks.md").read_text(encoding="utf-8")
    assert page.split("\n\n| check |", 1)[1].rstrip() == table.split("| check |", 1)[1].rstrip()


def test_the_design_document_is_in_the_repository_and_linked_from_the_readme():
    assert (ROOT / "docs" / "design.md").is_file()
    assert "(docs/design.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_nothing_in_the_repository_points_outside_it():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    outside = "../" + "shared"
    found = [
        name
        for name in tracked
        if (ROOT / name).is_file()
        and outside in (ROOT / name).read_text(encoding="utf-8", errors="replace")
    ]
    assert found == []


def test_the_readme_is_a_front_door_not_a_manual():
    """About 200 lines for the person rebuilding a box; the rest lives in docs/, where the
    README links to every page."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    linked = {name for name in pages if f"docs/{name}" in readme}
    assert pages - linked == set()
