"""gpubox.infra.runfile: what NVIDIA's .run installer left on a box, judged against runfile_driver;
and the sandbox's stand-in of such an install (gpubox.sandbox.runfile_standin).

The fact's output is taken three ways: recorded real outputs of its parts
(tests/fixtures/runfile: dpkg-query -S, installer logs, a package's file list), and the real
command run on a tree the stand-in planted (``command_for(root)``: the same command with every
path under ``root``; dpkg-query there owns none of them)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpubox.config import load_host_config, validate
from gpubox.infra import runfile
from gpubox.infra.runfile import parse_runfile_state, problems
from gpubox.sandbox import runfile_standin

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runfile"


def fixture(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def config(mode: str = "refuse"):
    return load_host_config("box", {"runfile_driver": mode})


def run_fact(root: Path) -> list[str]:
    """The fact's real command on ``root``, its paths given back as the box sees them."""
    done = subprocess.run(
        ["sh", "-c", runfile.command_for(str(root))], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr  # every fact command exits 0
    return done.stdout.replace(str(root), "").splitlines()


def planted(tmp_path: Path, **args) -> tuple[Path, list[str]]:
    root = tmp_path / "root"
    for d in ("usr/bin", "usr/lib/x86_64-linux-gnu", "usr/src", "var/lib", "var/log"):
        (root / d).mkdir(parents=True)
    return root, runfile_standin.plant(root, **args)


def tree(root: Path) -> set[str]:
    return {"/" + str(p.relative_to(root)) for p in root.rglob("*")}


# A converged box: the packaged driver's files, every one owned.


def converged_ubuntu_output() -> list[str]:
    """The fact's output on Ubuntu with NVIDIA's libnvidia-compute-580 installed: its
    regular versioned libraries (the recorded file list; the links are not candidates) as F
    lines, and dpkg-query -S's answer for them in its recorded format ("pkg:arch: path").
    Composed from the recordings, not captured from such a box; the DKMS tree's owner
    (nvidia-dkms-580) is assumed."""
    libs = [
        p
        for p in fixture("filelist_libnvidia-compute-580-server_580.82.07_questing_amd64.txt")
        if runfile._VERSION_IN_NAME.search(p)
    ]
    return (
        [f"F {p}" for p in libs]
        + ["S /usr/src/nvidia-580.82.07", "K 580.82.07"]
        + [f"O libnvidia-compute-580-server:amd64: {p}" for p in libs]
        + ["O nvidia-dkms-580-server: /usr/src/nvidia-580.82.07"]
    )


def test_a_converged_ubuntu_box_has_no_runfile_driver():
    lines = converged_ubuntu_output()
    assert len([line for line in lines if line.startswith("F ")]) == 8
    state = parse_runfile_state(lines)
    assert not state.present and state.unowned_files == [] and state.unowned_dkms == []
    assert problems(config(), state) == []


def test_the_same_files_unowned_are_a_runfile_install():
    lines = [line for line in converged_ubuntu_output() if not line.startswith("O ")]
    state = parse_runfile_state(lines)
    assert state.present and state.version == "580.82.07"
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07" in state.unowned_files
    assert state.unowned_dkms == ["/usr/src/nvidia-580.82.07"]


def test_a_converged_debian_box_prints_nothing(tmp_path):
    # Debian's libcuda1/libnvidia-ml1 ship under .../nvidia/current/ and reach the libdir
    # through alternatives links (packages.debian.org file lists): no candidate at all.
    root = tmp_path / "root"
    lib = root / "usr/lib/x86_64-linux-gnu"
    (lib / "nvidia/current").mkdir(parents=True)
    (lib / "nvidia/current/libcuda.so.570.211.01").write_text("")
    (lib / "libcuda.so.1").symlink_to("/etc/alternatives/nvidia--libcuda.so.1")
    (root / "usr/src/nvidia-current-570.211.01").mkdir(parents=True)  # nvidia-kernel-dkms
    assert run_fact(root) == []
    assert not parse_runfile_state([]).present


def test_dpkg_query_owners_are_read_in_its_recorded_format_and_through_usrmerge():
    # Recorded: dpkg-query -S on Debian 12 answers the /lib name of a file asked as /usr/lib
    # (zlib1g ships /lib/x86_64-linux-gnu/libz.so.1), and one line for several owners.
    owners = [f"O {line}" for line in fixture("dpkg-query-S_debian12_local.txt")]
    lines = [
        "F /usr/lib/x86_64-linux-gnu/libz.so.1",
        "F /usr/bin/dpkg",
        "S /usr/src",
        "F /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
        *owners,
    ]
    state = parse_runfile_state(lines)
    assert state.unowned_files == ["/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"]
    assert state.unowned_dkms == []
    # without the alias, the zlib library would read as unowned
    assert "/usr/lib/x86_64-linux-gnu/libz.so.1" not in {line.partition(": ")[2] for line in owners}


@pytest.mark.parametrize(
    "name, version",
    [
        ("nvidia-installer-log_550.90.05_proxmox-vgpu-issue21_excerpt.txt", "550.90.05"),
        ("nvidia-installer-log_384.111_microsoft-pai-issue2040_excerpt.txt", "384.111"),
    ],
)
def test_the_installer_logs_version_is_read_but_a_log_alone_is_no_driver(tmp_path, name, version):
    root = tmp_path / "root"
    (root / "var/log").mkdir(parents=True)
    (root / "var/log/nvidia-installer.log").write_text((FIXTURES / name).read_text())
    lines = run_fact(root)
    assert lines == [f"V {version}"]
    state = parse_runfile_state(lines)
    assert state.log_version == version
    assert not state.present  # an uninstall leaves the logs: the fix must not refuse again
    assert problems(config(), state) == []


# A runfile install, as the sandbox's stand-in plants it, read by the real command.


def test_a_planted_runfile_install_with_dkms_is_found(tmp_path):
    root, _ = planted(tmp_path)
    lines = run_fact(root)
    assert lines[:4] == [
        "U /usr/bin/nvidia-uninstall",
        "I /usr/bin/nvidia-installer",
        "B 1.0-5809505 (580.95.05)",
        "V 580.95.05",
    ]
    state = parse_runfile_state(lines)
    assert state.present and state.version == "580.95.05"
    assert state.uninstaller == "/usr/bin/nvidia-uninstall"
    assert state.backup_version == "580.95.05"
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05" in state.unowned_files
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05" in state.unowned_files
    assert "/usr/bin/nvidia-smi" in state.unowned_files
    assert not [f for f in state.unowned_files if f.endswith((".so.1", ".so"))]  # links skipped
    assert state.unowned_dkms == ["/usr/src/nvidia-580.95.05"]
    assert state.dkms_versions == ["580.95.05"]


def test_refused_in_one_line_naming_what_was_found_and_the_fix(tmp_path):
    root, _ = planted(tmp_path)
    (problem,) = problems(config(), parse_runfile_state(run_fact(root)))
    assert problem.severity == "error" and problem.key == "runfile_driver"
    text = str(problem)
    assert "\n" not in text
    assert text.startswith("box: runfile_driver: a driver 580.95.05 installed by NVIDIA's .run")
    assert "/usr/bin/nvidia-uninstall" in text
    assert "libcuda.so.580.95.05 and 5 more" in text
    assert "the module source /usr/src/nvidia-580.95.05 registered with DKMS" in text
    assert "'sudo nvidia-uninstall' then reboot" in text
    assert 'set "runfile_driver": "uninstall"' in text


def test_with_uninstall_it_is_a_warning_saying_what_the_deploy_runs(tmp_path):
    root, _ = planted(tmp_path)
    (problem,) = problems(config("uninstall"), parse_runfile_state(run_fact(root)))
    assert problem.severity == "warning"
    assert "first runs '/usr/bin/nvidia-uninstall --silent'" in str(problem)


def test_a_dkms_less_runfile_module_is_found(tmp_path):
    root, _ = planted(tmp_path, kernel="6.8.0-88-generic")
    state = parse_runfile_state(run_fact(root))
    module = "/lib/modules/6.8.0-88-generic/kernel/drivers/video/nvidia.ko"
    assert module in state.unowned_files
    assert state.dkms_versions == []
    assert f"kernel modules no package owns ({module} and 3 more)" in state.evidence()
    assert "registered with DKMS" not in state.evidence()


def test_a_runfile_installed_over_packaged_files_is_still_found():
    # The runfile backs up the packages' files and writes its own at the same paths: dpkg
    # still owns every path, but the installer, its link and its record are there.
    lines = [
        "U /usr/bin/nvidia-uninstall",
        "I /usr/bin/nvidia-installer",
        "B 1.0-5809505 (580.95.05)",
        "F /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
        "O libnvidia-compute-580:amd64: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
    ]
    state = parse_runfile_state(lines)
    assert state.present and state.unowned_files == [] and state.version == "580.95.05"
    assert problems(config(), state)[0].severity == "error"


def test_leftovers_without_an_uninstaller_cannot_be_uninstalled():
    state = parse_runfile_state(["F /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.590.48.01"])
    assert state.present and state.version == "590.48.01" and state.uninstaller is None
    (problem,) = problems(config("uninstall"), state)
    assert problem.severity == "error"
    assert "/usr/bin/nvidia-uninstall is gone" in problem.message
    assert "libnvidia-ml.so.590.48.01" in problem.message


def test_a_backup_log_of_another_format_is_not_a_version():
    assert parse_runfile_state(["B something else"]).backup_version is None


# The key.


def test_runfile_driver_defaults_to_refuse_and_takes_uninstall():
    assert config().runfile_driver == "refuse"
    assert config("uninstall").runfile_driver == "uninstall"
    _, found = validate("box", {"runfile_driver": "remove"})
    assert [p.message for p in found if p.key == "runfile_driver"] == [
        "must be one of 'refuse', 'uninstall', got 'remove'"
    ]


# The uninstall operation's command judges the uninstaller by what it leaves.


def run_uninstall_command(tmp_path: Path, uninstaller: str) -> subprocess.CompletedProcess:
    root = tmp_path / "box"
    (root / "var/lib/nvidia").mkdir(parents=True)
    (root / "var/lib/nvidia/log").write_text("1.0-5809505 (580.95.05)\n")
    fake = tmp_path / "nvidia-uninstall"
    fake.write_text(uninstaller)
    fake.chmod(0o755)
    command = runfile.UNINSTALL_COMMAND.replace(runfile.UNINSTALLER, str(fake)).replace(
        runfile.BACKUP_LOG, str(root / "var/lib/nvidia/log")
    )
    env = {**os.environ, "BOX": str(root)}
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)


