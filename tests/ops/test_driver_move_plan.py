"""Issue 30 B: the driver stage's plan for a move between builds on Debian 12 (the sandbox's
family): the installed build kept before any change, not kept twice, and the way back to a
version NVIDIA's repository withdrew, from the kept packages (facts: the installed builds,
the kept builds; the repository's answer without the withdrawn version)."""

from __future__ import annotations

import pytest
from conftest import REFERENCE, fresh_box, installed_pins, make_plan, repo_answers

from gpubox.base import layout
from gpubox.base.errors import DeployRefused
from gpubox.plans import driver_move
from gpubox.stages import driver as driver_stage

INSTALLED = "source:Package"  # driver_replacement.INSTALLED_COMMAND
KEPT = "# gpubox-driver-kept\n"  # driver_move.kept_command
SIMULATION = "gpubox-driver-replacement"
PV570, PV580 = "570.211.01-1", "580.105.08-1"
# the Debian build's packages as dpkg-query prints them (status, name, version, source)
BUILD = ["nvidia-driver-cuda", "nvidia-kernel-dkms", "libcuda1", "nvidia-kernel-support"]
AT_580 = {"driver_branch": "580"}


def dpkg(version: str) -> list[str]:
    return [f"ii \t{n}\t{version}\tnvidia-graphics-drivers" for n in BUILD]


def kept_answer(*versions: str, repo: str | None = None, source: bool = False) -> list[str]:
    """The kept builds' fact: each version complete (digest "d-VERSION"), the kept repository
    made of ``repo``'s, the source file, and 570.211.01's stanzas when it is kept."""
    lines = [f"KEPT {v} d-{v}" for v in versions]
    if repo:
        lines.append(f"REPO d-{repo}")
    if source:
        lines.append(f"SOURCE {driver_move.source_line().strip()}")
    if "570.211.01" in versions:
        lines.append("PACKAGES")
        for name in BUILD:
            lines += [f"Package: {name}", f"Version: {PV570}", "Architecture: amd64", ""]
    return lines


def withdrawn_570() -> list[str]:
    """NVIDIA's repository after it dropped 570.211.01 (the sandbox's repo withdraw)."""
    answer = repo_answers("debian12")["gpubox-apt-query nvidia_cuda"]
    assert isinstance(answer, list)
    return [line for line in answer if not line.endswith(f" {PV570}")]


def names_before(plan, pattern: str) -> list[str]:
    index = next(i for i, n in enumerate(plan.names) if pattern in n)
    return plan.names[:index]


def test_a_move_keeps_the_installed_build_before_any_change():
    box = fresh_box("debian12", **{INSTALLED: dpkg(PV570), SIMULATION: []})
    plan = make_plan(driver_stage.driver, {**REFERENCE, **AT_580}, box)
    (keep,) = [n for n in plan.names if "Keep driver" in n]
    assert keep == (
        "NVIDIA driver | Keep driver 570.211.01's packages before replacing it "
        "(/var/lib/gpubox/driver-kept/570.211.01)"
    )
    # the stage's first change: only preflight's wait for dpkg's lock comes before it
    before = names_before(plan, "Keep driver")
    assert len(before) == 1 and "dpkg" in before[0]
    assert plan.names.index(keep) < names_before(plan, "Pin the NVIDIA driver").index(keep) + 1
    (command,) = plan.op("Keep driver")
    assert command.startswith(driver_move.KEEP_MARK + " 570.211.01")
    assert f"-v vs=' {PV570} '" in command
    assert f"nvidia-driver-cuda={PV580}" in plan.installs()
    # not the way back: no kept repository to serve
    assert not [n for n in plan.names if "kept packages" in n]


def test_a_build_kept_already_is_not_kept_again():
    box = fresh_box(
        "debian12", **{INSTALLED: dpkg(PV570), SIMULATION: [], KEPT: kept_answer("570.211.01")}
    )
    plan = make_plan(driver_stage.driver, {**REFERENCE, **AT_580}, box)
    assert not [n for n in plan.names if "Keep driver" in n]
    assert f"nvidia-driver-cuda={PV580}" in plan.installs()


