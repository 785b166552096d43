"""Withdrawing a driver build from the sandbox's stand-in NVIDIA repository (issue 30 F): the
index is rewritten and signed again, apt's real client (over the stand-in server, the
signature checked against the repository's keyring) stops seeing the build at its next update,
and restore brings it back. Small packages, built with dpkg-deb as the sandbox builds its own."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import serving

from gpubox.sandbox import cli, debian_real, repo, repo_build, repo_index, serve
from gpubox.sandbox.common import SandboxError
from gpubox.sandbox.repo_debs import Deb

BUILDS = {"570.211.01": "570.211.01-1", "580.105.08": "580.105.08-1", "580.900.01": "580.900.01-1"}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    debs = [
        Deb(name, pv, "stand-in") for pv in BUILDS.values() for name in ("nvidia-smi", "libcuda1")
    ]
    debs.append(Deb("cuda-toolkit-12-8", "12.8.1-1", "not a driver build"))
    repo_build.build_repo(tmp_path / "root", debs, driver_builds=BUILDS)
    return tmp_path / "root"


def cuda_repo(root: Path) -> Path:
    return root / "nvidia" / repo_build.DISTRO / repo_build.ARCH_DIR


def versions(root: Path) -> set[str]:
    text = (cuda_repo(root) / "Packages").read_text()
    return set(re.findall(r"^Version: (\S+)$", text, re.M))


def test_withdraw_rewrites_and_signs_the_index_and_restore_undoes_it(root: Path):
    everything = versions(root)
    assert everything == {*BUILDS.values(), "12.8.1-1"}
    assert repo_index.withdraw("570.211.01", root) == ["570.211.01"]
    assert versions(root) == everything - {"570.211.01-1"}
    assert (cuda_repo(root) / "nvidia-smi_570.211.01-1_amd64.deb").exists()  # stays on disk
    assert repo_index.withdrawn(root) == ["570.211.01"]  # kept until restore, in a state file
    assert repo_index.withdraw("580.105.08", root) == ["570.211.01", "580.105.08"]
    assert versions(root) == {"580.900.01-1", "12.8.1-1"}
    # Release names the new indexes' hashes, and is signed by the repository's own key
    release = (cuda_repo(root) / "Release").read_text()
    for name in ("Packages", "Packages.gz"):
        digest = hashlib.sha256((cuda_repo(root) / name).read_bytes()).hexdigest()
        assert re.search(rf"^ {digest} +\d+ {name}$", release, re.M), name
    keyring = cuda_repo(root) / repo_build.KEYRING_NAME
    for args in (["InRelease"], ["Release.gpg", "Release"]):
        check = subprocess.run(
            ["gpgv", "--keyring", str(keyring), *(str(cuda_repo(root) / a) for a in args)],
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stderr
    assert "Origin: NVIDIA\n" in release and "Label: NVIDIA CUDA\n" in release
    assert repo_index.restore(root) == ["570.211.01", "580.105.08"]
    assert versions(root) == everything and repo_index.withdrawn(root) == []
    assert repo_index.restore(root) == []


def test_an_unknown_build_is_refused_and_nothing_changes(root: Path):
    before = (cuda_repo(root) / "InRelease").read_bytes()
    with pytest.raises(SandboxError, match=r"no driver build '535.309.01'.*570.211.01, 580.105.08"):
        repo_index.withdraw("535.309.01", root)
    assert (cuda_repo(root) / "InRelease").read_bytes() == before
    assert repo_index.withdrawn(root) == []


def test_apt_stops_seeing_a_withdrawn_build_at_its_next_update(root: Path, tmp_path: Path):
    """apt's real client against the stand-in server: the signed index, a withdrawn build gone
    after apt-get update, back after restore, even within the same second (If-Modified-Since);
    the kept signing key is never served."""
    handler = functools.partial(repo._Handler, directory=str(root))
    apt = tmp_path / "apt"
    with serving(handler, serve.serve_until_stopped, describe=lambda port: "") as port:
        url = f"http://127.0.0.1:{port}/nvidia/{repo_build.DISTRO}/{repo_build.ARCH_DIR}/"
        keyring = cuda_repo(root) / repo_build.KEYRING_NAME
        sources = debian_real._prepare_apt_root(apt, f"deb [signed-by={keyring}] {url} /\n")
        options = debian_real._apt_options(apt, sources)

        def madison() -> set[str]:
            update = subprocess.run(
                ["apt-get", *options, "-q", "update"], capture_output=True, text=True, timeout=120
            )
            assert update.returncode == 0 and "W:" not in update.stderr, update.stderr
            out = subprocess.run(
                ["apt-cache", *options, "madison", "nvidia-smi"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            return {line.split("|")[1].strip() for line in out.splitlines()}

        assert madison() == set(BUILDS.values())
        repo_index.withdraw("570.211.01", root)
        assert madison() == {"580.105.08-1", "580.900.01-1"}
        repo_index.restore(root)
        repo_index.withdraw("580.900.01", root)  # two changes within a second or so
        assert madison() == {"570.211.01-1", "580.105.08-1"}
        repo_index.restore(root)
        assert madison() == set(BUILDS.values())
        for path in (".withdraw/signing-key.asc", "nvidia/../.withdraw/withdrawn.json"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=10)
            assert refused.value.code == 404
        # a flat index's "Filename: ./NAME.deb" (NVIDIA's and the stand-in's): apt asks for
        # ".../x86_64/./NAME.deb", a "." that is no hidden path (issue 30 B's fleet run)
        deb = next(cuda_repo(root).glob("nvidia-smi_*.deb")).name
        with urllib.request.urlopen(f"{url}./{deb}", timeout=10) as answer:
            assert answer.status == 200


def test_the_built_repository_says_which_builds_it_serves(root: Path):
    meta = json.loads((root / "meta.json").read_text())
    assert meta["driver_builds"] == BUILDS and repo.served_builds(root) == BUILDS
    assert (root / ".withdraw" / "signing-key.asc").stat().st_mode & 0o077 == 0


def test_cli_repo_withdraw_and_restore(root: Path, monkeypatch, capsys):
    monkeypatch.setattr(repo_index, "current_root", lambda: root)
    assert cli.main(["repo", "withdraw", "570.211.01"]) == 0
    assert capsys.readouterr().out == "repo: offers 580.105.08, 580.900.01; withdrawn 570.211.01\n"
    assert cli.main(["repo", "withdraw", "1.2.3"]) == 1
    assert "serves 570.211.01, 580.105.08, 580.900.01" in capsys.readouterr().err
    assert cli.main(["repo", "restore"]) == 0
    assert capsys.readouterr().out == "repo: offers 570.211.01, 580.105.08, 580.900.01\n"
    with pytest.raises(SystemExit):
        cli.main(["repo", "withdraw"])
