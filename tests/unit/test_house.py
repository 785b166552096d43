"""The house rules of docs/design.md, checked on the source: every module in one layer of the
design's layer table and no import running up a layer, no import circle (imports inside
functions count for both), the leaves import nothing of gpubox, nothing below the pyinfra
facts imports pyinfra, imports at the top (an import inside a function says why on its line),
and no module outside the sandbox grows past about 500 lines."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "gpubox"
MAX_LINES = 500
LEAVES = ("gpubox.layout", "gpubox.errors", "gpubox.rendering", "gpubox.parsers")
DESIGN = SRC.parent / "docs" / "design.md"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def in_functions(tree: ast.AST) -> set[int]:
    """The ids of every node inside a function (or a lambda) of ``tree``."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside |= {id(n) for n in ast.walk(node) if n is not node}
    return inside


def is_import_module(node: ast.AST) -> bool:
    """A call of importlib.import_module (or __import__): an import by name."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("import_module", "__import__")


def import_sites(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """Every import of a gpubox module in ``name``'s file: (the module, its line, whether it
    sits inside a function). ``from pkg import mod`` is an import of pkg.mod; ``from pkg import
    thing`` of pkg. In a file that imports by name (importlib.import_module), every string
    that is a gpubox module's name counts as its import inside a function (cli's LAZY)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside = in_functions(tree)
    by_name = any(is_import_module(node) for node in ast.walk(tree))
    found: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        targets: set[str] = set()
        if by_name and isinstance(node, ast.Constant) and node.value in known:
            found.append((str(node.value), node.lineno, True))
            continue
        if isinstance(node, ast.Import):
            targets = {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
        found += [
            (m, node.lineno, id(node) in inside)
            for m in sorted(targets)
            if m in known and m != name
        ]
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every gpubox module ``name`` imports, anywhere in the file."""
    return {m for m, _, _ in import_sites(name, path, known)}


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
    (root / "stages").mkdir(parents=True, exist_ok=True)
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


# Imports at the top: an import of gpubox inside a function says why on its line (a comment),
# and there are at most this many outside the sandbox (docs/design.md, "Imports at the top").
MAX_FUNCTION_IMPORTS = 5


def function_imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, bool]]:
    """Every import of gpubox made inside a function of ``name``'s file, as ("module:line",
    whether a comment on one of its lines says why): the import statements, and the calls
    that import by name (importlib.import_module), whatever they name."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    inside = in_functions(tree)
    commented = {
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.COMMENT
    }
    lazy = {line for module, line, in_function in import_sites(name, path, known) if in_function}
    found = []
    for node in ast.walk(tree):
        if id(node) not in inside:
            continue
        if (isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno in lazy) or (
            is_import_module(node)
        ):
            lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            found.append((f"{name}:{node.lineno}", any(n in commented for n in lines)))
    return sorted(found)


def all_function_imports(known: dict[str, Path]) -> list[tuple[str, bool]]:
    return [
        site
        for name, path in sorted(known.items())
        if not name.startswith("gpubox.sandbox")
        for site in function_imports(name, path, known)
    ]


def test_an_import_inside_a_function_says_why_on_its_line():
    sites = all_function_imports(modules())
    assert [site for site, why in sites if not why] == []
    assert len(sites) <= MAX_FUNCTION_IMPORTS, sites


def test_the_function_import_check_finds_a_planted_one(tmp_path: Path):
    root = tmp_path / "gpubox"
    (root / "bench").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "layout.py").write_text("")
    (root / "bench" / "__init__.py").write_text("")
    (root / "bench" / "cli.py").write_text(
        "import importlib\n"
        "from gpubox import layout\n\n"
        "LAZY = {'x': 'gpubox.layout'}\n\n"
        "def f():\n"
        "    from gpubox import layout  # a reason\n\n"
        "def g():\n"
        "    from gpubox import (\n"
        "        layout,\n"
        "    )\n"
        "    import json\n\n"
        "def h(name):\n"
        "    return importlib.import_module(LAZY[name])\n"
    )
    known = modules(root)
    assert all_function_imports(known) == [
        ("gpubox.bench.cli:10", False),
        ("gpubox.bench.cli:16", False),
        ("gpubox.bench.cli:7", True),
    ]
    # the module named in LAZY counts as imported inside a function (the layers, the circles)
    assert ("gpubox.layout", 4, True) in import_sites(
        "gpubox.bench.cli", root / "bench" / "cli.py", known
    )


