"""The model download with ``model_source: "modelscope"`` run with the real `modelscope` client
(from PyPI: the catalog's requirement, and the oldest release it allows, each in a scratch
venv from wheels cached under the gpubox cache dir) against the sandbox's ModelScope mirror
(gpubox.sandbox.modelscope_mirror) served over HTTPS in this process, with a CA the client
trusts through modelscope_ca_bundle only: the stage's commands as the unit's script runs
them, into the staging directory and then model_dir; a file that does not verify refused;
the stall watchdog restarting the real client, which resumes with a Range request, and
giving up after repeated stalls."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import model_plan, serving
from packaging.requirements import Requirement

from gpubox import catalog
from gpubox.plans import model as plan_model
from gpubox.plans import model_script
from gpubox.sandbox import modelscope_mirror as mirror
from gpubox.sandbox import pypi
from gpubox.sandbox.common import cache_dir
from gpubox.stages import model as model_stage

REPO = "gpubox/tiny-GGUF"
# The payload: pseudo-random (so a byte out of place shows), large enough for several of the
# server's 64 KiB writes.
GOOD = hashlib.shake_256(b"gpubox modelscope test").digest(256 * 1024)
SHA = hashlib.sha256(GOOD).hexdigest()
# The oldest release the catalog's requirement allows, whose CLI is modelscope's own (1.35 to
# 1.37) and puts https:// in front of MODELSCOPE_DOMAIN whatever it holds; the catalog's
# requirement itself installs the newest, whose CLI is modelscope-hub's (1.38 and later).
OLDEST = "modelscope==1.35.1"


def client_venv(root: Path, requirement: str, base: str) -> Path:
    """A venv with ``requirement``, from its wheels (``base`` under the gpubox cache dir; pip
    downloads them from PyPI the first time)."""
    wheels = pypi.ensure_wheels(cache_dir() / base, [requirement], lambda message: None)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "-q", "--no-compile", "--disable-pip-version-check", "--no-index",
         "--find-links", str(wheels), requirement],
        check=True,
        timeout=300,
    )  # fmt: skip
    return venv


@pytest.fixture(scope="module")
def newest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The catalog's requirement, from the wheel set the sandbox's PyPI mirror serves."""
    requirement = catalog.load()["modelscope"]["requirement"]
    return client_venv(tmp_path_factory.mktemp("newest"), requirement, "pypi-modelscope")


@pytest.fixture(scope="module")
def oldest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    requirement = Requirement(catalog.load()["modelscope"]["requirement"])
    assert requirement.specifier.contains(OLDEST.split("==")[1])
    assert not requirement.specifier.contains("1.35.0")  # OLDEST is the range's oldest
    return client_venv(tmp_path_factory.mktemp("oldest"), OLDEST, "pypi-modelscope-oldest")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return mirror.make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def server(tmp_path: Path, tls: dict[str, Path]) -> Iterator[int]:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(GOOD)
    repo = mirror.make_repo(REPO, {"tiny.gguf": model})
    handler = mirror.handler_class(
        {REPO: repo}, tmp_path / "control.json", tmp_path / "requests.jsonl"
    )
    context = mirror.server_context(tls["cert"], tls["key"])
    with serving(handler, mirror.serve, tls=context) as port:
        yield port


def run_step(
    p: model_stage.ModelPlan, venv: Path, port: int, ca: Path, stall_s: int = 120
) -> subprocess.CompletedProcess[str]:
    """The stage's commands as the unit's script runs them, against the catalog's kind of
    endpoint (an https URL) on loopback; the client's home is a scratch directory."""
    commands = model_stage.download_commands(
        p,
        "http://127.0.0.1:9",
        f"https://127.0.0.1:{port}",
        ms_venv=str(venv),
        stall_s=stall_s,
        ms_ca_bundle=str(ca),
    )
    home = Path(p.directory).parent / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run(
        ["sh", "-c", model_stage.step_command(commands)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(home)},
    )


def log(directory: Path) -> list[dict]:
    """The mirror's requests, in the order they came (each is logged once answered), but for
    Aliyun's region, which the clients may ask first (a 0.2 s probe; answered 404)."""
    entries = mirror.read_log(directory / "requests.jsonl")
    return sorted(
        (e for e in entries if e["path"] != "/api/v1/repos/internalAccelerationInfo"),
        key=lambda e: e["time"],
    )


def gets(directory: Path) -> list[dict]:
    return [e for e in log(directory) if "/repo?" in e["path"]]


def paths(directory: Path) -> list[str]:
    return [e["path"] for e in log(directory)]


def state(p: model_stage.ModelPlan) -> str:
    return subprocess.run(
        ["sh", "-c", plan_model.model_state_command(p)], capture_output=True, text=True
    ).stdout


