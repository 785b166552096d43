"""gpubox's box metrics program (gpubox.knowledge.box_metrics, issue 31 C3), as the box runs it:
a reboot pending (the installed driver's package against the loaded module), the model
download's bytes, the model volume's mount point; whole runs (``main``) against a fake /sys,
/proc and mount table in tmp directories and a dpkg-query stood in on PATH."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpubox.knowledge import box_metrics, metrics

# /proc/driver/nvidia/version as NVIDIA's kernel modules print it: the proprietary module's
# line and the open module's ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64 ...").
# Their shape as the modules' nv.c prints it; dates and builders of our own, not a recording.
PROC_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.211.01  Tue Nov 25 10:00:00 UTC 2025\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)
PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.105.08  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Nov 25 10:00:00 UTC 2025\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n"
)

# dpkg-query -W -f '${db:Status-Abbrev} ${Version}\n' PACKAGE, stood in: the answers dpkg
# gives for an installed package, one removed with its configuration files kept, and one it
# does not know (exit status 1, its message on standard error).
DPKG_QUERY = """#!/bin/sh
pkg=$(eval echo \\${$#})
case "$pkg" in
  nvidia-dkms-570) echo "ii  570.211.01-0ubuntu1" ;;
  nvidia-kernel-dkms) echo "hi  1:580.105.08-1" ;;
  nvidia-kernel-open-dkms) echo "rc  580.105.08-1" ;;
  *) echo "dpkg-query: no packages found matching $pkg" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def dpkg(tmp_path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dpkg-query").write_text(DPKG_QUERY)
    (bin_dir / "dpkg-query").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def every_sample() -> list[box_metrics.Sample]:
    return [
        ("gpubox_model_volume_info", {"mountpoint": "/srv/my models"}, 1.0),
        ("gpubox_reboot_pending", {}, 1.0),
        ("gpubox_reboot_pending_since_timestamp_seconds", {}, 1764838800.25),
        ("gpubox_model_download_bytes", {"model": 'a"b.gguf'}, 1234.0),
        ("gpubox_model_download_size_bytes", {"model": 'a"b.gguf'}, 0.0),
    ]


def test_the_programs_names_help_and_text_are_metrics_py_s():
    """The program imports nothing of gpubox: its table and text must equal metrics.py's."""
    assert [(n, t, h) for n, t, h in box_metrics.METRICS] == [
        (m.name, m.type, m.help) for m in metrics.of_writer(metrics.BOX)
    ]
    samples = every_sample()
    assert box_metrics.render(samples) == metrics.exposition(samples, writer=metrics.BOX)


def test_the_upstream_version_drops_the_epoch_and_the_revision():
    assert box_metrics.upstream("570.211.01-0ubuntu1") == "570.211.01"
    assert box_metrics.upstream("1:580.105.08-1") == "580.105.08"
    assert box_metrics.upstream("535.261.03") == "535.261.03"


def driver_files(tmp_path: Path, sys_text: str | None, proc_text: str | None) -> dict[str, str]:
    paths = {"sys_module_version": tmp_path / "sys-version", "proc_driver_version": tmp_path / "p"}
    for key, text in (("sys_module_version", sys_text), ("proc_driver_version", proc_text)):
        if text is not None:
            paths[key].write_text(text)
    return {k: str(v) for k, v in paths.items()}


def test_the_loaded_driver_from_sys_else_proc(tmp_path):
    loaded = box_metrics.loaded_driver
    for name in "abcd":
        (tmp_path / name).mkdir()
    assert loaded(driver_files(tmp_path / "a", "570.211.01\n", PROC_OPEN)) == "570.211.01"
    assert loaded(driver_files(tmp_path / "b", None, PROC_PROPRIETARY)) == "570.211.01"
    assert loaded(driver_files(tmp_path / "c", None, PROC_OPEN)) == "580.105.08"
    assert loaded(driver_files(tmp_path / "d", None, None)) is None  # no module loaded


def test_the_installed_driver_from_dpkg(dpkg):
    assert box_metrics.installed_driver("nvidia-dkms-570") == "570.211.01"
    assert box_metrics.installed_driver("nvidia-kernel-dkms") == "580.105.08"  # held: installed
    assert box_metrics.installed_driver("nvidia-kernel-open-dkms") is None  # removed
    assert box_metrics.installed_driver("nvidia-dkms-999") is None  # unknown to dpkg
    assert box_metrics.installed_driver(None) is None


def test_a_reboot_is_pending_since_the_first_run_that_saw_it():
    pending, since, state = box_metrics.reboot({}, "580.105.08", "570.211.01", 1000.0)
    assert (pending, since) == (True, 1000.0)
    pending, since, state = box_metrics.reboot(state, "580.105.08", "570.211.01", 1060.0)
    assert (pending, since) == (True, 1000.0)  # kept
    pending, since, state = box_metrics.reboot(state, "580.105.08", None, 1120.0)
    assert (pending, since) == (True, 1000.0)  # installed, nothing loaded: still pending
    pending, since, state = box_metrics.reboot(state, "580.105.08", "580.105.08", 2000.0)
    assert (pending, since, state["pending_since"]) == (False, None, None)  # rebooted
    assert box_metrics.reboot(state, None, None, 3000.0)[:2] == (False, None)  # no driver


def test_the_model_volume_is_the_longest_mount_point_above_model_dir(tmp_path):
    vol = tmp_path / "my vol"
    (vol / "models").mkdir(parents=True)
    (tmp_path / "link").symlink_to(vol)
    escaped = str(vol).replace(" ", "\\040")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
        f"97 22 259:3 / {escaped} rw,relatime shared:50 - ext4 /dev/nvme1n1 rw\n"
        f"98 22 0:48 / {tmp_path}/other rw - tmpfs tmpfs rw\n"
    )
    where = lambda d: box_metrics.mountpoint(str(d), str(mountinfo))  # noqa: E731
    assert where(vol / "models") == str(vol)
    assert where(tmp_path / "link" / "models") == str(vol)  # symlinks resolved
    assert where(vol / "models" / "not" / "yet") == str(vol)  # its nearest existing parent
    assert where(tmp_path) == "/"
    # no mount table readable: the walk up to where st_dev changes ends at a mount point
    found = box_metrics.mountpoint(str(vol / "models"), str(tmp_path / "none"))
    assert os.path.ismount(found) and str(vol).startswith(found)


