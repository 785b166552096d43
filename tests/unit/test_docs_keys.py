"""Every inventory key README.md and docs/*.md show is written as an inventory (a Python file)
holds it, and every link to a heading finds that heading.

An inventory is Python: `"allow_desktop_reboot": True` works, `allow_desktop_reboot: true`
copied into it ends in a NameError. So, on every page:

- inline code that sets a key starts with the key in quotes and parses as Python
  (``{SPAN}``: literals, and UPPERCASE names for the reader's own values), and names a key
  that exists (gpubox's, or pyinfra's own: its ``_sudo``-style arguments and its SSH
  connector's ``ssh_*`` data; a quoted name close to one, ``"_use_sudo_password"``, is a
  typo; JSON such as a request's ``"stream": true`` is left alone);
- inline code never starts with a bare key and a colon (``nvlink: false``);
- nowhere, code blocks and program output included, is a key set to a YAML or JSON literal
  (``KEY: true``, ``"KEY": false``, ``"KEY": null``);
- an inline assignment (``hosts = [...]``) and every ```` ```python ```` block parse (a block
  of a host's entries, ``"KEY": VALUE,`` lines, parses inside braces).

Links: every ``PAGE.md#anchor`` and ``#anchor`` resolves to a heading of its page, by GitHub's
slug rules (lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``, a repeated
slug numbered ``-1``, ``-2``)."""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

import pytest
from pyinfra.api.arguments import all_argument_meta
from pyinfra.connectors.ssh import SSHConnector

from gpubox.config.keys import KEYS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)

KNOWN = {k.name for k in KEYS} | set(all_argument_meta) | set(SSHConnector.data_meta)
KEY = "|".join(sorted((re.escape(k) for k in KNOWN if k != "name"), key=len, reverse=True))
BARE = re.compile(rf"^({KEY}):\s")
QUOTED = re.compile(r'^"([a-z_][a-z0-9_]*)":')
NOT_PYTHON = re.compile(
    rf'(?<![\w"])({KEY}):\s+(true|false|null)\b|"({KEY})":\s*(true|false|null)\b'
)


def parses(source: str, names: bool = False) -> bool:
    """``source`` is Python; unless ``names``, its only names are UPPERCASE placeholders (``N``,
    ``MODEL``), so that ``true`` or ``none`` fails."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return names or all(n.id.isupper() for n in ast.walk(tree) if isinstance(n, ast.Name))


def prose(text: str) -> str:
    return FENCE.sub("", text)


def spans(text: str) -> list[str]:
    """The inline code of the page's prose; a span may wrap onto the next line."""
    found = re.findall(r"`([^`]+)`", prose(text))
    return [" ".join(s.split()) for s in found if "\n\n" not in s]


def problems_of(name: str, text: str) -> list[str]:
    """What is not written as Python on the page ``name`` (its ``text``)."""
    found = []
    for span in spans(text):
        if BARE.match(span):
            found.append(f"{name}: `{span}`: quote the key")
            continue
        quoted = QUOTED.match(span)
        if not quoted and not re.match(r"^[a-z_]+ = ", span):
            continue
        if quoted and quoted.group(1) not in KNOWN:
            near = difflib.get_close_matches(quoted.group(1), KNOWN, n=1, cutoff=0.8)
            if near:
                found.append(f"{name}: `{span}`: no key {quoted.group(1)}; {near[0]}?")
        elif not (parses("{" + span + "}") if quoted else parses(span, names=True)):
            found.append(f"{name}: `{span}` does not parse as Python")
    for match in NOT_PYTHON.finditer(text):
        found.append(f"{name}: {match.group(0)!r}: write True, False or None, as Python does")
    for lang, block in FENCE.findall(text):
        if lang.strip() == "python" and not (
            parses(block, names=True) or parses("{\n" + block + "\n}")
        ):
            found.append(f"{name}: a python block does not parse: {block[:60]!r}")
    return found


# What a page shows today that is not Python, on a page being rewritten by its owner: each entry
# must still be found (so the list shrinks as the page is fixed, and never hides a new one).
KNOWN_STALE: dict[str, set[str]] = {}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_key_shown_is_written_as_python(page: Path):
    found = set(problems_of(page.name, page.read_text(encoding="utf-8")))
    stale = KNOWN_STALE.get(page.name, set())
    assert stale <= found, f"fixed now, take out of KNOWN_STALE: {sorted(stale - found)}"
    assert sorted(found - stale) == []


def test_the_key_check_fails_what_an_inventory_would_not_take():
    bad = [
        "Set `allow_desktop_reboot: true` and deploy again.",
        "Set `nvlink: false`.",
        'Set `"allow_desktop_reboot": true`.',
        'Set `"_use_sudo_password": "secret"`.',
        "```\nset allow_desktop_reboot: true in the inventory\n```\n",
        '```python\nbox = {"nvlink": True,\n```\n',
        "`hosts = [(`",
    ]
    for text in bad:
        assert problems_of("x.md", text), text
    good = (
        'Set `"allow_desktop_reboot": True`, `"ssh_user": "owner", "_sudo": True` or '
        '`"_sudo_password": "..."`; `hosts = [("@local", {"_sudo": True})]`.\n'
        "```\nerror: box: nvlink: is true but gpu_count is 1\n```\n"
    )
    assert problems_of("x.md", good) == []


# --- anchors


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", prose(text), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def broken_links(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(text)):
        if re.match(r"^[a-z]+://", target) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        linked = (page.parent / path).resolve() if path else page
        if not linked.is_file() or linked.suffix != ".md":
            broken.append(f"{target}: no such page")
        elif anchor not in anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{target}: no such heading in {linked.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_anchor_links_to_a_heading(page: Path):
    assert broken_links(page) == []


def test_slugs_follow_github():
    assert slug("The first-run smoke test: `gpubox bench --smoke`") == (
        "the-first-run-smoke-test-gpubox-bench---smoke"
    )
    assert slug("4. The MOK screen (at the box's console, about 5 min)") == (
        "4-the-mok-screen-at-the-boxs-console-about-5-min"
    )
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_the_anchor_check_fails_a_missing_heading(tmp_path: Path):
    (tmp_path / "other.md").write_text("# Other\n\n## Serving\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#serving) [ok](#page) [bad](other.md#serving-the-model) "
        "[bad](#nowhere) [bad](gone.md#x) [web](https://example.org/#x)\n"
    )
    assert broken_links(page) == [
        "other.md#serving-the-model: no such heading in other.md",
        "#nowhere: no such heading in page.md",
        "gone.md#x: no such page",
    ]
