"""The sandbox's llama.cpp source: the catalog's sdist, verified against the catalog's sha256,
cached, and published unchanged at a path that mirrors files.pythonhosted.org."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpubox import catalog
from gpubox.sandbox import llamacpp


def test_the_source_is_read_from_the_catalog():
    source = llamacpp.pinned()
    assert source["url"] == catalog.load()["llamacpp"]["url"]
    assert source["sha256"] == catalog.load()["llamacpp"]["sha256"]
    assert (source["project"], source["version"], source["name"]) == (
        "llama-cpp-python",
        "0.3.36",
        "llama_cpp_python-0.3.36.tar.gz",
    )


def test_the_served_path_mirrors_pythonhosted():
    url = catalog.load()["llamacpp"]["url"]
    path = llamacpp.served_path(url)
    assert path == "pypi" + url.removeprefix("https://files.pythonhosted.org")
    assert path.startswith("pypi/packages/ec/e9/")
    assert path.endswith("/llama_cpp_python-0.3.36.tar.gz")


def test_a_url_that_is_no_sdist_is_refused():
    data = catalog.load()
    data["llamacpp"]["url"] = "https://example.org/llama.cpp/archive/b1.zip"
    with pytest.raises(llamacpp.LlamaCppSourceError, match="not an sdist"):
        llamacpp.pinned(data)


@pytest.fixture
def pinned_to(monkeypatch):
    """Pin the catalog (as the sandbox module reads it) to ``content``'s sha256."""

    def pin(content: bytes) -> dict[str, str]:
        source = {
            "url": "https://files.pythonhosted.org/packages/aa/bb/cc/pkg_x-1.0.tar.gz",
            "sha256": hashlib.sha256(content).hexdigest(),
            "name": "pkg_x-1.0.tar.gz",
            "project": "pkg-x",
            "version": "1.0",
        }
        monkeypatch.setattr(llamacpp, "pinned", lambda host_catalog=None: source)
        return source

    return pin


def test_a_cached_sdist_is_used_and_stale_files_go(tmp_path, pinned_to, monkeypatch):
    pinned_to(b"the sdist")
    cache = tmp_path / "1.0"
    cache.mkdir()
    (cache / "pkg_x-1.0.tar.gz").write_bytes(b"the sdist")
    (cache / "b11312.tar.gz").write_bytes(b"a repacked archive of old")  # from older gpuboxes
    (cache / "meta.json").write_text("{}")
    (tmp_path / "0.3.35").mkdir()

    def no_pip(*args):
        raise AssertionError("pip must not run: the cached file is the catalog's")

    monkeypatch.setattr(llamacpp, "_pip_download", no_pip)
    facts = llamacpp.ensure_sdist(tmp_path)
    assert facts["path"] == str(cache / "pkg_x-1.0.tar.gz")
    assert facts["served_path"] == "pypi/packages/aa/bb/cc/pkg_x-1.0.tar.gz"
    assert facts["size"] == len(b"the sdist")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["1.0", "pkg_x-1.0.tar.gz"]


def test_a_download_with_another_sha256_is_refused(tmp_path, pinned_to, monkeypatch):
    pinned_to(b"the sdist")

    def pip(source, tmp: Path, progress):
        (tmp / source["name"]).write_bytes(b"something else")
        return tmp / source["name"]

    monkeypatch.setattr(llamacpp, "_pip_download", pip)
    with pytest.raises(llamacpp.LlamaCppSourceError, match="the catalog pins .*: refused"):
        llamacpp.ensure_sdist(tmp_path)
    assert not (tmp_path / "1.0" / "pkg_x-1.0.tar.gz").exists()


def test_a_damaged_cache_is_downloaded_again(tmp_path, pinned_to, monkeypatch):
    pinned_to(b"the sdist")
    (tmp_path / "1.0").mkdir()
    (tmp_path / "1.0" / "pkg_x-1.0.tar.gz").write_bytes(b"the sdis")  # cut short
    calls = []

    def pip(source, tmp: Path, progress):
        calls.append(source["project"])
        (tmp / source["name"]).write_bytes(b"the sdist")
        return tmp / source["name"]

    monkeypatch.setattr(llamacpp, "_pip_download", pip)
    facts = llamacpp.ensure_sdist(tmp_path)
    assert calls == ["pkg-x"] and Path(facts["path"]).read_bytes() == b"the sdist"
