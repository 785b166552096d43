"""Every command README.md and docs/*.md show works, in a form that cannot touch a host.

Commands are the lines of fenced code blocks and the `inline code` that start with gpubox,
pyinfra, pytest or make (after an optional ``.venv/bin/`` and ``$``):

- ``gpubox ...``: its subcommand's ``--help`` exits 0 and lists every ``--option`` shown;
  ``gpubox check PATH`` runs as it is (exit 0: the repository's inventories are valid);
- ``pyinfra ...``: ``pyinfra --help`` lists every ``--option`` shown;
- ``pytest ...``: ``--collect-only -q`` collects at least one test (the host checks probe nothing
  when only collecting); so must every ``-k``/``-m`` selector shown in inline code;
- ``make TARGET``: ``make -n TARGET`` exits 0;
- every test named (`test_...`, a trailing ``...`` for a prefix) is a test function of tests/;
- every repository path named (src/, tests/, deploy/, inventories/, docs/, benchmarks/) exists,
  but for those git ignores (what a run writes, e.g. benchmarks/results/).

Placeholders are left out: UPPERCASE words stand for the user's value (INVENTORY is
inventories/example.py), ``[...]`` for options, ``a|b`` for a choice (each is checked).
``inventories/mybox.py`` is the user's copy of inventories/example.py (the example says so).

KNOWN_STALE lists what the docs show today that does not work: each must still fail (so the
list shrinks as the docs are fixed, and never hides a command that works)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from gpubox import cli
from gpubox.config.keys import KEYS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOOLS = ("gpubox", "pyinfra", "pytest", "make")
EXAMPLE = "inventories/example.py"
USER_FILES = {"inventories/mybox.py": EXAMPLE}
REPO_DIRS = ("src/", "tests/", "deploy/", "inventories/", "docs/", "benchmarks/")
SANDBOX_VERBS = ("up", "down", "status", "ssh", "exec", "fault", "mok-screen", "image")

# What the docs show today that does not work (README.md is being rewritten by its owner).
KNOWN_STALE: set[str] = set()


@dataclass(frozen=True)
class Shown:
    page: str
    text: str  # the command as shown, comment and prompt removed

    @property
    def key(self) -> str:
        return f"{self.page}: {self.text}"


def _clean(line: str) -> str:
    line = line.strip()
    line = re.sub(r"^\$\s+", "", line)
    line = re.sub(r"^(\./)?\.venv/bin/", "", line)
    return re.sub(r"\s+#.*$", "", line).strip()


def shown_commands() -> list[Shown]:
    found: dict[str, Shown] = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        name = str(page.relative_to(ROOT))
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = _clean(line)
                if line.split(" ", 1)[0] in TOOLS:
                    found.setdefault(f"{name}: {line}", Shown(name, line))
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        for span in re.findall(r"`([^`\n]+)`", prose):
            line = _clean(span)
            if line.split(" ", 1)[0] in TOOLS:
                found.setdefault(f"{name}: {line}", Shown(name, line))
    return list(found.values())


def shown_selectors() -> list[Shown]:
    found = []
    for page in PAGES:
        prose = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
        for span in re.findall(r"`(-[km] [^`\n]+)`", prose):
            found.append(Shown(str(page.relative_to(ROOT)), span.strip()))
    return found


def shown_paths() -> list[Shown]:
    found: dict[str, Shown] = {}
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        for span in re.findall(r"`([^`\n]+)`", page.read_text(encoding="utf-8")):
            for word in span.split():
                word = word.strip("`'\",;:()")
                if word.startswith(REPO_DIRS) and not re.search(r"[A-Z]{2,}|[*{<]", word):
                    found.setdefault(f"{name}: {word}", Shown(name, word))
    return list(found.values())


def words(text: str) -> list[str]:
    """The command's words, a placeholder's optional [...] parts and choices left out."""
    text = re.sub(r"\[[^\]]*\]", " ", text)
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def concrete(word: str) -> str:
    if word == "INVENTORY":
        return EXAMPLE
    return USER_FILES.get(word, word)


def options(argv: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in argv if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", w)]


@cache
def gpubox_help(path: tuple[str, ...]) -> tuple[int, str]:
    out = io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = cli.main([*path, "--help"])
        except SystemExit as stop:
            code = stop.code
    return int(code or 0), out.getvalue()


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


@cache
def pyinfra_help() -> str:
    done = run([str(Path(sys.executable).parent / "pyinfra"), "--help"])
    assert done.returncode == 0, done.stderr
    return done.stdout


def problems_of(shown: Shown) -> list[str]:
    """What is wrong with a command shown (empty: it works)."""
    argv = words(shown.text)
    nested: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, nested = argv[:at], argv[at + 1 :]
    tool = argv[0]
    problems = []
    for word in argv[1:]:
        path = concrete(word)
        if path.startswith(REPO_DIRS) and "/" in path and not (ROOT / path).exists():
            problems.append(f"{word} does not exist")
    if tool == "gpubox":
        first = argv[1] if len(argv) > 1 and re.fullmatch(r"[a-z][a-z-]*", argv[1]) else None
        paths: list[tuple[str, ...]] = [(first,)] if first else [()]
        if first == "sandbox" and len(argv) > 2:
            verbs = [v for v in argv[2].split("|") if v in SANDBOX_VERBS]
            paths = [("sandbox", v) for v in verbs] or paths
        for path in paths:
            code, text = gpubox_help(path)
            if code != 0:
                problems.append(f"gpubox {' '.join(path)} --help exits {code}: {text[-300:]}")
                continue
            problems += [
                f"{o} is not an option of gpubox {' '.join(path)}"
                for o in options(argv)
                if o not in text
            ]
        if first == "check" and len(argv) > 2:
            done = run([*GPUBOX, "check", concrete(argv[2])])
            if done.returncode != 0:
                problems.append(f"gpubox check exits {done.returncode}: {done.stderr[-300:]}")
    elif tool == "pyinfra":
        text = pyinfra_help()
        problems += [f"{o} is not a pyinfra option" for o in options(argv) if o not in text]
    elif tool == "pytest":
        args = [concrete(w) for w in argv[1:] if w not in ("-v", "-q", "-vv")]
        if args:
            problems += collect(tuple(args))
    elif tool == "make":
        targets = [w for w in argv[1:] if not w.startswith("-")]
        for target in targets or ["all"]:
            done = run(["make", "-n", target])
            if done.returncode != 0:
                problems.append(f"make -n {target} exits {done.returncode}: {done.stderr[-300:]}")
    if nested and nested[0] in TOOLS:
        problems += problems_of(Shown(shown.page, shlex.join(nested)))
    return problems


GPUBOX = [sys.executable, "-c", "import sys; from gpubox.cli import main; sys.exit(main())"]


@cache
def collect(args: tuple[str, ...]) -> list[str]:
    """Problems of a pytest selection: it must collect at least one test."""
    argv = list(args)
    if any(a.startswith("tests/host") for a in argv) and "--inventory" not in argv:
        argv += ["--inventory", EXAMPLE]
    done = run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *argv]
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:]
        return [f"pytest {' '.join(argv)} --collect-only exits {done.returncode}: {tail}"]
    return []


def ignored(path: str) -> bool:
    done = run(["git", "check-ignore", "-q", path])
    return done.returncode == 0


SHOWN = shown_commands()


def test_the_docs_show_commands_at_all():
    tools = {s.text.split()[0] for s in SHOWN}
    assert tools == set(TOOLS), tools
    assert len(SHOWN) > 20


@pytest.mark.parametrize("shown", SHOWN, ids=lambda s: s.key[:90])
def test_every_command_shown_works_without_a_host(shown: Shown):
    problems = problems_of(shown)
    if shown.key in KNOWN_STALE:
        assert problems, f"{shown.key} works now: take it out of KNOWN_STALE"
        pytest.skip(f"stale in the docs (KNOWN_STALE): {'; '.join(problems)}")
    assert problems == [], shown.key


@pytest.mark.parametrize("shown", shown_selectors(), ids=lambda s: s.key[:90])
def test_every_selector_shown_selects_a_host_check(shown: Shown):
    flag, expression = shown.text.split(" ", 1)
    expression = expression.strip().strip('"').strip("'")
    assert collect(("tests/host", "--inventory", EXAMPLE, flag, expression)) == [], shown.key


@pytest.mark.parametrize("shown", shown_paths(), ids=lambda s: s.key[:90])
def test_every_repository_path_named_exists(shown: Shown):
    path = concrete(shown.text)
    if ignored(path):
        return  # an output a run writes (benchmarks/results/), which git ignores
    stale = any(shown.text in k for k in KNOWN_STALE)
    exists = (ROOT / path.rstrip("/")).exists()
    if stale and not exists:
        pytest.skip(f"stale in the docs (KNOWN_STALE): {shown.text}")
    assert exists, shown.key


def shown_tests() -> list[Shown]:
    found: dict[str, Shown] = {}
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        for span in re.findall(r"`(test_[a-z0-9_]+(?:\.\.\.)?)`", page.read_text(encoding="utf-8")):
            found.setdefault(f"{name}: {span}", Shown(name, span))
    return list(found.values())


@cache
def defined_tests() -> frozenset[str]:
    return frozenset(
        name
        for path in (ROOT / "tests").rglob("*.py")
        for name in re.findall(r"^def (test_[a-z0-9_]+)\(", path.read_text(), re.M)
    )


def test_every_test_named_exists():
    """Every `test_...` name a page shows is a test of the repository (one test for them all:
    the pages may name none)."""
    missing = []
    for shown in shown_tests():
        prefix = shown.text.removesuffix("...")
        exists = any(
            name == prefix or (shown.text.endswith("...") and name.startswith(prefix))
            for name in defined_tests()
        )
        if shown.key in KNOWN_STALE:
            assert not exists, f"{shown.key} exists now: take it out of KNOWN_STALE"
        elif not exists:
            missing.append(shown.key)
    assert missing == []


def test_the_checker_fails_what_does_not_work():
    bad = [
        Shown("x.md", "gpubox deploy INVENTORY --no-such-option"),
        Shown("x.md", "gpubox no-such-command"),
        Shown("x.md", "pyinfra inventories/nope.py deploy/full.py"),
        Shown("x.md", "pytest tests/host --inventory INVENTORY -k no_such_check_anywhere"),
        Shown("x.md", "make no-such-target"),
        Shown("x.md", "gpubox sandbox exec -- pyinfra --no-such-option inventories/sandbox.py"),
    ]
    for shown in bad:
        assert problems_of(shown), shown.text
    assert problems_of(Shown("x.md", "gpubox check inventories/example.py")) == []
    assert problems_of(Shown("x.md", "gpubox sandbox fault gpu-missing|clear [--gpu N]")) == []


def test_every_known_stale_entry_is_still_shown():
    """An entry the docs no longer show leaves KNOWN_STALE too (the list never outlives it)."""
    shown = {s.key for s in SHOWN} | {s.key for s in shown_tests()}
    gone = sorted(KNOWN_STALE - shown)
    assert gone == [], f"no longer in the docs, take out of KNOWN_STALE: {gone}"


# --- The walkthrough (docs/walkthrough.md): its commands are checked above with every page's;
# here what it says a step exits with, the inventory keys it sets, and that it is the README's
# first link.

WALKTHROUGH = ROOT / "docs" / "walkthrough.md"


def walkthrough_steps() -> list[tuple[str, int | None]]:
    """The walkthrough's table: (step, the exit code it names, or None)."""
    text = WALKTHROUGH.read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+\. [^|]+?) \| [^|]+ \| *(\d*) *\| [^|]+ \|$", text, re.M)
    return [(step, int(code) if code else None) for step, code in rows]


