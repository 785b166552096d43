"""gpubox outdated: each pin's line (gpubox.knowledge.apt_versions, gpubox.rules.outdated) and the
command end to end, the repositories answered by the deploy's own query (gpubox.rules.offers)
run with this machine's real apt against file: repositories made here, as test_offers.py does.

The versions offered are real releases: NVIDIA's driver builds 570.195.03, 570.211.01,
580.105.08 and 580.126.09 (the resolver tier's NVIDIA models carry the same), CUDA 12.8.0 and
12.8.1, the container toolkit 1.17.7, 1.17.8 and 1.18.0, DCGM 4.2.3 and 4.4.1, Docker 28.5.1,
28.5.2 and 29.0.0, containerd.io 1.7.28-2 and 2.1.5-1, each in its repository's version
scheme (Debian 12's: "-1", Docker's "~debian.12~bookworm")."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpubox import cli
from gpubox.base import layout
from gpubox.checks.core import Output, Unreachable
from gpubox.commands import outdated as command
from gpubox.config import load_host_config
from gpubox.knowledge import apt_versions
from gpubox.remote import reach
from gpubox.rules import outdated
from gpubox.rules.offers import RepoIndex

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OS_RELEASE = (FIXTURES / "os" / "os-release_debian12_local.txt").read_text()
TODAY = datetime.date(2026, 12, 4)
BOOKWORM = "~debian.12~bookworm"
STANZA = "Package: {name}\nVersion: {version}\nArchitecture: amd64\nFilename: pool/{name}.deb\n"

DRIVER = ["570.195.03-1", "570.211.01-1", "580.105.08-1", "580.126.09-1"]
CUDA_REPO = [
    *((name, v) for name in ("nvidia-driver-cuda", "nvidia-kernel-dkms") for v in DRIVER),
    ("cuda-toolkit-12-8", "12.8.0-1"),
    ("cuda-toolkit-12-8", "12.8.1-1"),
    ("cuda-toolkit-12-9", "12.9.1-1"),
    *(
        (f"datacenter-gpu-manager-4-{part}", v)
        for part in ("core", "cuda12", "proprietary", "proprietary-cuda12")
        for v in ("1:4.2.3-1", "1:4.4.1-1")
    ),
]
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
TOOLKIT_REPO = [(n, v) for n in TOOLKIT_PACKAGES for v in ("1.17.7-1", "1.17.8-1", "1.18.0-1")]
DOCKER_REPO = [
    *(
        (n, f"5:{v}-1{BOOKWORM}")
        for n in ("docker-ce", "docker-ce-cli")
        for v in ("28.5.1", "28.5.2", "29.0.0")
    ),
    ("containerd.io", f"1.7.28-2{BOOKWORM}"),
    ("containerd.io", f"2.1.5-1{BOOKWORM}"),
    ("docker-buildx-plugin", f"0.29.1-1{BOOKWORM}"),
    ("docker-compose-plugin", f"2.40.3-1{BOOKWORM}"),
]
# What dpkg has installed on a converged Debian 12 box at the catalog's pins.
CONVERGED = {
    "nvidia-driver-cuda": "570.211.01-1",
    "nvidia-kernel-dkms": "570.211.01-1",
    "cuda-toolkit-12-8": "12.8.1-1",
    **{f"datacenter-gpu-manager-4-{p}": "1:4.4.1-1" for p in ("core", "cuda12")},
    **{f"datacenter-gpu-manager-4-{p}": "1:4.4.1-1" for p in ("proprietary", "proprietary-cuda12")},
    **dict.fromkeys(TOOLKIT_PACKAGES, "1.17.8-1"),
    "docker-ce": f"5:28.5.1-1{BOOKWORM}",
    "docker-ce-cli": f"5:28.5.1-1{BOOKWORM}",
    "containerd.io": f"1.7.28-2{BOOKWORM}",
    "docker-buildx-plugin": f"0.29.1-1{BOOKWORM}",
    "docker-compose-plugin": f"2.40.3-1{BOOKWORM}",
    "bash": "5.2.15-2+b8",
}


# --------------------------------------------------------------------------- the lines


@pytest.mark.parametrize(
    "version, parts, line",
    [
        ("570.211.01-1", 1, (0, (570,))),
        ("570.211.01-0ubuntu1", 1, (0, (570,))),
        ("580.126.09-1ubuntu1", 1, (0, (580,))),
        ("12.8.1-1", 2, (0, (12, 8))),
        ("1:4.4.1-1", 1, (1, (4,))),
        (f"5:28.5.1-1{BOOKWORM}", 1, (5, (28,))),
        ("1.17.8-1", 2, (0, (1, 17))),
        ("1.17.8-1", 4, None),
    ],
)
def test_a_versions_line_is_its_epoch_and_leading_numbers(version, parts, line):
    assert apt_versions.line(version, parts) == line


def test_the_newest_of_a_line_skips_other_branches_releases_and_epochs():
    assert apt_versions.newest_in_line(DRIVER, "570.211.01-1", 1) == "570.211.01-1"
    assert apt_versions.newest_in_line(DRIVER, "580.105.08-1", 1) == "580.126.09-1"
    assert apt_versions.newest_in_line(DRIVER, "575.57.08-1", 1) is None
    toolkit = ["1.17.7-1", "1.17.8-1", "1.18.0-1"]
    assert apt_versions.newest_in_line(toolkit, "1.17.8-1", 2) == "1.17.8-1"
    assert apt_versions.newest_in_line(toolkit, "1.17.8-1", 1) == "1.18.0-1"
    # another epoch is another line, whatever its numbers (DCGM 3 had no epoch)
    assert apt_versions.newest_in_line(["3.3.9-1", "1:4.2.3-1"], "1:4.4.1-1", 1) == "1:4.2.3-1"
    # NVIDIA's revision scheme changed at 580.126.09 ("-1ubuntu1" after "-0ubuntu1"): dpkg's order
    ubuntu = ["580.105.08-0ubuntu1", "580.126.09-1ubuntu1", "570.211.01-0ubuntu1"]
    assert apt_versions.newest_in_line(ubuntu, "580.105.08-0ubuntu1", 1) == "580.126.09-1ubuntu1"
    # a pattern pin is its own line (NCCL's builds for one CUDA release)
    nccl = ["2.26.2-1+cuda12.8", "2.27.3-1+cuda12.9", "2.25.1-1+cuda12.8"]
    assert apt_versions.newest_in_line(nccl, "*+cuda12.8", 0) == "2.26.2-1+cuda12.8"


# --------------------------------------------------------------------------- one row


def config_of(**data: Any):
    return load_host_config("box", {"llamacpp_cuda": False, **data})


def component(name: str, config=None):
    config = config or config_of(docker_source="docker")
    from gpubox.config import target_for
    from gpubox.parsers import parse_os_release

    target = target_for(parse_os_release(OS_RELEASE), config.catalog)
    return next(c for c in outdated.components(config, target) if c.name == name)


def judge(name: str, offers: dict[str, list[str]], installed: dict[str, str], **kw: Any):
    c = component(name)
    return outdated.judge("box", config_of(), c, RepoIndex(offers=offers, **kw), installed, TODAY)


def test_behind_is_against_the_installed_version_or_the_pin_when_none_is():
    offers = {"cuda-toolkit-12-8": ["12.8.0-1", "12.8.1-1"]}
    row = judge("cuda", offers, {"cuda-toolkit-12-8": "12.8.0-1"})
    assert (row.status, row.installed, row.newest, row.line) == (
        "behind", "12.8.0-1", "12.8.1-1", "12.8.x",
    )  # fmt: skip
    assert row.stale
    row = judge("cuda", offers, {})
    assert (row.status, row.installed, row.newest) == ("current", None, "12.8.1-1")
    assert row.detail == "not installed" and not row.stale
    row = judge("cuda", {"cuda-toolkit-12-8": ["12.8.0-1", "12.8.1-1", "12.8.2-1"]}, {})
    assert row.status == "behind"  # the pin itself is behind


def test_a_set_counts_only_the_versions_every_package_is_offered_at():
    half = {f"datacenter-gpu-manager-4-{p}": ["1:4.4.1-1", "1:4.5.0-1"] for p in ("core", "cuda12")}
    half.update(
        {
            f"datacenter-gpu-manager-4-{p}": ["1:4.4.1-1"]
            for p in ("proprietary", "proprietary-cuda12")
        }
    )
    installed = {n: "1:4.4.1-1" for n in half}
    row = judge("dcgm", half, installed)
    assert (row.status, row.newest, row.package) == (
        "current", "1:4.4.1-1", "datacenter-gpu-manager-4-core",
    )  # fmt: skip
    installed["datacenter-gpu-manager-4-cuda12"] = "1:4.2.3-1"
    row = judge("dcgm", half, installed)
    assert (row.status, row.installed) == ("behind", "1:4.2.3-1")
    assert "installed at several versions" in row.detail and "cuda12 1:4.2.3-1" in row.detail


def test_a_line_no_longer_offered_and_an_unreadable_repository_are_stale():
    row = judge("driver", {"nvidia-driver-cuda": DRIVER[2:], "nvidia-kernel-dkms": DRIVER[2:]}, {})
    assert (row.status, row.newest, row.line) == ("not offered", None, "570.x") and row.stale
    assert row.detail.startswith("repos.nvidia_cuda offers nothing of 570.x")
    row = judge("driver", {}, CONVERGED, error="Err:1 file:/x  File not found")
    assert row.status == "unknown" and row.stale and row.installed == "570.211.01-1"
    assert row.detail == "cannot read repos.nvidia_cuda: Err:1 file:/x  File not found"
    cached = judge(
        "driver",
        {"nvidia-driver-cuda": DRIVER, "nvidia-kernel-dkms": DRIVER},
        CONVERGED,
        warnings=["apt update failed, using the answer cached by an earlier run: Err:1"],
    )
    assert cached.status == "current" and "cached by an earlier run" in cached.detail


def test_the_ubuntu_firmware_root_named_after_its_version_is_not_compared():
    config = config_of()
    from gpubox.config import Target

    target = Target("ubuntu", "24.04", "ubuntu2404", "ubuntu")
    (driver, *_) = outdated.components(config, target)
    assert "nvidia-firmware-570-570.211.01" in driver.packages
    assert "nvidia-firmware-570-570.211.01" not in driver.compared
    assert driver.compared[0] == "libnvidia-compute-570" and len(driver.compared) == 7


def test_the_images_are_not_asked_and_say_why():
    config = config_of(dcgm_exporter=True, docker_source="distro")
    from gpubox.config import target_for
    from gpubox.parsers import parse_os_release

    target = target_for(parse_os_release(OS_RELEASE), config.catalog)
    found = outdated.components(config, target)
    assert [c.name for c in found] == [
        "driver",
        "cuda",
        "dcgm",
        "container_toolkit",
        "dcgm_exporter",
    ]
    row = outdated.judge("box", config, found[-1], None, {}, TODAY)
    assert (row.status, row.pinned, row.newest, row.stale) == (
        "not asked", config.catalog["dcgm"]["exporter_image"], None, False,
    )  # fmt: skip
    assert "no registry client" in row.detail
    vllm = outdated.components(config_of(backend="vllm", docker_source="distro"), target)
    assert vllm[-1].name == "vllm" and vllm[-1].pinned == config.catalog["vllm"]["image"]
    monitor = config_of(
        monitoring="prometheus", grafana=True, dcgm_exporter=True, docker_source="distro"
    )
    grafana = outdated.components(monitor, target)[-1]
    assert (grafana.name, grafana.repo, grafana.pinned) == (
        "grafana", None, config.catalog["grafana"]["image"],
    )  # fmt: skip


# --------------------------------------------------------------------------- end to end


def flat_repo(root: Path, packages: list[tuple[str, str]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "Packages").write_text("\n".join(STANZA.format(name=n, version=v) for n, v in packages))
    release = subprocess.run(
        ["apt-ftparchive", "release", "."], cwd=root, capture_output=True, text=True, check=True
    )
    (root / "Release").write_text(release.stdout)
    return root


def dpkg_query(installed: dict[str, str]) -> str:
    """dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n' (its format as
    tests/fixtures/apt/dpkg-query_debian12_local.txt holds it), plus a removed package."""
    return "".join(f"{n}\t{v}\tii \n" for n, v in installed.items()) + "logrotate\t3.21.0-1\trc \n"


class Box:
    """A Debian 12 box: os-release and dpkg-query answered from their real formats, every other
    command (the deploy's repository query) run here by bash, its private apt root moved from
    /var/cache/gpubox/apt-query into the test's directory."""

    def __init__(self, tmp: Path, installed: dict[str, str]) -> None:
        self.tmp = tmp
        self.installed = installed
        self.commands: list[str] = []

    def __call__(self, command: str) -> Output:
        self.commands.append(command)
        if command.startswith("cat /etc/os-release"):
            return Output(0, OS_RELEASE, "", command)
        if command.startswith("dpkg-query -W"):
            return Output(0, dpkg_query(self.installed), "", command)
        assert command.startswith("# gpubox-apt-query "), command
        local = command.replace(layout.APT_QUERY_DIR, str(self.tmp / "apt-query"))
        done = subprocess.run(["bash", "-c", local], capture_output=True, text=True, timeout=120)
        return Output(done.returncode, done.stdout, done.stderr, command)

    # testinfra's host, for main()
    def run(self, command: str) -> Any:
        out = self(command)
        return type("Result", (), {"rc": out.rc, "stdout": out.stdout, "stderr": out.stderr})


@pytest.fixture
def repos(tmp_path: Path) -> dict[str, Any]:
    """catalog_overrides pointing the host's three repositories at file: repositories."""
    cuda = flat_repo(tmp_path / "cuda", CUDA_REPO)
    toolkit = flat_repo(tmp_path / "toolkit", TOOLKIT_REPO)
    docker = flat_repo(tmp_path / "docker", DOCKER_REPO)
    return {
        "docker_source": "docker",
        "catalog_overrides": {
            "repos.nvidia_cuda.url": f"file:{cuda}/",
            "repos.nvidia_container_toolkit.url": f"file:{toolkit}/",
            "repos.docker.url": f"file:{docker}/",
            "repos.docker.suite": "/",
            "repos.docker.component": "",
        },
    }


def table(rows: list[outdated.Row]) -> dict[str, tuple[Any, ...]]:
    return {f"{r.component} {r.package}": (r.installed, r.newest, r.status) for r in rows}


def test_a_converged_box_at_570_with_docker_behind_in_its_line(tmp_path: Path, repos):
    box = Box(tmp_path, CONVERGED)
    rows = command.read_host("box", config_of(**repos), box, TODAY)
    assert table(rows) == {
        "driver nvidia-driver-cuda": ("570.211.01-1", "570.211.01-1", "current"),
        "cuda cuda-toolkit-12-8": ("12.8.1-1", "12.8.1-1", "current"),
        "dcgm datacenter-gpu-manager-4-core": ("1:4.4.1-1", "1:4.4.1-1", "current"),
        "container_toolkit nvidia-container-toolkit": ("1.17.8-1", "1.17.8-1", "current"),
        "docker docker-ce": (f"5:28.5.1-1{BOOKWORM}", f"5:28.5.2-1{BOOKWORM}", "behind"),
        "docker docker-ce-cli": (f"5:28.5.1-1{BOOKWORM}", f"5:28.5.2-1{BOOKWORM}", "behind"),
        "docker containerd.io": (f"1.7.28-2{BOOKWORM}", f"1.7.28-2{BOOKWORM}", "current"),
        "docker docker-buildx-plugin": (f"0.29.1-1{BOOKWORM}", f"0.29.1-1{BOOKWORM}", "current"),
        "docker docker-compose-plugin": (f"2.40.3-1{BOOKWORM}", f"2.40.3-1{BOOKWORM}", "current"),
    }
    # the driver's row carries the lifecycle note (R570: past its end of life, move to R580
    # for Volta), the same words as gpubox check's; no other row has one
    notes = {r.component: r.note for r in rows}
    driver = notes.pop("driver")
    assert "R570 is past its end of life" in driver and '"driver_branch": "580"' in driver, driver
    assert set(notes.values()) == {""}
    assert command.exit_code(rows) == reach.DEVIATES
    # read-only: os-release, dpkg-query and one query per repository, nothing else
    assert [c.split("\n")[0] for c in box.commands] == [
        "cat /etc/os-release 2>/dev/null || true",
        "dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'",
        "# gpubox-apt-query nvidia_cuda",
        "# gpubox-apt-query nvidia_container_toolkit",
        "# gpubox-apt-query docker",
    ]
    assert all("/etc/apt" not in c and "/var/lib/gpubox" not in c for c in box.commands)


def test_a_box_at_an_older_570_build_is_behind_within_its_branch_only(tmp_path: Path, repos):
    older = {
        **CONVERGED,
        "nvidia-driver-cuda": "570.195.03-1",
        "nvidia-kernel-dkms": "570.195.03-1",
    }
    config = config_of(**{**repos, "docker_source": "distro"})
    rows = command.read_host("box", config, Box(tmp_path, older), TODAY)
    assert [r.component for r in rows] == ["driver", "cuda", "dcgm", "container_toolkit"]
    assert table(rows)["driver nvidia-driver-cuda"] == ("570.195.03-1", "570.211.01-1", "behind")
    assert command.exit_code(rows) == reach.DEVIATES
    # pinned to 580.105.08: 580.126.09 is the branch's newest
    rows = command.read_host(
        "box", config_of(**{**repos, "driver_branch": "580", "docker_source": "distro"}),
        Box(tmp_path, CONVERGED), TODAY,
    )  # fmt: skip
    assert table(rows)["driver nvidia-driver-cuda"] == ("570.211.01-1", "580.126.09-1", "behind")
    assert rows[0].line == "580.x" and rows[0].pinned == "580.105.08-1"
    # the same box with nothing behind exits 0
    rows = command.read_host(
        "box", config_of(**{**repos, "docker_source": "distro"}), Box(tmp_path, CONVERGED), TODAY
    )
    assert {r.status for r in rows} == {"current"} and command.exit_code(rows) == reach.OK


def test_an_unreachable_repository_is_unknown_and_a_lost_host_raises(tmp_path: Path, repos):
    repos["catalog_overrides"]["repos.nvidia_container_toolkit.url"] = f"file:{tmp_path}/none/"
    rows = command.read_host("box", config_of(**repos), Box(tmp_path, CONVERGED), TODAY)
    row = table(rows)["container_toolkit nvidia-container-toolkit"]
    assert row == ("1.17.8-1", None, "unknown")

    def refuse(command: str) -> Output:
        raise OSError("Connection refused")

    with pytest.raises(Unreachable, match="Connection refused"):
        command.read_host("box", config_of(), refuse, TODAY)


def test_an_unsupported_os_is_one_unknown_row():
    rocky = 'NAME="Rocky Linux"\nID="rocky"\nVERSION_ID="9.4"\nPRETTY_NAME="Rocky Linux 9.4"\n'

    def run(command: str) -> Output:
        return Output(0, rocky, "", command)

    [row] = command.read_host("box", config_of(), run, TODAY)
    assert (row.component, row.status) == ("host", "unknown")
    assert row.detail == "not a supported OS: Rocky Linux 9.4"


# --------------------------------------------------------------------------- the command


def inventory(tmp_path: Path, hosts: dict[str, dict[str, Any]], name: str = "inv.py") -> str:
    path = tmp_path / name
    rows = "".join(f"    ({name!r}, {data!r}),\n" for name, data in hosts.items())
    path.write_text(f"hosts = [\n{rows}]\n")
    return str(path)


@pytest.fixture
def boxes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """testinfra's hosts replaced by Boxes (by name); the probe by a table of the unreachable."""
    made: dict[str, Box] = {}
    unreachable: dict[str, str] = {}

    def get_host(spec: str, **kw: Any) -> Box:
        name = spec.removeprefix("paramiko://")
        return made[name]

    monkeypatch.setattr(command.testinfra, "get_host", get_host)
    monkeypatch.setattr(reach, "probe_all", lambda hosts: dict(unreachable))
    return made, unreachable


def test_the_command_end_to_end_text_json_and_exit_codes(tmp_path: Path, repos, boxes, capsys):
    made, unreachable = boxes
    made["a"] = Box(tmp_path, CONVERGED)
    made["b"] = Box(tmp_path, CONVERGED)
    path = inventory(
        tmp_path, {"a": {"llamacpp_cuda": False, **repos}, "b": {"llamacpp_cuda": False, **repos}}
    )
    assert cli.main(["outdated", path]) == reach.DEVIATES
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "HOST",
        "COMPONENT",
        "PACKAGE",
        "LINE",
        "INSTALLED",
        "NEWEST",
        "STATUS",
    ]
    assert out[1].split() == [
        "a", "driver", "nvidia-driver-cuda", "570.x", "570.211.01-1", "570.211.01-1", "current",
    ]  # fmt: skip
    assert [line.split()[-1] for line in out[1:19]].count("behind") == 4
    assert out[-1] == "2 host(s): 4 pin(s) behind, no longer offered or not read"

    unreachable["b"] = "DNS: b does not resolve (Name or service not known)"
    assert cli.main(["outdated", path, "--json"]) == reach.UNREACHABLE
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert isinstance(document, list) and len(document) == 10
    assert set(document[0]) == {
        "host", "component", "package", "line", "pinned", "installed", "newest", "status",
        "detail", "note",
    }  # fmt: skip
    assert document[4] == {
        "host": "a",
        "component": "docker",
        "package": "docker-ce",
        "line": "28.x",
        "pinned": f"5:28.5.1-1{BOOKWORM}",
        "installed": f"5:28.5.1-1{BOOKWORM}",
        "newest": f"5:28.5.2-1{BOOKWORM}",
        "status": "behind",
        "detail": "",
        "note": "",
    }
    assert document[-1]["host"] == "b" and document[-1]["status"] == "unreachable"
    assert captured.err == "b: unreachable: DNS: b does not resolve (Name or service not known)\n"