def test_the_uninstall_operation_fails_when_the_backup_log_stays(tmp_path):
    # nvidia-uninstall exits 0 even when its uninstall failed (backup.c)
    done = run_uninstall_command(tmp_path, "#!/bin/sh\nexit 0\n")
    assert done.returncode == 1
    assert "see /var/log/nvidia-uninstall.log" in done.stderr


def test_the_uninstall_operation_passes_when_the_backup_log_is_gone(tmp_path):
    done = run_uninstall_command(tmp_path, '#!/bin/sh\nrm -r "$BOX/var/lib/nvidia"\n')
    assert done.returncode == 0, done.stderr


# The sandbox's stand-in.


def test_plant_writes_what_the_parser_expects_at_the_real_paths(tmp_path):
    root, written = planted(tmp_path)
    state = parse_runfile_state(run_fact(root))
    regular = {p for p in written if not (root / p.lstrip("/")).is_symlink()}
    # every planted regular file in the fact's candidate places is found unowned
    candidates = {p for p in regular if p.startswith(("/usr/lib/", "/usr/bin/nvidia-smi"))}
    assert candidates == set(state.unowned_files)
    assert {
        "/usr/bin/nvidia-installer",
        "/usr/bin/nvidia-uninstall",
        "/var/lib/nvidia/log",
        "/var/log/nvidia-installer.log",
        "/usr/src/nvidia-580.95.05/dkms.conf",
    } <= set(written)
    assert os.readlink(root / "usr/bin/nvidia-uninstall") == "nvidia-installer"
    assert (root / "var/lib/nvidia/log").stat().st_mode & 0o777 == 0o600
    assert (root / "var/lib/nvidia").stat().st_mode & 0o777 == 0o700
    header = (root / "var/log/nvidia-installer.log").read_text().splitlines()
    assert header[0] == "nvidia-installer log file '/var/log/nvidia-installer.log'"
    assert header[2] == "installer version: 580.95.05"


