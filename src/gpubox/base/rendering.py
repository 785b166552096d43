"""The package's templates and files (package data, so an installed gpubox finds them as well
as a checkout does), ``render`` for a template and ``as_file`` for text pyinfra uploads. A leaf:
nothing of gpubox is imported here, so the preflight helpers and the stages render alike."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import jinja2

PACKAGE = Path(__file__).resolve().parents[1]  # src/gpubox: templates/ and files/ sit there
TEMPLATES = PACKAGE / "templates"
FILES = PACKAGE / "files"

_jinja = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(template: str, **values: Any) -> str:
    return _jinja.get_template(template).render(**values)


def as_file(text: str) -> io.StringIO:
    return io.StringIO(text)
