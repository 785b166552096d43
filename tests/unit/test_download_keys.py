"""The model download's keys (issue 17): model_revision, download_stall_s and
download_memory_max are checked, and a bad value names its key."""

from __future__ import annotations

from helpers import REFERENCE

from gpubox.config import validate


def problems(**data: object) -> dict[str, str]:
    _, found = validate("b", {**REFERENCE, **data})
    return {p.key: p.message for p in found if p.severity == "error"}


def test_the_defaults_pass():
    config, found = validate("b", REFERENCE)
    assert config is not None and not [p for p in found if p.severity == "error"]
    assert (config.download_stall_s, config.download_memory_max) == (120, "4G")
    assert config.model_revision is None


def test_a_bad_memory_cap_names_its_key():
    assert "download_memory_max" in problems(download_memory_max="4 GB")
    assert "download_memory_max" in problems(download_memory_max="-1G")
    assert problems(download_memory_max="512M") == {}
    assert problems(download_memory_max="infinity") == {}


def test_a_bad_revision_names_its_key():
    assert "model_revision" in problems(model_revision="main; rm -rf /")
    assert "model_revision" in problems(model_revision="../x")
    assert problems(model_revision="0123456789abcdef0123456789abcdef01234567") == {}
    assert problems(model_revision="v1.0") == {}


def test_the_stall_time_has_a_floor():
    assert "download_stall_s" in problems(download_stall_s=1)
    assert problems(download_stall_s=30) == {}