def test_plant_never_overwrites_and_does_not_list_what_was_there(tmp_path):
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("packaged\n")
    written = runfile_standin.plant(root)
    assert "/usr/bin/nvidia-smi" not in written
    assert (root / "usr/bin/nvidia-smi").read_text() == "packaged\n"


@pytest.mark.parametrize("kernel", [None, "6.8.0-88-generic"])
def test_the_standin_uninstaller_removes_exactly_what_plant_wrote(tmp_path, kernel):
    root = tmp_path / "root"
    for d in ("usr/bin", "usr/lib/x86_64-linux-gnu", "usr/src", "var/lib", "var/log"):
        (root / d).mkdir(parents=True)
    if kernel:
        (root / f"lib/modules/{kernel}/kernel").mkdir(parents=True)
    before = tree(root)
    written = runfile_standin.plant(root, kernel=kernel)
    assert set(written) <= tree(root) - before
    done = subprocess.run(
        [str(root / "usr/bin/nvidia-uninstall"), "--silent"],
        env={**os.environ, "GPUBOX_STANDIN_ROOT": str(root)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout == "", done.stderr
    # as the real uninstaller: everything gone but the installer's log, plus its own log
    assert tree(root) - before == {"/var/log/nvidia-installer.log", "/var/log/nvidia-uninstall.log"}
    assert before <= tree(root)
    assert "is complete." in (root / "var/log/nvidia-uninstall.log").read_text()
    assert not parse_runfile_state(run_fact(root)).present