def test_the_readme_opens_with_the_walkthrough():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links[0] == "docs/walkthrough.md"


def test_each_step_of_the_walkthrough_exits_as_gpubox_deploy_says():
    from gpubox.remote import reach

    steps = walkthrough_steps()
    assert len(steps) >= 7 and [s.split(".")[0] for s, _ in steps] == [
        str(i) for i in range(1, len(steps) + 1)
    ]
    code, deploy_help = gpubox_help(("deploy",))
    assert code == 0
    deploy_help = " ".join(deploy_help.split())
    text = WALKTHROUGH.read_text(encoding="utf-8")
    for step, exit_code in steps:
        if exit_code is None:
            continue
        # a stop for the owner is exit 4 (reach.WAITING), a converged or valid run exit 0
        assert exit_code == (reach.WAITING if "stops" in step else reach.OK), step
        assert f"{exit_code} " in deploy_help.split("Exit:", 1)[1], (step, deploy_help)
        # the step's own section says the same code
        number = step.split(".")[0]
        section = text.split(f"\n## {number}. ", 1)[1].split("\n## ", 1)[0]
        assert f"exit {exit_code}" in section.splitlines()[0], step
    assert "4 stopped for the owner" in deploy_help
    assert sum("gpubox deploy inventories/mybox.py" in s.text for s in SHOWN if "walk" in s.page)


