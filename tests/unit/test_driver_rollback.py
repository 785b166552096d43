"""issue 30 C: did a driver move hold (gpubox.rules.driver_rollback), and the box-side
rollback script (gpubox.plans.driver_rollback) run against a temporary directory, with apt,
apt-mark and dpkg-query replaced by recorders (the script's own logic runs for real: the kept
directory's checks, the files it restores, the package lists it hands apt)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from helpers import REFERENCE

from gpubox.base import layout
from gpubox.config import load_host_config, target_for
from gpubox.knowledge import reads
from gpubox.parsers import SECTION
from gpubox.plans import driver as driver_plan
from gpubox.plans import driver_rollback as rollback_plan
from gpubox.rules import driver_rollback as judge

SMI = Path(__file__).parents[1] / "fixtures" / "nvidia-smi"
NVLINK_8 = (SMI / "nvlink-s_8xV100-SXM2-32GB_580.173.02.txt").read_text()
NVLINK_ONE_DOWN = (SMI / "nvlink-s_V100-SXM2-32GB_inactive_azhpc-issue73.txt").read_text()
NO_DRIVER = (SMI / "error_no-driver_gcp-pr18.txt").read_text()
MISMATCH = (SMI / "error_version-mismatch_570.124_tinygrad-issue47.txt").read_text()


def query(count: int, version: str) -> str:
    """`nvidia-smi --query-gpu` (reads.GPU_QUERY's fields, csv,noheader,nounits) for
    ``count`` V100s, the values as the 8xV100 fixture's rows give them."""
    assert len(reads.GPU_QUERY_FIELDS) == 11
    return "".join(
        f"{i}, Tesla V100-SXM2-32GB, GPU-{i:08d}, 00000000:{0x1A + i:02X}:00.0, {version}, "
        "Enabled, 0, 32768, 35, 41.25, 300.00\n"
        for i in range(count)
    )


def output(loaded: str, smi: str, code: int, nvlink: str) -> str:
    """STATE_COMMAND's output: its sections, as the command prints them."""
    assert '@@gpubox smi-exit\' "$?"' in judge.STATE_COMMAND
    return (
        f"{SECTION}loaded\n{loaded}{SECTION}smi\n{smi}{SECTION}smi-exit {code}\n"
        f"{SECTION}nvlink\n{nvlink}"
    )


BEFORE = judge.state_before("570.211.01", query(8, "570.211.01"), NVLINK_8)


def test_the_state_before_counts_the_gpus_and_the_links_up():
    assert BEFORE.gpus == 8 and BEFORE.loaded == "570.211.01"
    assert len(BEFORE.links_up) == 48 and (7, 5) in BEFORE.links_up


def test_a_move_that_holds_fails_nothing():
    after = judge.state_from(output("580.105.08\n", query(8, "580.105.08"), 0, NVLINK_8))
    assert after.gpus == 8 and after.smi_error is None
    assert judge.failures(BEFORE, after, "580.105.08") == []


def test_no_module_loaded_and_nvidia_smi_failing_are_both_said_naming_the_new_version():
    after = judge.state_from(output(NO_DRIVER, NO_DRIVER, 9, NO_DRIVER))
    assert after.loaded is None
    assert judge.failures(BEFORE, after, "580.105.08") == [
        "driver 580.105.08: the nvidia kernel module is not loaded",
        "driver 580.105.08: nvidia-smi fails (exit 9: NVIDIA-SMI has failed because it "
        "couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver "
        "is installed and running.)",
        "driver 580.105.08: NVLink link(s) down that were up before: "
        + ", ".join(f"GPU {g} link {n}" for g in range(8) for n in range(6)),
    ]


def test_another_module_or_a_mismatch_is_not_the_new_driver():
    other = judge.state_from(output("570.211.01\n", query(8, "570.211.01"), 0, NVLINK_8))
    assert judge.failures(BEFORE, other, "580.105.08") == [
        "driver 580.105.08: the loaded nvidia module is 570.211.01"
    ]
    mismatch = judge.state_from(output(MISMATCH, MISMATCH, 18, NVLINK_8))
    assert mismatch.loaded == "mismatch"
    assert judge.failures(BEFORE, mismatch, "580.105.08")[0].endswith("version mismatch)")


def test_fewer_gpus_and_lost_links_fail_more_do_not():
    fewer = judge.state_from(output("580.105.08\n", query(7, "580.105.08"), 0, NVLINK_8))
    assert judge.failures(BEFORE, fewer, "580.105.08") == [
        "driver 580.105.08: nvidia-smi lists 7 GPU(s), 8 before"
    ]
    before = judge.state_before("570.211.01", query(4, "570.211.01"), NVLINK_8)
    down = judge.state_from(output("580.105.08\n", query(4, "580.105.08"), 0, NVLINK_ONE_DOWN))
    assert judge.failures(before, down, "580.105.08") == [
        "driver 580.105.08: NVLink link(s) down that were up before: "
        + ", ".join(
            f"GPU {g} link {n}"
            for g in range(8)
            for n in range(6)
            if (g, n) not in {(3, 0), (3, 1), (3, 2), (3, 4)}
        )
    ]
    # links down before the move are not the new driver's doing
    same = judge.state_before("570.211.01", query(4, "570.211.01"), NVLINK_ONE_DOWN)
    assert judge.failures(same, down, "580.105.08") == []
    more = judge.state_from(output("580.105.08\n", query(9, "580.105.08"), 0, NVLINK_8))
    assert judge.failures(BEFORE, more, "580.105.08") == []


def test_the_state_command_reads_the_checks_reads():
    for read in (reads.LOADED_DRIVER, reads.GPU_QUERY, reads.NVLINK_STATUS):
        assert read.command_for() in judge.STATE_COMMAND


# --------------------------------------------------------------------------- the box's side


def _plan(os_id: str, version_id: str, data: dict[str, object]) -> driver_plan.DriverPlan:
    """The driver plan when NVIDIA's repository offers the catalog's roots of both flavours at
    the branch's package version."""
    config = load_host_config("box", data)
    target = target_for({"ID": os_id, "VERSION_ID": version_id}, config.catalog)
    assert target is not None
    packages = config.driver_packages(target.family)
    offered = {n: [packages.package_version] for n in packages.installed + packages.refused}
    return driver_plan.plan(config, target, offered)


@pytest.mark.parametrize(("os_id", "version_id"), [("ubuntu", "24.04"), ("debian", "12")])
@pytest.mark.parametrize("branch", ["570", "580"])
def test_the_blacklist_restored_is_the_one_the_stage_renders_for_the_kept_pin(
    os_id: str, version_id: str, branch: str
):
    plan = _plan(os_id, version_id, {**REFERENCE, "driver_branch": branch})
    assert rollback_plan.blacklist_for_pin(plan.pin) == plan.unattended
    assert plan.refused  # the other flavour's names are in it too
    for name in plan.refused:
        assert '"^' + name.replace(".", "\\.") + '$";' in plan.unattended


OLD_PV, NEW_PV = "570.211.01-1", "580.105.08-1"
RECORDER = """#!/bin/sh
printf '%s\\n' "$(basename "$0") $*" >> "$LOG"
"""
DPKG_QUERY = """#!/bin/sh
cat "$DPKG_STATUS"
"""


def kept_dir(root: Path, debs: dict[str, bytes]) -> Path:
    """A kept driver build as the contract lays it out (docs/deploy.md, the kept driver)."""
    d = root / "driver-kept" / "570.211.01"
    d.mkdir(parents=True)
    sums = []
    for name, data in debs.items():
        (d / name).write_bytes(data)
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    (d / "SHA256SUMS").write_text("".join(sums))
    (d / "Packages").write_text("")
    (d / "installed").write_text(
        f"nvidia-driver-cuda={OLD_PV}\nnvidia-kernel-dkms={OLD_PV}\nlibcuda1={OLD_PV}\n"
    )
    (d / "apt-preferences").write_text("Package: nvidia-driver-cuda\nPin: version 570\n")
    (d / "complete").write_text("")
    return d


BLACKLIST = 'Unattended-Upgrade::Package-Blacklist {\n    "^nvidia-driver-cuda$";\n};\n'


def run_script(
    tmp_path: Path, dpkg: str, blacklist: str | None = BLACKLIST, **marks: list[str]
) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("apt-get", "apt-mark"):
        (bin_dir / tool).write_text(RECORDER)
    (bin_dir / "dpkg-query").write_text(DPKG_QUERY)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / "status").write_text(dpkg)
    (tmp_path / "etc").mkdir(exist_ok=True)
    pin, listed = tmp_path / "etc" / "pin", tmp_path / "etc" / "blacklist"
    pin.write_text("the new pin\n")
    listed.write_text("the new blacklist\n")
    text = rollback_plan.script(
        "570.211.01",
        NEW_PV,
        blacklist,
        kept_root=str(tmp_path / "driver-kept"),
        repo=str(tmp_path / "driver-kept-repo"),
        source=str(tmp_path / "etc" / "kept.list"),
        pin_path=str(pin),
        blacklist_path=str(listed),
        **marks,  # type: ignore[arg-type]
    )
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LOG": str(tmp_path / "log"),
        "DPKG_STATUS": str(tmp_path / "status"),
    }
    return subprocess.run(
        ["sh", "-c", "why='driver 580.105.08: the nvidia kernel module is not loaded'\n" + text],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


# dpkg-query's lines on the box after the move (${db:Status-Abbrev} ${Package} ${Version}):
# the new build's packages, one of them (firmware) a name the old build did not have.
AFTER_MOVE = (
    f"hi  nvidia-driver-cuda {NEW_PV}\nhi  nvidia-kernel-dkms {NEW_PV}\n"
    f"ii  libcuda1 {NEW_PV}\nii  firmware-nvidia-gsp-580 {NEW_PV}\nii  dkms 3.0.10-8\n"
)


def test_the_rollback_restores_the_pin_and_installs_exactly_the_kept_list(tmp_path: Path):
    kept_dir(tmp_path, {"a_570_amd64.deb": b"a", "b_570_amd64.deb": b"b"})
    done = run_script(tmp_path, AFTER_MOVE)
    assert done.returncode == 0, done.stderr
    assert (
        tmp_path / "etc" / "pin"
    ).read_text() == "Package: nvidia-driver-cuda\nPin: version 570\n"
    assert (tmp_path / "etc" / "blacklist").read_text().count('"^nvidia-driver-cuda$";') == 1
    assert oct((tmp_path / "etc" / "pin").stat().st_mode & 0o777) == "0o644"
    log = (tmp_path / "log").read_text().splitlines()
    update, unhold, install, hold = log
    assert update.startswith("apt-get -q -o Dir::Etc::SourceList=") and update.endswith(" update")
    assert "APT::Get::List-Cleanup=false" in update
    assert unhold == "apt-mark unhold firmware-nvidia-gsp-580"
    assert install.split(" install ")[1].split() == [
        "-y",
        "--no-install-recommends",
        "--allow-downgrades",
        "--allow-change-held-packages",
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
        f"nvidia-driver-cuda={OLD_PV}",
        f"nvidia-kernel-dkms={OLD_PV}",
        f"libcuda1={OLD_PV}",
        "firmware-nvidia-gsp-580-",
    ]
    assert hold == "apt-mark hold nvidia-driver-cuda nvidia-kernel-dkms libcuda1"
    # apt read the kept build alone, served as the way back serves it (driver_move)
    source = tmp_path / "etc" / "kept.list"
    assert f"-o Dir::Etc::SourceList={source} " in install
    repo = tmp_path / "driver-kept-repo"
    assert source.read_text() == f"deb [trusted=yes] file:{layout.DRIVER_KEPT_REPO} ./\n"
    assert sorted(p.name for p in repo.iterdir()) == [
        "Packages",
        "SHA256SUMS",
        "a_570_amd64.deb",
        "b_570_amd64.deb",
    ]


def test_a_tampered_package_stops_the_rollback_before_any_change_saying_so(tmp_path: Path):
    d = kept_dir(tmp_path, {"a_570_amd64.deb": b"a"})
    (d / "a_570_amd64.deb").write_bytes(b"not a")
    done = run_script(tmp_path, AFTER_MOVE)
    assert done.returncode != 0
    assert (tmp_path / "etc" / "pin").read_text() == "the new pin\n"
    assert not (tmp_path / "log").exists()
    assert "does not match its SHA256SUMS: a_570_amd64.deb: FAILED" in done.stderr
    assert "the rollback to driver 570.211.01 FAILED at: checking the kept packages against" in (
        done.stderr
    )
    assert "(driver 580.105.08: the nvidia kernel module is not loaded)" in done.stderr
    assert "Nothing was rebooted" in done.stderr


def test_an_incomplete_kept_dir_is_refused(tmp_path: Path):
    d = kept_dir(tmp_path, {"a_570_amd64.deb": b"a"})
    (d / "complete").unlink()
    done = run_script(tmp_path, AFTER_MOVE)
    assert done.returncode != 0 and "FAILED at: finding the kept packages" in done.stderr
    assert (tmp_path / "etc" / "pin").read_text() == "the new pin\n"
    assert not (tmp_path / "log").exists()


def test_a_kept_build_without_a_pin_file_goes_back_without_one(tmp_path: Path):
    """A build that was not gpubox's (Ubuntu's own driver, replaced by the move) had no pin
    file: the rollback removes the new one, and the blacklist."""
    d = kept_dir(tmp_path, {"a_570_amd64.deb": b"a"})
    (d / "apt-preferences").write_text("")
    assert rollback_plan.blacklist_for_pin("") is None
    done = run_script(tmp_path, AFTER_MOVE, blacklist=None)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "etc" / "pin").exists()
    assert not (tmp_path / "etc" / "blacklist").exists()


def test_the_holds_and_auto_marks_before_the_move_come_back_with_the_kept_packages(
    tmp_path: Path,
):
    kept_dir(tmp_path, {"a_570_amd64.deb": b"a"})
    done = run_script(
        tmp_path,
        AFTER_MOVE,
        held=["nvidia-kernel-dkms", "nvidia-driver-cuda", "docker-ce"],
        auto=["libcuda1", "zlib1g"],
    )
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "log").read_text().splitlines()
    assert log[-2:] == [
        "apt-mark hold nvidia-driver-cuda nvidia-kernel-dkms",
        "apt-mark auto libcuda1",
    ]