def test_the_newest_client_downloads_from_the_https_mirror_into_model_dir(
    newest, server, tls, tmp_path
):
    p = model_plan(tmp_path / "models", source="modelscope", repo=REPO, sha256=SHA)
    result = run_step(p, newest, server, tls["ca"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "models" / "tiny.gguf").read_bytes() == GOOD
    # the staging directory (the client's .incomplete file) is gone with it
    assert sorted(os.listdir(tmp_path / "models")) == ["tiny.gguf", "tiny.gguf.gpubox-verified"]
    assert plan_model.verified(p, state(p))
    # modelscope-hub asks no listing: the file at its default revision, master
    assert paths(tmp_path) == [f"/api/v1/models/{REPO}/repo?Revision=master&FilePath=tiny.gguf"]
    assert "deprecated" not in result.stderr  # MODELSCOPE_ENDPOINT: no MODELSCOPE_DOMAIN warning


def test_the_oldest_client_gets_the_host_not_https_https(oldest, server, tls, tmp_path):
    """modelscope 1.35 asks ``'https://' + MODELSCOPE_DOMAIN``: with the catalog's URL there
    it asked https://https://... (issue 29 B1); with the host, the mirror. (1.20 to 1.35.0,
    which the catalog allowed before, do not even start in a fresh venv: catalog.yml.)"""
    p = model_plan(tmp_path / "models", source="modelscope", repo=REPO, sha256=SHA)
    result = run_step(p, oldest, server, tls["ca"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "models" / "tiny.gguf").read_bytes() == GOOD
    assert sorted(os.listdir(tmp_path / "models")) == ["tiny.gguf", "tiny.gguf.gpubox-verified"]
    # its own protocol: whether the repository exists, its revisions, the listing at its
    # default revision (the newest tag made before its release), then the file, asked with
    # a closed range
    assert paths(tmp_path) == [
        f"/api/v1/models/{REPO}",
        f"/api/v1/models/{REPO}/revisions",
        f"/api/v1/models/{REPO}/repo/files?Revision={mirror.TAG}&Recursive=True",
        f"/api/v1/models/{REPO}/repo?Revision={mirror.TAG}&FilePath=tiny.gguf",
    ]
    (get,) = gets(tmp_path)
    assert (get["status"], get["range"]) == (206, f"bytes=0-{len(GOOD) - 1}")


def test_the_plans_revision_reaches_the_mirror(newest, server, tls, tmp_path):
    p = model_plan(tmp_path / "models", source="modelscope", repo=REPO, sha256=SHA, revision="v1.0")
    assert run_step(p, newest, server, tls["ca"]).returncode == 0
    (get,) = gets(tmp_path)
    assert get["path"] == f"/api/v1/models/{REPO}/repo?Revision=v1.0&FilePath=tiny.gguf"


def test_a_wrong_checksum_is_refused_naming_both_and_nothing_stays(newest, server, tls, tmp_path):
    """The mirror's bytes are what the client expects, but not the plan's sha256: gpubox's
    check refuses them before the move, and removes the staging directory with them."""
    bad = hashlib.sha256(b"other bytes").hexdigest()
    p = model_plan(tmp_path / "models", source="modelscope", repo=REPO, sha256=bad)
    result = run_step(p, newest, server, tls["ca"])
    assert result.returncode == 1
    assert f"tiny.gguf has sha256 {SHA}, expected {bad}; removed it" in result.stderr
    assert os.listdir(tmp_path / "models") == []


def test_a_stalled_client_is_restarted_and_resumes_with_a_range(newest, server, tls, tmp_path):
    """The mirror sends 64 KiB, then nothing: the watchdog kills the real client after
    download_stall_s, and the next run asks for the rest (the client's .incomplete file in
    the staging directory stays)."""
    (tmp_path / "control.json").write_text(json.dumps({"stall_after": 65536, "stalls": 1}))
    p = model_plan(tmp_path / "models", source="modelscope", repo=REPO, sha256=SHA)
    result = run_step(p, newest, server, tls["ca"], stall_s=5)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("no new bytes for 5 s (download_stall_s): restarting") == 1
    assert (tmp_path / "models" / "tiny.gguf").read_bytes() == GOOD
    first, second = gets(tmp_path)
    assert first["stalled"] is True and first["bytes"] == 65536
    assert (second["status"], second["range"]) == (206, "bytes=65536-")
    assert second["bytes"] == len(GOOD) - 65536


def test_the_watchdog_gives_up_after_repeated_stalls(newest, server, tls, tmp_path):
    (tmp_path / "control.json").write_text(json.dumps({"stall_after": 0, "stalls": 99}))
    p = model_plan(tmp_path / "models", source="modelscope", repo=REPO, sha256=SHA)
    result = run_step(p, newest, server, tls["ca"], stall_s=1)
    assert result.returncode == 1
    assert f"stalled {model_script.MAX_STALLS} times; giving up" in result.stderr
    assert "Xet" not in result.stdout  # modelscope has no Xet to turn off
    assert not (tmp_path / "models" / "tiny.gguf").exists()