def test_the_walkthrough_sets_only_keys_an_inventory_takes():
    """Each `"KEY": VALUE` it shows is valid in the example inventory (gpubox's keys through
    gpubox's own validation, pyinfra's among pyinfra's own); any other quoted name belongs to the
    API's request or answer, in the step of the first request."""
    import ast

    from pyinfra.api.arguments import all_argument_meta
    from pyinfra.connectors.ssh import SSHConnector

    from gpubox.config import validate
    from gpubox.remote import inventory

    (_, example), *_ = inventory.load(EXAMPLE)
    text = WALKTHROUGH.read_text(encoding="utf-8")
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    request = text.split("\n## 7. ", 1)[1].split("\n## ", 1)[0]
    pyinfra_keys = set(all_argument_meta) | set(SSHConnector.data_meta)
    shown = [s for s in re.findall(r"`([^`\n]+)`", prose) if re.match(r'^"[a-z_]+":', s)]
    assert shown
    for span in shown:
        try:
            entries = ast.literal_eval("{" + span.replace('"..."', '"x"') + "}")
        except ValueError:  # JSON, not Python: only the API's request may show it
            assert f"`{span}`" in request, span
            continue
        for key, value in entries.items():
            if key in pyinfra_keys:
                continue
            if f'"{key}"' in request and key not in {k.name for k in KEYS}:
                continue  # the API's (stream, max_tokens, finish_reason)
            _, problems = validate("box", {**example, key: value})
            assert [p for p in problems if p.severity == "error"] == [], span
