"""What a repository offers, asked with the host's real apt in a private root (a file: repository
made here), and the preflight verdicts built on the answer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpubox.config import validate
from gpubox.rules import offers

STANZA = "Package: {name}\nVersion: {version}\nArchitecture: amd64\nFilename: pool/{name}.deb\n"


def flat_repo(root: Path, packages: list[tuple[str, str]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    text = "\n".join(STANZA.format(name=n, version=v) for n, v in packages)
    (root / "Packages").write_text(text)
    release = subprocess.run(
        ["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=NVIDIA", "release", "."],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    (root / "Release").write_text(release.stdout)
    return root


def ask(tmp_path: Path, repo: Path, packages: list[str], at: str) -> offers.RepoIndex:
    line = f"deb [signed-by=/usr/share/keyrings/none.gpg] file:{repo} /\n"
    command = offers.query_command("nvidia_cuda", line, packages, at, base=str(tmp_path / "q"))
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return offers.parse_query(out.stdout.splitlines())


REPO = [
    ("nvidia-driver-cuda", "570.211.01-1"),
    ("nvidia-driver-cuda", "580.105.08-1"),
    ("libcuda1", "570.211.01-1"),
    ("libcuda1", "580.105.08-1"),
    ("nvidia-kernel-dkms", "580.105.08-1"),
    ("cuda-toolkit-12-8", "12.8.1-1"),
    ("cuda-toolkit-12-9", "12.9.1-1"),
]


def test_real_apt_answers_the_asked_names_and_everything_at_the_version(tmp_path: Path) -> None:
    repo = flat_repo(tmp_path / "repo", REPO)
    index = ask(tmp_path, repo, ["nvidia-driver-cuda", "cuda-toolkit-12-8"], "570.211.01-1")
    assert index.error is None
    assert sorted(index.offers) == ["cuda-toolkit-12-8", "libcuda1", "nvidia-driver-cuda"]
    assert sorted(index.offers["nvidia-driver-cuda"]) == ["570.211.01-1", "580.105.08-1"]
    assert index.offers["libcuda1"] == ["570.211.01-1"]  # at the version only
    assert "cuda-toolkit-12-9" not in index.offers


def test_an_unreachable_repository_is_an_error_then_a_cached_answer_with_a_warning(
    tmp_path: Path,
) -> None:
    missing = ask(tmp_path, tmp_path / "nowhere", ["libcuda1"], "570.211.01-1")
    assert missing.error and not missing.offers

    repo = flat_repo(tmp_path / "repo", REPO)
    assert ask(tmp_path, repo, ["libcuda1"], "").offers["libcuda1"]
    for f in repo.iterdir():
        f.unlink()
    repo.rmdir()
    stale = ask(tmp_path, repo, ["libcuda1"], "")
    assert stale.error is None and stale.warnings
    assert sorted(stale.offers["libcuda1"]) == ["570.211.01-1", "580.105.08-1"]


def test_the_query_line_never_carries_the_keyring_and_never_writes_outside_its_dir() -> None:
    command = offers.query_command(
        "docker", "deb [signed-by=/k.gpg] https://mirror.example.org/x bookworm stable\n", ["a"], ""
    )
    assert "[trusted=yes] https://mirror.example.org/x bookworm stable" in command
    assert "/var/cache/gpubox/apt-query/docker" in command
    assert "/etc/apt" not in command and "/var/lib/apt" not in command


def config_of(**data: object):
    config, problems = validate("box", {"gpu_model": "Tesla V100-SXM2-32GB", **data})
    assert config is not None, problems
    return config


def test_missing_pins_name_the_versions_offered_and_the_key_to_override() -> None:
    from gpubox.config import Target

    config = config_of(llamacpp_split_mode="tensor")
    target = Target("debian", "12", "debian12", "debian")
    sets = offers.pinned_sets(config, target, {"binary": None, "active": False})
    # nccl: the reference box (two GPUs, llama.cpp with CUDA) split by tensor builds llama.cpp
    # with NCCL; split by layer (the default), it never asks for it
    assert {s.stage for s in sets} == {"cuda", "dcgm", "container_toolkit", "docker", "nccl"}
    layer = offers.pinned_sets(config_of(), target, {"binary": None, "active": False})
    assert {s.stage for s in layer} == {"cuda", "dcgm", "container_toolkit", "docker"}
    cuda = config.cuda
    indexes = {
        "nvidia_cuda": offers.RepoIndex(
            offers={
                cuda["package"]: ["12.8.0-1", "12.8.2-1"],
                # a pattern pin (*+cuda12.8) is met by any build that matches it
                "libnccl2": ["2.26.2-1+cuda12.8", "2.32.3-1+cuda12.9"],
                "libnccl-dev": ["2.26.2-1+cuda12.8", "2.32.3-1+cuda12.9"],
                **{
                    n: [config.catalog["dcgm"]["version"]]
                    for n in config.catalog["dcgm"]["packages"]
                },
            }
        ),
        "nvidia_container_toolkit": offers.RepoIndex(
            offers={
                n: [config.catalog["container_toolkit"]["version"]]
                for n in config.catalog["container_toolkit"]["packages"]
            }
        ),
        "docker": offers.RepoIndex(error="E: Failed to fetch https://mirror.example.org/x 404"),
    }
    problems = offers.missing(config, sets, indexes)
    text = "\n".join(map(str, problems))
    assert len(problems) == 2, text
    assert f"does not offer {cuda['package']}={cuda['package_version']}" in text
    assert "offered: 12.8.0-1, 12.8.2-1" in text
    assert "catalog_overrides 'cuda.versions.12.8.package_version'" in text
    assert "repos.docker" in text and "cannot read the repository" in text


def test_a_kept_docker_or_the_distros_docker_is_not_asked_about() -> None:
    from gpubox.config import Target

    target = Target("ubuntu", "24.04", "ubuntu2404", "ubuntu")
    kept = offers.pinned_sets(config_of(), target, {"binary": "/usr/bin/docker", "active": True})
    distro = offers.pinned_sets(
        config_of(docker_source="distro"), target, {"binary": None, "active": False}
    )
    assert "docker" not in {s.stage for s in kept + distro}


@pytest.mark.parametrize(
    "lines, offered, warnings, error",
    [
        (["P a 1", "P a 2", "P a 1", "P b 3"], {"a": ["1", "2"], "b": ["3"]}, [], None),
        (["W stale", "P a 1"], {"a": ["1"]}, ["stale"], None),
        (["E no Release file"], {}, [], "no Release file"),
        (["", "garbage", "P lonely"], {}, [], None),
    ],
)
def test_parse_query(lines, offered, warnings, error) -> None:
    index = offers.parse_query(lines)
    assert (index.offers, index.warnings, index.error) == (offered, warnings, error)


def test_an_nccl_pattern_no_build_of_the_repository_matches_is_missing() -> None:
    from gpubox.config import Target

    config = config_of(llamacpp_split_mode="tensor")
    target = Target("debian", "12", "debian12", "debian")
    sets = [s for s in offers.pinned_sets(config, target, {}) if s.stage == "nccl"]
    later = ["2.27.3-1+cuda12.9", "2.32.3-1+cuda12.9"]
    indexes = {"nvidia_cuda": offers.RepoIndex(offers={"libnccl2": later, "libnccl-dev": later})}
    problems = offers.missing(config, sets, indexes)
    assert [p.key for p in problems] == ["nccl", "nccl"]
    assert "does not offer libnccl2=*+cuda12.8 (offered: 2.27.3-1+cuda12.9, 2.32.3-1+cuda12.9)" in (
        str(problems[0])
    )
    assert "catalog_overrides 'cuda.versions.12.8.nccl_version'" in str(problems[0])
