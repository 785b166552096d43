"""HostConfig's typed attributes: src/gpubox/config/fields.py is generated from the key table
(`gpubox keys --python`), mypy catches a mistyped key, run time refuses one by name, and each
attribute's type holds for the values validation produces."""

from __future__ import annotations

import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
from helpers import REFERENCE

import gpubox
from gpubox import cli
from gpubox.config import KEYS, HostConfig, KeyFields, KeyValue, fields_source, load_host_config
from gpubox.config.attributes import annotation

FIELDS = Path(gpubox.__file__).parent / "config" / "fields.py"
SRC = Path(gpubox.__file__).resolve().parents[1]


def test_fields_py_is_the_key_table_regenerate_with_gpubox_keys_python(capsys):
    """After adding, changing or removing a key (through another file: a shell's > would empty
    fields.py before gpubox, which imports it, could run):
    gpubox keys --python > fields.new && mv fields.new src/gpubox/config/fields.py"""
    assert cli.main(["keys", "--python"]) == 0
    printed = capsys.readouterr().out
    assert printed == fields_source()
    assert FIELDS.read_text(encoding="utf-8") == printed


def test_every_key_is_one_typed_attribute_of_host_config_in_table_order():
    attributes = [n for n, v in vars(KeyFields).items() if isinstance(v, KeyValue)]
    assert attributes == [k.name for k in KEYS]
    assert all(vars(KeyFields)[n].name == n for n in attributes)
    # HostConfig's own names (its fields, properties, methods) never hide a key's attribute.
    assert set(vars(HostConfig)) & {k.name for k in KEYS} == set()
    assert HostConfig.gpu_count.__doc__ == "how many GPUs of gpu_model the box has"


def test_the_types_come_from_the_table():
    by_name = {k.name: annotation(k) for k in KEYS}
    assert by_name["gpu_count"] == "int"
    assert by_name["nvlink_links"] == "int | None"  # no default: may be unset
    assert by_name["driver_branch"] == "str"  # str or int, normalized by str
    assert by_name["driver_version"] == "str"  # derived: always set in a valid config
    assert by_name["driver_kernel_modules"] == 'Literal["proprietary", "open"]'
    assert by_name["burnin_dcgm_level"] == "Literal[1, 2, 3, 4]"
    assert by_name["vllm_gpu_memory_utilization"] == "float"
    assert by_name["docker_users"] == "list[Any]"
    assert by_name["catalog_overrides"] == "dict[Any, Any]"


def test_an_unknown_key_is_an_attribute_error_naming_it():
    config = load_host_config("box", REFERENCE)
    assert config.gpu_count == 2
    with pytest.raises(AttributeError, match="gpu_modle"):
        config.gpu_modle  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(config, "gpu_modle")
    with pytest.raises(AttributeError):
        config.gpu_count = 3  # type: ignore[assignment]
    partial = HostConfig("box", {"gpu_count": 1}, {})
    assert partial.gpu_count == 1
    with pytest.raises(AttributeError, match="no value for key 'gpu_model'"):
        partial.gpu_model  # noqa: B018


def matches(value: object, hint: object) -> bool:
    """Whether ``value`` is of the type ``hint`` (the few forms fields.py uses)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (types.UnionType, typing.Union):
        return any(matches(value, a) for a in args)
    if origin in (list, dict):
        return isinstance(value, origin)
    if hint is type(None):
        return value is None
    assert isinstance(hint, type)
    return type(value) is hint  # a bool is not an int here, nor an int a float


# The reference box, and one that sets the keys a default leaves unset.
CONFIGS = [
    REFERENCE,
    {
        **REFERENCE,
        "driver_branch": 570,
        "nvlink_links": 6,
        "gpu_burn_compute": 70,
        "model_quantization": "Q4_K_M",
        "hf_endpoint": "https://hf-mirror.com",
        "docker_users": ["alice"],
        "burnin_dcgm_level": 3,
    },
]


@pytest.mark.parametrize("data", CONFIGS, ids=["reference", "set"])
def test_each_value_of_a_validated_config_is_of_its_attribute_type(data):
    config = load_host_config("box", data)
    hints = typing.get_type_hints(KeyFields)
    wrong = {
        key.name: (getattr(config, key.name), annotation(key))
        for key in KEYS
        if not matches(getattr(config, key.name), typing.get_args(hints[key.name])[0])
    }
    assert wrong == {}


def test_matches_can_say_no():
    assert not matches(True, int) and not matches(1, float) and not matches(None, str)
    assert not matches("closed", typing.Literal["proprietary", "open"])
    assert matches(None, int | None) and matches([], list[typing.Any])


SNIPPET = """
from gpubox.config import HostConfig


def use(config: HostConfig) -> None:
    count: int = config.gpu_count
    links: int | None = config.nvlink_links
    name: str = config.gpu_model
    print(count, links, name, config.gpu.name, config.branch)
    print(config.gpu_modle)
    wrong: int = config.gpu_model
    flavour: str = config.driver_kernel_modules
    config.gpu_count = 3
    print(wrong, flavour)
"""


def test_mypy_reports_a_mistyped_key_and_a_value_used_as_another_type(tmp_path):
    (tmp_path / "snippet.py").write_text(SNIPPET, encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-error-summary",
            "--ignore-missing-imports",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            "snippet.py",
        ],
        cwd=tmp_path,
        env={"MYPYPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = sorted(
        line.split(": error: ", 1)[0] + ": " + line.rsplit("[", 1)[-1].rstrip("]")
        for line in result.stdout.splitlines()
        if ": error: " in line
    )
    assert errors == [
        "snippet.py:10: attr-defined",  # config.gpu_modle
        "snippet.py:11: assignment",  # str where an int is wanted
        "snippet.py:13: assignment",  # a config is read-only
    ], result.stdout + result.stderr
    assert '"HostConfig" has no attribute "gpu_modle"' in result.stdout
