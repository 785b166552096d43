"""What every parser module shares: ParseError and the helpers that quote and split text."""

from __future__ import annotations


class ParseError(ValueError):
    """The text is not the output the parser reads; the message says what was expected."""


def _quote(line: str, limit: int = 120) -> str:
    line = line.rstrip("\n")
    return repr(line if len(line) <= limit else line[:limit] + "...")


def _lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").split("\n")
