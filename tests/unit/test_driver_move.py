"""Issue 30 B: the move between driver builds (gpubox.plans.driver_move): the kept packages'
commands run for real with /bin/sh on .debs built here by the real dpkg-deb (dpkg-query
answered by a script on PATH, the box's installed packages), their fact's parser, the offers
merge and the warning's lines."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpubox.parsers import parse_stanzas
from gpubox.plans import driver_move

PV = "570.211.01-1"
# Debian 12 as the sandbox's stand-in repository builds it: NVIDIA's build at one version
# (its own source and the companions NVIDIA builds at the same version).
PACKAGES = [
    ("nvidia-driver-cuda", "amd64"),
    ("nvidia-modprobe", "amd64"),
    ("nvidia-kernel-support", "all"),
]


def build_deb(where: Path, name: str, version: str, arch: str) -> Path:
    root = where / f"build-{name}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr/share/doc" / name).mkdir(parents=True)
    (root / "usr/share/doc" / name / "README").write_text(f"{name} {version}\n")
    (root / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\n"
        "Maintainer: test <test@example.invalid>\nDescription: a test package\n"
        " for the kept driver\n"
    )
    out = where / f"{name}_{version}_{arch}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(root)
    return out


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Path]:
    """A box's paths: apt's cache with the build's .debs, a pin file, and a dpkg-query that
    lists the build (plus an unrelated package at another version) as installed."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("needs dpkg-deb (Debian's dpkg)")
    cache = tmp_path / "archives"
    cache.mkdir()
    for name, arch in PACKAGES:
        build_deb(cache, name, PV, arch)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rows = [f"ii \t{n}\t{PV}\t{a}" for n, a in PACKAGES] + ["ii \tbash\t5.2.15-2+b2\tamd64"]
    (bin_dir / "dpkg-query").write_text(
        "#!/bin/sh\nprintf '%s\\n' " + " ".join(f"'{r}'" for r in rows) + "\n"
    )
    (bin_dir / "dpkg-query").chmod(0o755)
    pin = tmp_path / "90-gpubox-nvidia-driver"
    pin.write_text("Package: nvidia-driver-cuda\nPin: version 570.211.01-1\nPin-Priority: 1001\n")
    return {"cache": cache, "bin": bin_dir, "pin": pin, "kept": tmp_path / "kept", "tmp": tmp_path}


def run(command: str, box: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{box['bin']}:{os.environ['PATH']}"}
    return subprocess.run(["/bin/sh", "-c", command], text=True, capture_output=True, env=env)


def keep(box: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    command = driver_move.keep_command(
        "570.211.01", [PV], base=str(box["kept"]), cache=str(box["cache"]), pin=str(box["pin"])
    )
    return run(command, box)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the kept directory is chowned root")


@needs_root
def test_the_installed_build_is_kept_with_its_index_sums_and_restore_list(box):
    proc = keep(box)
    assert proc.returncode == 0, proc.stderr
    dest = box["kept"] / "570.211.01"
    assert oct(box["kept"].stat().st_mode & 0o777) == "0o700"
    assert oct(dest.stat().st_mode & 0o777) == "0o700"
    debs = sorted(f"{n}_{PV}_{a}.deb" for n, a in PACKAGES)
    assert sorted(p.name for p in dest.glob("*.deb")) == debs
    # SHA256SUMS: sha256sum's lines for each .deb, bare names
    sums = dict(
        reversed(line.split("  ")) for line in (dest / "SHA256SUMS").read_text().splitlines()
    )
    assert sorted(sums) == debs
    for name, digest in sums.items():
        assert hashlib.sha256((dest / name).read_bytes()).hexdigest() == digest
    stanzas = parse_stanzas((dest / "Packages").read_text())
    assert sorted(s["Package"] for s in stanzas) == sorted(n for n, _ in PACKAGES)
    for s in stanzas:
        assert s["Filename"] == f"./{s['Package']}_{PV}_{s['Architecture']}.deb"
        assert s["SHA256"] == sums[s["Filename"][2:]]
        assert int(s["Size"]) == (dest / s["Filename"][2:]).stat().st_size
    assert (dest / "installed").read_text().split() == sorted(f"{n}={PV}" for n, _ in PACKAGES)
    assert (dest / "apt-preferences").read_text() == box["pin"].read_text()
    assert (dest / "complete").exists()
    assert not [p for p in box["kept"].iterdir() if p.name.startswith(".keep-")]  # renamed
    # the progress: the count, then the count and the size
    assert "keeping its 3 installed packages" in proc.stdout
    assert "kept 3 packages (0 MiB)" in proc.stdout
    # idempotent: a complete directory is left as it is
    before = (dest / "SHA256SUMS").stat().st_mtime_ns
    again = keep(box)
    assert again.returncode == 0 and "kept already" in again.stdout
    assert (dest / "SHA256SUMS").stat().st_mtime_ns == before


@needs_root
def test_a_package_that_cannot_be_kept_fails_naming_it_and_nothing_is_kept(box, tmp_path):
    (box["cache"] / f"nvidia-modprobe_{PV}_amd64.deb").unlink()
    # apt-get download finds nothing: an apt with no sources at all
    (tmp_path / "apt.conf").write_text(
        f'Dir::Etc::sourcelist "/dev/null"; Dir::Etc::sourceparts "{tmp_path}/none"; '
        f'Dir::State::Lists "{tmp_path}/lists"; Dir::Cache "{tmp_path}/c";\n'
    )
    os.environ["APT_CONFIG"] = str(tmp_path / "apt.conf")
    try:
        proc = keep(box)
    finally:
        del os.environ["APT_CONFIG"]
    assert proc.returncode == 1
    assert "cannot keep driver 570.211.01 before replacing it" in proc.stderr
    assert f"nvidia-modprobe={PV}" in proc.stderr and "nvidia-driver-cuda=" not in proc.stderr
    assert "Nothing was removed or changed" in proc.stderr and "dpkg-repack" in proc.stderr
    assert not (box["kept"] / "570.211.01").exists()
    assert list(box["kept"].iterdir()) == []  # the temporary directory went too


@needs_root
def test_the_kept_repository_is_made_of_checked_files_and_a_changed_one_is_named(box):
    assert keep(box).returncode == 0
    repo = box["tmp"] / "repo"
    command = driver_move.repo_command("570.211.01", base=str(box["kept"]), repo=str(repo))
    proc = run(command, box)
    assert proc.returncode == 0, proc.stderr
    assert oct(repo.stat().st_mode & 0o777) == "0o755"  # apt's sandbox user reads it
    kept = box["kept"] / "570.211.01"
    assert (repo / "Packages").read_text() == (kept / "Packages").read_text()
    # the fact then reads the build as kept and the repository as made of it: converged
    fact = driver_move.kept_command(
        "570.211.01", base=str(box["kept"]), repo=str(repo), src=str(box["tmp"] / "none.list")
    )
    state = driver_move.parse_kept(run(fact, box).stdout.splitlines())
    assert list(state.versions) == ["570.211.01"]
    assert state.repo == state.versions["570.211.01"] and state.source is None
    assert "Package: nvidia-driver-cuda" in state.packages
    deb = f"nvidia-driver-cuda_{PV}_amd64.deb"
    assert (repo / deb).stat().st_ino == (kept / deb).stat().st_ino  # the same file
    with open(kept / deb, "ab") as f:
        f.write(b"x")
    bad = run(command, box)
    assert bad.returncode == 1
    assert f"does not match its SHA256SUMS: {deb}: FAILED" in bad.stderr


def test_the_kept_fact_reads_complete_builds_the_repository_source_and_stanzas():
    state = driver_move.parse_kept(
        [
            "KEPT 570.211.01 aaa",
            "KEPT 580.105.08 bbb",
            "REPO aaa",
            "SOURCE deb [trusted=yes] file:/var/lib/gpubox/driver-kept-repo ./",
            "PACKAGES",
            "Package: nvidia-driver-cuda",
            f"Version: {PV}",
            "",
            "Package: nvidia-modprobe",
            f"Version: {PV}",
        ]
    )
    assert state.versions == {"570.211.01": "aaa", "580.105.08": "bbb"}
    assert state.repo == "aaa" and state.source == driver_move.source_line().strip()
    offered = driver_move.kept_offers(state, "570.211.01", PV, ["nvidia-driver-cuda"])
    assert offered == {"nvidia-driver-cuda": [PV], "nvidia-modprobe": [PV]}
    assert driver_move.kept_offers(state, "580.105.08", "580.105.08-1", []) == {}
    empty = driver_move.parse_kept([])
    assert (empty.versions, empty.repo, empty.source, empty.packages) == ({}, None, None, "")


def test_the_kept_build_is_merged_into_the_repositorys_offers():
    repo = {"nvidia-driver-cuda": ["580.105.08-1"], "cuda-toolkit-12-8": ["12.8.1-1"]}
    merged = driver_move.merge_offers(repo, {"nvidia-driver-cuda": [PV, "580.105.08-1"]})
    assert merged == {
        "nvidia-driver-cuda": ["580.105.08-1", PV],
        "cuda-toolkit-12-8": ["12.8.1-1"],
    }
    assert repo["nvidia-driver-cuda"] == ["580.105.08-1"]  # not changed in place


def test_the_old_builds_by_upstream_version():
    installed = {
        "nvidia-driver-cuda": (PV, "nvidia-graphics-drivers"),
        "libcuda1": (PV, "nvidia-graphics-drivers"),
        "nvidia-dkms-580": ("580.178.04-0ubuntu0.24.04.1", "nvidia-graphics-drivers-580"),
    }
    assert driver_move.old_builds(installed, sorted(installed)) == {
        "570.211.01": [PV],
        "580.178.04": ["580.178.04-0ubuntu0.24.04.1"],
    }
    assert driver_move.upstream("1:570.211.01-0ubuntu1") == "570.211.01"
    assert driver_move.upstream("570.211.01") == "570.211.01"


@pytest.mark.parametrize(
    ("args", "action"),
    [
        ((None, True, False, False, False), None),
        (("why", False, False, True, True), "stop-allow-reboot"),
        (("why", True, True, False, False), "stop-local"),
        (("why", True, False, True, False), "stop-desktop"),
        (("why", True, False, True, True), "reboot"),
        (("why", True, False, False, False), "reboot"),
    ],
)
def test_the_reboot_decision(args, action):
    assert driver_move.reboot_action(*args) == action


def test_the_moves_lines_name_from_to_the_kept_build_the_reboot_and_the_key():
    old = {"570.211.01": [PV]}
    lines = driver_move.move_lines(
        "box",
        old,
        "580.105.08",
        "580.105.08-1",
        kept=["570.211.01"],
        reboot="stop-allow-reboot",
        secure_boot_key=("/var/lib/dkms/mok.key", "/var/lib/dkms/mok.pub"),
    )
    assert lines == [
        f"box: the driver moves from 570.211.01 ({PV}) to 580.105.08 (580.105.08-1)",
        "box: driver 570.211.01 is kept in /var/lib/gpubox/driver-kept/570.211.01 already: a "
        "way back needs no repository",
        "box: a reboot follows the install, to load driver 580.105.08: allow_reboot is false, "
        "so the deploy stops after the install; reboot the box yourself, then deploy again",
        "box: Secure Boot is on: DKMS signs driver 580.105.08's modules, for every installed "
        "kernel, with the enrolled key /var/lib/dkms/mok.key (certificate "
        "/var/lib/dkms/mok.pub), so they load after the reboot",
    ]
    reboot = driver_move.move_lines(
        "box", old, "580.105.08", "580.105.08-1", kept=[], reboot="reboot", who="owner (x11)"
    )
    assert "the deploy reboots the box once (it ends the session of owner (x11)" in reboot[2]
    assert (
        "before anything is removed, driver 570.211.01's installed packages are kept" in (reboot[1])
    )
    assert not [line for line in reboot if "Secure Boot" in line]