def test_the_commands_import_no_pyinfra_and_patch_nothing_with_gevent():
    """`gpubox --help` imports none of what its commands need (cli's LAZY); the bench's
    modules, imported, leave this process unpatched (pyinfra_cli patches threads and sockets
    with gevent when imported: gpubox.inventory.load, run in the bench's child process)."""
    probe = (
        "import json, sys\n"
        "import gpubox.cli\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'pyinfra', 'pyinfra_cli', 'paramiko', 'testinfra', 'pytest', 'gevent'})\n"
        "import gpubox.bench, gpubox.bench.smoke, gpubox.bench.smoke_host, gpubox.nvlink\n"
        "monkey = sys.modules.get('gevent.monkey')\n"
        "print(json.dumps([heavy, bool(monkey and monkey.is_module_patched('socket'))]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    ).stdout
    assert json.loads(out) == [[], False]


def test_no_module_outside_the_sandbox_is_longer_than_about_500_lines():
    long = {
        name: n
        for name, path in modules().items()
        if not name.startswith("gpubox.sandbox")
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


# The layer table of docs/design.md ("## Layers"): a module imports only from its own layer
# or the layers below it, imports inside functions included.

# Upward imports the design allows, each with why: (importer, imported) -> the reason. None
# is needed now: the plans the checks judge a box by (the model's, the llama.cpp build's,
# vLLM's arguments) live in plans/, below the checks (issue 21, part B). An entry added here
# must name its reason, and the design must say it ("Down, never up").
UPWARD_EXCEPTIONS: dict[tuple[str, str], str] = {}


def layer_table(text: str) -> list[tuple[str, list[str]]]:
    """The rows of the "## Layers" table, bottom up: (layer, the gpubox modules and packages
    its modules column names). ``x.py`` is gpubox.x, ``x/`` and ``x/*.py`` the package
    gpubox.x, ``__init__.py`` gpubox itself; other names (catalog.yml) are data."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows: list[tuple[str, list[str]]] = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (
            not line.startswith("|")
            or len(cells) < 3
            or cells[0] in ("layer", "")
            or (set(cells[0]) <= set("-: "))
        ):
            continue
        names = []
        for token in re.findall(r"`([^`]+)`", cells[1]):
            token = token.removesuffix("*.py")
            if token == "__init__.py":
                names.append("gpubox")
            elif token.endswith("/"):
                names.append("gpubox." + token.strip("/").replace("/", "."))
            elif token.endswith(".py"):
                names.append("gpubox." + token.removesuffix(".py").replace("/", "."))
        rows.append((cells[0], names))
    return rows


def placement(rows: list[tuple[str, list[str]]], known: dict[str, Path]) -> dict[str, int]:
    """Each known module's layer, by its row's position (0 at the bottom); the most specific
    name wins (a module named in a row over its package named in another)."""
    placed: dict[str, int] = {}
    for module in known:
        best = (-1, -1)
        for rank, (_, names) in enumerate(rows):
            for entry in names:
                if module == entry or module.startswith(entry + "."):
                    best = max(best, (len(entry), rank))
        if best[1] >= 0:
            placed[module] = best[1]
    return placed


def upward_imports(
    rows: list[tuple[str, list[str]]],
    known: dict[str, Path],
    allowed: dict[tuple[str, str], str] | None = None,
) -> list[str]:
    """Every import of a module from a higher layer, as "module:line imports other (layer ->
    layer)"; an allowed pair passes only when imported inside a function."""
    placed = placement(rows, known)
    allowed = allowed or {}
    found = []
    for name, path in sorted(known.items()):
        if name not in placed:
            continue
        for other, line, in_function in import_sites(name, path, known):
            if other not in placed or placed[other] <= placed[name]:
                continue
            if (name, other) in allowed and in_function:
                continue
            found.append(
                f"{name}:{line} imports {other} "
                f"({rows[placed[name]][0]} -> {rows[placed[other]][0]})"
            )
    return found


def test_every_module_is_in_one_row_of_the_design_layer_table():
    rows = layer_table(DESIGN.read_text(encoding="utf-8"))
    known = modules()
    placed = placement(rows, known)
    assert sorted(set(known) - set(placed)) == []
    named = [entry for _, names in rows for entry in names]
    gone = [e for e in named if not any(m == e or m.startswith(e + ".") for m in known)]
    assert gone == []  # no row names a module that is gone
    assert len(named) == len(set(named))  # nor one module twice


def test_no_module_imports_from_a_layer_above_its_own():
    rows = layer_table(DESIGN.read_text(encoding="utf-8"))
    assert upward_imports(rows, modules(), UPWARD_EXCEPTIONS) == []


# Below the pyinfra facts and operations nothing imports pyinfra at its top, so importing the
# checks, the bench or doctor imports none of it; each exception says why.
PYINFRA_ROW = "pyinfra facts and operations"
PYINFRA_BELOW: dict[str, str] = {
    "gpubox.errors": "its exceptions are pyinfra's (PyinfraError): pyinfra reports them",
}


def pyinfra_at_the_top(path: Path) -> list[int]:
    """The lines of ``path``'s imports of pyinfra (or pyinfra_cli, gevent) outside functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside = in_functions(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if any(n.split(".")[0] in ("pyinfra", "pyinfra_cli", "gevent") for n in names):
            found.append(node.lineno)
    return found


def pyinfra_below(rows: list[tuple[str, list[str]]], known: dict[str, Path]) -> list[str]:
    limit = [layer for layer, _ in rows].index(PYINFRA_ROW)
    placed = placement(rows, known)
    return [
        f"{name}:{line} ({rows[placed[name]][0]})"
        for name, path in sorted(known.items())
        if placed.get(name, limit) < limit and name not in PYINFRA_BELOW
        for line in pyinfra_at_the_top(path)
    ]


def test_nothing_below_the_pyinfra_facts_imports_pyinfra_at_its_top():
    rows = layer_table(DESIGN.read_text(encoding="utf-8"))
    assert pyinfra_below(rows, modules()) == []


def test_the_pyinfra_check_finds_a_planted_import(tmp_path: Path):
    rows = [("leaves", ["gpubox.kernels"]), (PYINFRA_ROW, ["gpubox.facts"])]
    root = tmp_path / "gpubox"
    root.mkdir()
    (root / "facts.py").write_text("from pyinfra.api import FactBase\n")
    (root / "kernels.py").write_text("def f():\n    import pyinfra  # lazy\n")
    assert pyinfra_below(rows, modules(root)) == []
    (root / "kernels.py").write_text("import re\nfrom pyinfra.api import FactBase\n")
    assert pyinfra_below(rows, modules(root)) == ["gpubox.kernels:2 (leaves)"]


def test_every_allowed_upward_import_is_still_made():
    """An exception no module needs any more is dropped from the list (and from the design)."""
    known = modules()
    edges = graph(known)
    assert [pair for pair in UPWARD_EXCEPTIONS if pair[1] not in edges[pair[0]]] == []


TABLE = """# design

## Layers

| layer | modules | what they are |
|---|---|---|
| leaves | `layout.py`, `catalog.py` + `catalog.yml` | data |
| rules | `offers.py` | pure |
| stages | `stages/` | the stages |

## Next
"""


def planted(tmp_path: Path, offers: str) -> dict[str, Path]:
    root = tmp_path / "gpubox"
    (root / "stages").mkdir(parents=True, exist_ok=True)
    (root / "stages" / "__init__.py").write_text("def render():\n    pass\n")
    (root / "stages" / "apt_repo.py").write_text("from gpubox import layout, offers\n")
    (root / "layout.py").write_text("")
    (root / "catalog.py").write_text("from gpubox import layout\n")
    (root / "offers.py").write_text(offers)
    return modules(root)


def test_the_layer_check_finds_a_planted_upward_import(tmp_path: Path):
    rows = layer_table(TABLE)
    assert rows == [
        ("leaves", ["gpubox.layout", "gpubox.catalog"]),
        ("rules", ["gpubox.offers"]),
        ("stages", ["gpubox.stages"]),
    ]
    known = planted(tmp_path, "from gpubox import layout\n")
    assert upward_imports(rows, known) == []
    known = planted(
        tmp_path, "import gpubox.layout\n\ndef f():\n    from gpubox.stages import render\n"
    )
    assert upward_imports(rows, known) == [
        "gpubox.offers:4 imports gpubox.stages (rules -> stages)"
    ]
    # an allowed pair passes inside a function only
    allowed = {("gpubox.offers", "gpubox.stages"): "planted"}
    assert upward_imports(rows, known, allowed) == []
    known = planted(tmp_path, "from gpubox.stages.apt_repo import placeholders\n")
    allowed = {("gpubox.offers", "gpubox.stages.apt_repo"): "planted"}
    assert upward_imports(rows, known, allowed) == [
        "gpubox.offers:1 imports gpubox.stages.apt_repo (rules -> stages)"
    ]


def test_an_unplaced_module_is_named(tmp_path: Path):
    known = planted(tmp_path, "")
    (tmp_path / "gpubox" / "kernels.py").write_text("")
    known = modules(tmp_path / "gpubox")
    placed = placement(layer_table(TABLE), known)
    assert sorted(set(known) - set(placed)) == ["gpubox.kernels"]


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