def test_the_download_counts_the_file_and_curls_part_and_the_staging_directory(tmp_path):
    model = {
        "kind": "file",
        "name": "m.gguf",
        "path": str(tmp_path / "m.gguf"),
        "marker": str(tmp_path / "m.gguf.gpubox-verified"),
        "size": None,
    }
    by_name = lambda s: {n: v for n, _, v in s}  # noqa: E731
    assert by_name(box_metrics.model_samples(model)) == {
        "gpubox_model_download_bytes": 0.0,
        "gpubox_model_download_size_bytes": 0.0,
    }
    (tmp_path / "m.gguf.part").write_bytes(b"x" * 300)  # hf and url: curl's partial file
    staging = tmp_path / "m.gguf.incomplete" / ".cache"  # modelscope's staging directory
    staging.mkdir(parents=True)
    (staging / "m.gguf.incomplete").write_bytes(b"x" * 200)
    assert by_name(box_metrics.model_samples({**model, "size": 1000})) == {
        "gpubox_model_download_bytes": 500.0,
        "gpubox_model_download_size_bytes": 1000.0,
    }
    (tmp_path / "m.gguf.part").rename(tmp_path / "m.gguf")
    (staging / "m.gguf.incomplete").unlink()
    (tmp_path / "m.gguf.gpubox-verified").write_text("size=None size=300 mtime=1\n")
    # verified, no size known before: the file's size is the whole
    assert by_name(box_metrics.model_samples(model)) == {
        "gpubox_model_download_bytes": 300.0,
        "gpubox_model_download_size_bytes": 300.0,
    }


