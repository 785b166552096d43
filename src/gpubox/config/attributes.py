"""HostConfig's typed attributes: ``KeyValue``, the attribute that reads one key's value, and
``fields_source``, which writes ``fields.py`` (one typed attribute per key) from the key table.

The key table (``keys.py``) stays the one source of names, types and defaults; ``fields.py`` is
its typed mirror, regenerated with ``gpubox keys --python`` (through another file: a shell's
``>`` would empty fields.py before gpubox, which imports it, could run):
``gpubox keys --python > fields.new && mv fields.new src/gpubox/config/fields.py``
(tests/unit/test_config_fields.py fails when the two differ). A key's attribute type:

- its declared type (``str``, ``int``, ``bool``, ``float``; a list is ``list[Any]`` and a
  mapping ``dict[Any, Any]``: validation checks the container, not what it holds); a key that
  accepts several types and normalizes them with a type (``driver_branch``: ``str`` or ``int``,
  normalized by ``str``) has the normalizing type;
- ``Literal[...]`` of its choices when it has choices;
- ``... | None`` when the key may be unset: no default and no derived default (a derived
  default always has a value in a validated config: validation refuses the host otherwise).
"""

from __future__ import annotations

import json
from typing import Any, Generic, Never, TypeVar, overload

from gpubox.config.keys import KEYS, KEYS_BY_NAME, Key

T = TypeVar("T")

TYPE_NAMES: dict[type, str] = {list: "list[Any]", dict: "dict[Any, Any]"}


class KeyValue(Generic[T]):
    """The value of one key in a host's config (``config.gpu_count``): read from the config's
    ``values``; a class attribute named after a key of the table, typed ``KeyValue[T]``."""

    name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        # A name the table lacks (fields.py not regenerated after a key's removal) is left to
        # tests/unit/test_config_fields.py: refused here, gpubox could not import to fix it.
        self.name = name
        self.__doc__ = KEYS_BY_NAME[name].doc if name in KEYS_BY_NAME else None

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> KeyValue[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        try:
            return obj.values[self.name]
        except KeyError:
            raise AttributeError(
                f"{type(obj).__name__} has no value for key {self.name!r}", name=self.name, obj=obj
            ) from None

    def __set__(self, obj: object, value: Never) -> None:
        """A config is read-only (``Never``: mypy refuses every assignment)."""
        raise AttributeError(f"{type(obj).__name__} is read-only: cannot set {self.name!r}")


def annotation(key: Key) -> str:
    """The type of ``key``'s attribute, as Python source."""
    if key.choices:
        text = f"Literal[{', '.join(json.dumps(c) for c in key.choices)}]"
    else:
        declared = key.normalize if isinstance(key.normalize, type) else key.type
        kinds = declared if isinstance(declared, tuple) else (declared,)
        text = " | ".join(TYPE_NAMES.get(t, t.__name__) for t in kinds)
    if key.default is None and key.derive is None:
        text += " | None"
    return text


HEADER = '''"""HostConfig's typed attributes: one per key of the key table (``gpubox.config.keys``).

Generated from the table by ``gpubox keys --python`` (how, and the types:
``gpubox.config.attributes``). Do not edit by hand: tests/unit/test_config_fields.py fails when
this file differs from the table.
"""

from __future__ import annotations

from typing import Any, Literal

from gpubox.config.attributes import KeyValue


class KeyFields:
    """Each key's value in a host's validated config (``HostConfig`` inherits them)."""

'''


def fields_source() -> str:
    """The text of ``fields.py``: a class with one typed ``KeyValue`` per key, in table order."""
    lines = [f"    {key.name}: KeyValue[{annotation(key)}] = KeyValue()" for key in KEYS]
    return HEADER + "\n".join(lines) + "\n"
