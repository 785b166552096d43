"""gpubox's own multi-command outputs: several commands run in one round trip, each output
started by a line ``@@gpubox NAME`` (``gpubox.knowledge.reads.section(NAME)`` is the command that
prints
it), read back into one text per name."""

from __future__ import annotations

SECTION = "@@gpubox "  # a line that starts one command's output in a multi-command read


def parse_sections(text: str) -> dict[str, str]:
    """A multi-command output: each ``@@gpubox NAME`` line starts section NAME (its text the
    lines up to the next one, line ends kept); lines before the first are left out."""
    sections: dict[str, str] = {}
    name = ""
    for line in text.splitlines(keepends=True):
        if line.startswith(SECTION):
            name = line[len(SECTION) :].strip()
            sections[name] = ""
        elif name:
            sections[name] += line
    return sections