def test_nothing_behind_is_exit_0_and_a_bad_inventory_exit_2(tmp_path: Path, repos, boxes, capsys):
    made, _ = boxes
    made["a"] = Box(tmp_path, CONVERGED)
    data = {"llamacpp_cuda": False, **repos, "docker_source": "distro"}
    assert cli.main(["outdated", inventory(tmp_path, {"a": data})]) == reach.OK
    assert capsys.readouterr().out.endswith("1 host(s): nothing behind\n")
    bad = inventory(tmp_path, {"a": {"gpu_count": "two"}}, "bad.py")
    assert cli.main(["outdated", bad]) == reach.BAD_INPUT
    assert "gpu_count" in capsys.readouterr().err
    assert made["a"].commands[0].startswith("cat /etc/os-release")


def test_data_over_the_inventory_asks_the_branch_a_move_would_get(
    tmp_path: Path, repos, boxes, capsys
):
    """--data driver_branch=580 (pyinfra's, read as the deploy reads it): the driver row is the
    580 line, newest in the repository's index at 580; a --data without = is exit 2."""
    made, _ = boxes
    made["a"] = Box(tmp_path, CONVERGED)
    path = inventory(tmp_path, {"a": {"llamacpp_cuda": False, **repos}})
    cli.main(["outdated", path, "--json"])
    before = {row["component"]: row for row in json.loads(capsys.readouterr().out)}
    assert before["driver"]["line"] == "570.x"
    cli.main(["outdated", path, "--json", "--data", "driver_branch=580"])
    after = {row["component"]: row for row in json.loads(capsys.readouterr().out)}
    assert after["driver"]["line"] == "580.x", after["driver"]
    assert after["driver"]["pinned"].startswith("580."), after["driver"]
    assert cli.main(["outdated", path, "--data", "driver_branch"]) == reach.BAD_INPUT
    assert "--data driver_branch: not KEY=VALUE" in capsys.readouterr().err