def test_a_version_the_repository_withdrew_and_the_box_did_not_keep_is_refused():
    box = fresh_box(
        "debian12", **{INSTALLED: dpkg(PV580), "gpubox-apt-query nvidia_cuda": withdrawn_570()}
    )
    with pytest.raises(DeployRefused) as refused:
        make_plan(driver_stage.driver, REFERENCE, box)
    assert "driver_version" in str(refused.value) and "570.211.01" in str(refused.value)


def test_the_way_back_installs_a_withdrawn_version_from_the_kept_packages():
    box = fresh_box(
        "debian12",
        **{
            INSTALLED: dpkg(PV580),
            SIMULATION: [],
            "gpubox-apt-query nvidia_cuda": withdrawn_570(),
            KEPT: kept_answer("570.211.01"),
        },
    )
    plan = make_plan(driver_stage.driver, REFERENCE, box)
    # the build it replaces is kept first, then the kept one is checked and served
    assert (
        "NVIDIA driver | Keep driver 580.105.08's packages before replacing it "
        "(/var/lib/gpubox/driver-kept/580.105.08)" in names_before(plan, "Pin the NVIDIA driver")
    )
    (check,) = plan.op("Check driver 570.211.01's kept packages")
    assert check.startswith(driver_move.REPO_MARK + " 570.211.01")
    assert "sha256sum -c SHA256SUMS" in check
    source = plan.op("apt source: driver 570.211.01's kept packages")
    assert any(layout.DRIVER_KEPT_SOURCE in c for c in source)
    # apt update after the source changed, before the install
    (update,) = [n for n in plan.names if "apt update" in n]
    assert update in plan.conditional
    names = plan.names
    assert names.index(update) < next(i for i, n in enumerate(names) if "Install NVIDIA" in n)
    assert "NVIDIA driver | apt source: driver 570.211.01's kept packages" in names_before(
        plan, "apt update"
    )
    assert sorted(p for p in plan.installs() if "=" in p) == sorted(
        f"{n}={PV570}" for n in ("nvidia-driver-cuda", "nvidia-kernel-dkms")
    )


def test_a_converged_box_at_a_kept_version_changes_nothing_of_the_kept_packages(commands):
    # nvidia-driver-cuda's source is its own name (the sandbox's stand-in has no Source field;
    # NVIDIA's is not recorded): INSTALLED_COMMAND's awk leaves it out, dpkg -l lists it
    installed = [line for line in dpkg(PV570) if "\tnvidia-driver-cuda\t" not in line]
    box = fresh_box(
        "debian12",
        **{
            "dpkg -l": installed_pins("debian12"),
            INSTALLED: installed,
            "gpubox-apt-query nvidia_cuda": withdrawn_570(),
            KEPT: kept_answer("570.211.01", "580.105.08", repo="570.211.01", source=True),
        },
    )
    plan = make_plan(driver_stage.driver, REFERENCE, box)
    assert not [n for n in plan.names if "kept" in n.lower()]
    assert not any(SIMULATION in c for c in commands)  # no other build: no simulation


def test_a_pinned_version_not_kept_takes_the_kept_source_away():
    box = fresh_box(
        "debian12",
        **{
            INSTALLED: dpkg(PV570),
            SIMULATION: [],
            KEPT: kept_answer("570.211.01", repo="570.211.01", source=True),
        },
    )
    plan = make_plan(driver_stage.driver, {**REFERENCE, **AT_580}, box)
    # (the source file's removal is a no-op here: the fake box has no file at all)
    assert "NVIDIA driver | Remove the kept driver's apt repository" in plan.names
    assert not [n for n in plan.names if "apt source: driver" in n]


def test_the_simulation_sees_the_kept_build_on_the_way_back(commands):
    box = fresh_box(
        "debian12",
        **{
            INSTALLED: dpkg(PV580),
            SIMULATION: [],
            "gpubox-apt-query nvidia_cuda": withdrawn_570(),
            KEPT: kept_answer("570.211.01"),
        },
    )
    make_plan(driver_stage.driver, REFERENCE, box)
    (simulation,) = [c for c in commands if SIMULATION in c]
    assert "file:/var/lib/gpubox/driver-kept-repo ./" in simulation
    assert (
        "cp /var/lib/gpubox/driver-kept/570.211.01/Packages "
        '"$d/lists/_var_lib_gpubox_driver-kept-repo_._Packages"' in simulation
    )
