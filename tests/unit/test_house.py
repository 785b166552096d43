"""The house rules of docs/design.md, checked on the source. The tree is the layer table: each
folder of src/gpubox (and each module at its root) says its layer in its docstring's first
line ("Layer N, NAME: what it holds"), and design.md's table is those lines. No import runs up
a layer, no import circle (imports inside functions count for both), each layer's modules
have its trait (the leaves import nothing above them, the pure layers no I/O, the pyinfra
layers pyinfra), imports at the top (an import inside a function says why on its line), and
no module outside the sandbox grows past about 500 lines."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "gpubox"
MAX_LINES = 500
LEAVES = ("gpubox.base.layout", "gpubox.base.errors", "gpubox.base.rendering", "gpubox.parsers")
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
    with gevent when imported: gpubox.remote.inventory.load, run in the bench's child process)."""
    probe = (
        "import json, sys\n"
        "import gpubox.cli\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'pyinfra', 'pyinfra_cli', 'paramiko', 'testinfra', 'pytest', 'gevent'})\n"
        "import gpubox.bench, gpubox.bench.smoke, gpubox.bench.smoke_host, gpubox.commands.nvlink\n"
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


# The tables design.md excepts from the size rule: one entry a key or a pin, nothing to split.
LONG_TABLES = {"gpubox.config.keys": "the inventory keys' table, one Key(...) a key"}


def test_no_module_outside_the_sandbox_is_longer_than_about_500_lines():
    long = {
        name: n
        for name, path in modules().items()
        if not name.startswith("gpubox.sandbox")
        and name not in LONG_TABLES
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


# The layers, read from the tree: each folder of src/gpubox, and each module at its root, says
# its layer in the first line of its docstring (the folder's in its __init__.py):
# "Layer N, NAME: what it holds." A module's layer is its top folder's. design.md's "## Layers"
# table is those lines, one row a folder or root module, bottom up (a test keeps it equal).

MARK = re.compile(r"^Layer (\d+), ([a-z ]+): (.+)$")


@dataclass(frozen=True)
class Room:
    """One entry at the package's root: a folder (``name/``) or a module (``name.py``)."""

    entry: str
    rank: int
    layer: str
    what: str


def first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=True) or ""
    return doc.splitlines()[0] if doc else ""


def rooms(root: Path = PACKAGE) -> tuple[dict[str, Room], list[str]]:
    """Every entry at ``root`` that holds Python, with its layer; and what cannot be placed
    (an entry whose docstring's first line is not a layer's mark)."""
    found: dict[str, Room] = {}
    unplaced: list[str] = []
    for path in sorted(root.iterdir()):
        if path.is_dir() and any(path.rglob("*.py")):
            entry, source = f"{path.name}/", path / "__init__.py"
        elif path.suffix == ".py":
            entry, source = path.name, path
        else:
            continue
        m = MARK.match(first_line(source)) if source.is_file() else None
        if m is None:
            unplaced.append(entry)
            continue
        found[entry] = Room(entry, int(m.group(1)), m.group(2), m.group(3))
    return found, unplaced


def placement(found: dict[str, Room], known: dict[str, Path]) -> dict[str, Room]:
    """Each known module's room: a module at the root is its own entry (``__init__.py`` is
    gpubox itself), any other lies in its top folder (``x/``)."""
    root = known["gpubox"].parent
    placed: dict[str, Room] = {}
    for module, path in known.items():
        rel = path.relative_to(root).parts
        entry = rel[0] if len(rel) == 1 else f"{rel[0]}/"
        if entry in found:
            placed[module] = found[entry]
    return placed


def layer_rows(found: dict[str, Room]) -> list[str]:
    """design.md's layer table as the tree says it: bottom up, then by name."""
    rows = ["| layer | folder | what it holds |", "|---|---|---|"]
    for room in sorted(found.values(), key=lambda r: (r.rank, r.entry.endswith(".py"), r.entry)):
        rows.append(f"| {room.rank}. {room.layer} | `{room.entry}` | {room.what} |")
    return rows


def design_table(text: str) -> list[str]:
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    return [line.rstrip() for line in section.splitlines() if line.startswith("|")]


def test_every_folder_and_root_module_says_its_layer():
    found, unplaced = rooms()
    assert unplaced == []
    names: dict[int, set[str]] = {}
    for room in found.values():
        names.setdefault(room.rank, set()).add(room.layer)
    assert {rank: sorted(n) for rank, n in names.items() if len(n) > 1} == {}  # one name a rank
    assert sorted(names) == list(range(1, len(names) + 1))  # no gap in the ranks


def test_at_most_four_modules_sit_at_the_root():
    assert len(list(PACKAGE.glob("*.py"))) <= 4


def test_the_design_layer_table_is_the_trees_own():
    """docs/design.md's "## Layers" table is the folders' first lines (regenerate it with
    `python tests/unit/test_house.py` after adding or moving a folder)."""
    found, _ = rooms()
    assert design_table(DESIGN.read_text(encoding="utf-8")) == layer_rows(found)


# Upward imports the design allows, each with why: (importer, imported) -> the reason. None
# is needed now. An entry added here must name its reason, and the design must say it
# ("Down, never up").
UPWARD_EXCEPTIONS: dict[tuple[str, str], str] = {}


def upward_imports(
    found: dict[str, Room],
    known: dict[str, Path],
    allowed: dict[tuple[str, str], str] | None = None,
) -> list[str]:
    """Every import of a module from a higher layer, as "module:line imports other (layer ->
    layer)"; an allowed pair passes only when imported inside a function."""
    placed = placement(found, known)
    allowed = allowed or {}
    out = []
    for name, path in sorted(known.items()):
        if name not in placed:
            continue
        for other, line, in_function in import_sites(name, path, known):
            if other not in placed or placed[other].rank <= placed[name].rank:
                continue
            if (name, other) in allowed and in_function:
                continue
            out.append(
                f"{name}:{line} imports {other} ({placed[name].layer} -> {placed[other].layer})"
            )
    return out


def test_no_module_imports_from_a_layer_above_its_own():
    found, _ = rooms()
    assert upward_imports(found, modules(), UPWARD_EXCEPTIONS) == []


def test_every_allowed_upward_import_is_still_made():
    """An exception no module needs any more is dropped from the list (and from the design)."""
    known = modules()
    edges = graph(known)
    assert [pair for pair in UPWARD_EXCEPTIONS if pair[1] not in edges[pair[0]]] == []


# Each layer's trait, so that a module in the wrong folder is named even when its imports run
# down: the pure layers (below the checks) do no I/O, so they import no module that reaches a
# host, a process or the network at their top; the pyinfra layers hold what acts through
# pyinfra, so each of their modules imports it (one that does not belongs below them).
PYINFRA_LAYER = "pyinfra facts and operations"
STAGES_LAYER = "stages"
CHECKS_LAYER = "checks"
IO_MODULES = (
    "subprocess",
    "socket",
    "paramiko",
    "requests",
    "testinfra",
    "threading",
    "http.client",
    "urllib.request",
    "pyinfra",
    "pyinfra_cli",
    "gevent",
)
# Modules of the pure layers that do I/O at their top, each with why.
IO_ALLOWED: dict[str, str] = {
    "gpubox.knowledge.watchdog": "it is also the program the box's watchdog timer runs (the "
    "standard library only): its probes and systemctl run on the box, never in gpubox",
    "gpubox.knowledge.metrics_relay": "it is the program the box's metrics relay unit runs (the "
    "standard library only): it serves and reads HTTP on the box, never in gpubox",
    "gpubox.knowledge.render_secrets": "it is the program the monitoring stage runs on the box "
    "(the standard library only): it reads the secrets' files and systemd there, never in gpubox",
    "gpubox.knowledge.box_metrics": "it is also the program the box's gpubox-box-metrics timer "
    "runs (the standard library only): its dpkg-query and reads run on the box, never in gpubox",
}
# Below the pyinfra facts and operations nothing imports pyinfra at its top, so importing the
# checks, the bench or doctor imports none of it; each exception says why.
PYINFRA_BELOW: dict[str, str] = {
    "gpubox.base.errors": "its exceptions are pyinfra's (PyinfraError): pyinfra reports them",
}


def top_imports(path: Path) -> list[tuple[str, int]]:
    """The absolute imports of ``path`` outside functions: (dotted name, line)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside = in_functions(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found += [(node.module or "", node.lineno)]
    return found


def imports_any(path: Path, names: tuple[str, ...]) -> bool:
    """Whether ``path`` imports one of ``names`` (or a module below one) anywhere."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        mods = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        if any(m == n or m.startswith(n + ".") for m in mods for n in names):
            return True
    return False


def pyinfra_at_the_top(path: Path) -> list[int]:
    """The lines of ``path``'s imports of pyinfra (or pyinfra_cli, gevent) outside functions."""
    return [
        line
        for name, line in top_imports(path)
        if name.split(".")[0] in ("pyinfra", "pyinfra_cli", "gevent")
    ]


def ranks(found: dict[str, Room]) -> dict[str, int]:
    return {room.layer: room.rank for room in found.values()}


def pyinfra_below(found: dict[str, Room], known: dict[str, Path]) -> list[str]:
    limit = ranks(found)[PYINFRA_LAYER]
    placed = placement(found, known)
    return [
        f"{name}:{line} ({placed[name].layer})"
        for name, path in sorted(known.items())
        if name in placed and placed[name].rank < limit and name not in PYINFRA_BELOW
        for line in pyinfra_at_the_top(path)
    ]


def misplaced(found: dict[str, Room], known: dict[str, Path]) -> list[str]:
    """Modules whose code does not have their folder's trait, each with what it lacks."""
    layer = ranks(found)
    placed = placement(found, known)
    out = []
    for name, path in sorted(known.items()):
        room = placed.get(name)
        if room is None:
            continue
        if room.rank == 1:  # the leaves import nothing of gpubox above the leaves
            above = sorted(m for m in imports(name, path, known) if placed[m].rank > 1)
            out += [f"{name} ({room.entry}, a leaf) imports {m}" for m in above]
        if room.rank < layer[CHECKS_LAYER] and room.rank > 1 and name not in IO_ALLOWED:
            io = sorted(
                {
                    n
                    for n, _ in top_imports(path)
                    for m in IO_MODULES
                    if n == m or n.startswith(m + ".")
                }
            )
            out += [f"{name} ({room.entry}, {room.layer}) does I/O: imports {m}" for m in io]
        if (
            layer[PYINFRA_LAYER] <= room.rank <= layer[STAGES_LAYER]
            and path.name != "__init__.py"
            and not imports_any(path, ("pyinfra",))
        ):
            out.append(f"{name} ({room.entry}, {room.layer}) imports no pyinfra: it belongs lower")
    return out


def test_nothing_below_the_pyinfra_facts_imports_pyinfra_at_its_top():
    found, _ = rooms()
    assert pyinfra_below(found, modules()) == []


def test_every_module_has_its_folders_trait():
    found, _ = rooms()
    assert misplaced(found, modules()) == []


def test_every_io_exception_is_still_needed():
    known = modules()
    assert [m for m in IO_ALLOWED if m not in known] == []


# Planted trees: each house rule fails on what it is there to catch.


def plant(tmp_path: Path, files: dict[str, str]) -> tuple[dict[str, Room], dict[str, Path]]:
    root = tmp_path / "gpubox"
    marks = {
        "__init__.py": "Layer 1, leaves: the package.",
        "base": "Layer 1, leaves: paths.",
        "knowledge": "Layer 2, pure knowledge: rules.",
        "rules": "Layer 4, pure rules: decisions.",
        "infra": f"Layer 7, {PYINFRA_LAYER}: facts.",
        "stages": f"Layer 10, {STAGES_LAYER}: the stages.",
        "checks": f"Layer 6, {CHECKS_LAYER}: checks.",
    }
    for entry, mark in marks.items():
        target = root / entry if entry.endswith(".py") else root / entry / "__init__.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f'"""{mark}"""\n')
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    found, unplaced = rooms(root)
    assert unplaced == [entry for entry in ("plain/",) if (root / entry).exists()]
    return found, modules(root)


def test_the_layer_check_finds_a_planted_upward_import(tmp_path: Path):
    found, known = plant(
        tmp_path,
        {
            "base/layout.py": "",
            "rules/offers.py": "from gpubox.base import layout\n",
            "stages/apt_repo.py": "import pyinfra\nfrom gpubox.rules import offers\n",
        },
    )
    assert upward_imports(found, known) == []
    found, known = plant(
        tmp_path,
        {
            "rules/offers.py": "import gpubox.base.layout\n\n"
            "def f():\n    from gpubox import stages\n"
        },
    )
    assert upward_imports(found, known) == [
        "gpubox.rules.offers:4 imports gpubox.stages (pure rules -> stages)"
    ]
    allowed = {("gpubox.rules.offers", "gpubox.stages"): "planted"}
    assert upward_imports(found, known, allowed) == []  # an allowed pair, inside a function
    found, known = plant(tmp_path, {"rules/offers.py": "from gpubox.stages import apt_repo\n"})
    allowed = {("gpubox.rules.offers", "gpubox.stages.apt_repo"): "planted"}
    assert upward_imports(found, known, allowed) == [
        "gpubox.rules.offers:1 imports gpubox.stages.apt_repo (pure rules -> stages)"
    ]


def test_a_module_in_the_wrong_folder_is_named(tmp_path: Path):
    found, known = plant(
        tmp_path,
        {
            "base/layout.py": "",
            "knowledge/reads.py": "import re\nfrom gpubox.base import layout\n",
            "infra/facts.py": "from pyinfra.api import FactBase\n",
        },
    )
    assert misplaced(found, known) == []
    found, known = plant(
        tmp_path,
        {
            # a program that runs commands, placed with the pure rules
            "rules/probe.py": "import subprocess\n",
            # pure parsing, placed with the pyinfra facts
            "infra/parse.py": "import re\n",
            # a leaf that reads the rules
            "base/paths.py": "from gpubox.knowledge import reads\n",
        },
    )
    assert misplaced(found, known) == [
        "gpubox.base.paths (base/, a leaf) imports gpubox.knowledge.reads",
        "gpubox.infra.parse (infra/, pyinfra facts and operations) imports no pyinfra: "
        "it belongs lower",
        "gpubox.rules.probe (rules/, pure rules) does I/O: imports subprocess",
    ]


def test_a_folder_without_its_layer_is_named(tmp_path: Path):
    (tmp_path / "gpubox" / "plain").mkdir(parents=True)
    (tmp_path / "gpubox" / "plain" / "__init__.py").write_text('"""Some helpers."""\n')
    found, known = plant(tmp_path, {})
    assert "plain/" not in found
    assert [m for m in known if m not in placement(found, known)] == ["gpubox.plain"]


def test_the_pyinfra_check_finds_a_planted_import(tmp_path: Path):
    found, known = plant(
        tmp_path,
        {
            "base/kernels.py": "def f():\n    import pyinfra  # lazy\n",
            "infra/facts.py": "import pyinfra\n",
        },
    )
    assert pyinfra_below(found, known) == []
    found, known = plant(
        tmp_path, {"base/kernels.py": "import re\nfrom pyinfra.api import FactBase\n"}
    )
    assert pyinfra_below(found, known) == ["gpubox.base.kernels:2 (leaves)"]


def test_the_table_is_written_from_the_marks(tmp_path: Path):
    found, _ = plant(tmp_path, {})
    rows = layer_rows(found)
    assert rows[2:4] == [
        "| 1. leaves | `base/` | paths. |",
        "| 1. leaves | `__init__.py` | the package. |",
    ]
    assert rows[-1] == "| 10. stages | `stages/` | the stages. |"


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


def index_paths(text: str) -> list[str]:
    """The paths design.md's "## Feature index" names, as they are written."""
    section = text.split("\n## Feature index\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [token for row in rows for token in re.findall(r"`([^`]+)`", row)]


def missing_from_index(text: str, root: Path = ROOT) -> list[str]:
    """The index's paths that do not exist: under src/gpubox/, or the repository's root for
    tests/ and docs/."""
    out = []
    for path in index_paths(text):
        base = root if path.startswith(("tests/", "docs/")) else root / "src" / "gpubox"
        if not (base / path).exists():
            out.append(path)
    return out


def test_every_path_in_the_feature_index_exists():
    text = DESIGN.read_text(encoding="utf-8")
    features = [
        row.split("|")[1].strip()
        for row in text.split("\n## Feature index\n", 1)[1].split("\n## ", 1)[0].splitlines()
        if row.startswith("| ")
    ][1:]
    for feature in (
        "the driver",
        "Secure Boot",
        "the desktop",
        "the model download",
        "llama.cpp",
        "vLLM",
        "the watchdog",
        "the panel",
        "DCGM and the exporter",
        "the bench",
    ):
        assert feature in features
    assert len(index_paths(text)) > 40
    assert missing_from_index(text) == []


def test_the_index_check_finds_a_moved_file():
    text = (
        "# d\n\n## Feature index\n\n| a | b |\n|---|---|\n"
        "| x | `stages/driver.py`, `stages/gone.py`, `docs/nope.md` |\n"
    )
    assert missing_from_index(text) == ["stages/gone.py", "docs/nope.md"]


if __name__ == "__main__":  # print design.md's layer table, as the tree says it
    print("\n".join(layer_rows(rooms()[0])))