def test_the_checkpoints_download_is_its_directory_and_its_size_its_markers(tmp_path):
    directory = tmp_path / "org--name"
    (directory / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (directory / "config.json").write_bytes(b"{}")
    (directory / ".cache" / "huggingface" / "download" / "a.incomplete").write_bytes(b"x" * 98)
    model = {
        "kind": "directory",
        "name": "org/name",
        "path": str(directory),
        "marker": str(tmp_path / "org--name.gpubox-complete"),
    }
    samples = box_metrics.model_samples(model)
    assert samples == [
        ("gpubox_model_download_bytes", {"model": "org/name"}, 100.0),
        ("gpubox_model_download_size_bytes", {"model": "org/name"}, 0.0),
    ]
    Path(model["marker"]).write_text(
        "repo org/name\ncommit abc\nfile 2 config.json\nfile 400 model.safetensors\n"
    )
    assert box_metrics.model_samples(model)[1][2] == 402.0


def one_run(tmp_path: Path, **extra: Any) -> tuple[Path, dict[str, Any]]:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    (tmp_path / "mountinfo").write_text(
        f"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 8:2 / {models} rw - xfs /dev/sdb rw\n"
    )
    settings = {
        "textfile": str(tmp_path / "textfile" / "gpubox-box.prom"),
        "state_file": str(tmp_path / "state" / "box-metrics.json"),
        "driver_package": "nvidia-kernel-dkms",
        "model_dir": str(models),
        "model": {
            "kind": "file",
            "name": "tiny.gguf",
            "path": str(models / "tiny.gguf"),
            "marker": str(models / "tiny.gguf.gpubox-verified"),
            "size": 4096,
        },
        "mountinfo": str(tmp_path / "mountinfo"),
        **driver_files(tmp_path, "570.211.01\n", None),
        **extra,
    }
    config = tmp_path / "box-metrics.json"
    config.write_text(json.dumps(settings))
    return config, settings


def test_a_whole_run_writes_the_file_whole_and_keeps_the_since_time(tmp_path, dpkg, monkeypatch):
    config, settings = one_run(tmp_path)
    (tmp_path / "models" / "tiny.gguf.part").write_bytes(b"x" * 1024)
    monkeypatch.setattr(box_metrics.time, "time", lambda: 1764838800.0)
    assert box_metrics.main(["box-metrics", str(config)]) == 0
    monkeypatch.setattr(box_metrics.time, "time", lambda: 1764838860.0)
    assert box_metrics.main(["box-metrics", str(config)]) == 0
    textfile = Path(settings["textfile"])
    models = str(tmp_path / "models")
    assert textfile.read_text() == metrics.exposition(
        [
            ("gpubox_reboot_pending", {}, 1),  # 580.105.08 installed, 570.211.01 loaded
            ("gpubox_reboot_pending_since_timestamp_seconds", {}, 1764838800),
            ("gpubox_model_download_bytes", {"model": "tiny.gguf"}, 1024),
            ("gpubox_model_download_size_bytes", {"model": "tiny.gguf"}, 4096),
            ("gpubox_model_volume_info", {"mountpoint": models}, 1),
        ],
        writer=metrics.BOX,
    )
    assert oct(textfile.stat().st_mode & 0o777) == "0o644"
    assert os.listdir(textfile.parent) == ["gpubox-box.prom"]
    # the reboot: the loaded module is the installed one now
    Path(settings["sys_module_version"]).write_text("580.105.08\n")
    assert box_metrics.main(["box-metrics", str(config)]) == 0
    values = metrics.read_values(textfile.read_text())
    assert values["gpubox_reboot_pending"] == 0
    assert values["gpubox_reboot_pending_since_timestamp_seconds"] == 0


def test_no_backend_no_model_and_no_driver_package(tmp_path, dpkg):
    config, settings = one_run(tmp_path, model=None, driver_package=None)
    assert box_metrics.main(["box-metrics", str(config)]) == 0
    text = Path(settings["textfile"]).read_text()
    assert "gpubox_model_download" not in text and "gpubox_reboot_pending 0\n" in text
    assert f'gpubox_model_volume_info{{mountpoint="{tmp_path / "models"}"}} 1\n' in text


def test_on_this_machine_dpkg_query_and_the_mount_table_read_as_the_real_tools_say(tmp_path):
    """The real dpkg-query and /proc/self/mountinfo of the test machine (Debian): dpkg's own
    package, and the mount point findmnt (util-linux) names for a directory."""
    import subprocess

    version = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "dpkg"], capture_output=True, text=True
    ).stdout
    assert box_metrics.installed_driver("dpkg") == box_metrics.upstream(version)
    assert box_metrics.installed_driver("gpubox-no-such-package") is None
    for directory in (str(tmp_path), "/proc/self", "/"):
        target = subprocess.run(
            ["findmnt", "-n", "-o", "TARGET", "--target", directory],
            capture_output=True,
            text=True,
        ).stdout.strip()
        assert box_metrics.mountpoint(directory, "/proc/self/mountinfo") == target, directory
