"""The NVIDIA driver: pinned, held, the only branch, loaded, persistent, NVLink up."""

from __future__ import annotations

import itertools
import re

import pytest

from gpubox import kernels, parsers

QUERY = "index,name,uuid,pci.bus_id,driver_version,persistence_mode"


def smi_gpus(box) -> list[dict]:
    result = box.run(f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader,nounits")
    error = parsers.parse_smi_error(result.stdout + result.stderr)
    output = (result.stdout + result.stderr)[:300]
    assert error is None and result.rc == 0, (
        f"{box.name}: nvidia-smi fails ({error or result.rc}): {output}"
    )
    return parsers.parse_query_gpu(result.stdout, QUERY.split(","))


@pytest.mark.quick
def test_driver_packages_at_the_pinned_version(box):
    want = box.driver_packages
    wrong = {
        name: (box.dpkg[name].version if name in box.dpkg else "not installed")
        for name in want.installed
        if name not in box.dpkg
        or box.dpkg[name].version != want.package_version
        or not box.dpkg[name].status.startswith(("ii", "hi"))
    }
    assert not wrong, f"{box.name}: driver packages not at {want.package_version}: {wrong}"


@pytest.mark.quick
def test_driver_packages_are_held(box):
    held = parsers.parse_showhold(box.out("apt-mark showhold"))
    missing = sorted(set(box.driver_packages.installed) - held)
    assert not missing, f"{box.name}: driver packages not held: {missing}"


@pytest.mark.quick
def test_apt_candidate_is_the_pinned_version(box):
    """The pin works (not merely exists): apt would choose nothing else."""
    want = box.driver_packages
    policy = parsers.parse_apt_policy(box.out("apt-cache policy " + " ".join(want.installed)))
    wrong = {
        name: (policy[name].candidate if name in policy else "unknown to apt")
        for name in want.installed
        if name not in policy or policy[name].candidate != want.package_version
    }
    assert not wrong, f"{box.name}: apt candidates other than {want.package_version}: {wrong}"


@pytest.mark.quick
def test_no_other_branch_no_other_flavour_no_driver_metas(box):
    want = box.driver_packages
    branch_prefix = box.config.driver_version + "-"
    names = set(want.installed)
    nvidia = re.compile(r"^(lib)?nvidia-|^libcuda|^firmware-nvidia|^xserver-xorg-video-nvidia")
    other_versions = {
        name: pkg.version
        for name, pkg in box.dpkg.items()
        if pkg.status.startswith(("ii", "hi", "iU", "iF"))
        and nvidia.match(name)
        and not name.startswith("libnvidia-container")
        and (name in names or re.search(r"\d{3}\.\d+", pkg.version))
        and not pkg.version.startswith(branch_prefix)
    }
    assert not other_versions, f"{box.name}: NVIDIA packages of another driver: {other_versions}"
    unwanted = sorted(
        name
        for name in want.refused + want.forbidden
        if name in box.dpkg and box.dpkg[name].status.startswith(("ii", "hi"))
    )
    assert not unwanted, (
        f"{box.name}: installed but must not be ({box.config.driver_kernel_modules} modules, "
        f"no driver metas): {unwanted}"
    )


@pytest.mark.quick
def test_unattended_upgrades_blacklist_covers_the_driver(box):
    dump = box.out("apt-config dump Unattended-Upgrade::Package-Blacklist")
    patterns = re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', dump, re.M)
    uncovered = [
        name
        for name in box.driver_packages.installed
        if not any(re.match(p, name) for p in patterns)
    ]
    assert not uncovered, f"{box.name}: unattended-upgrades may upgrade {uncovered}"


@pytest.mark.quick
def test_nvidia_module_is_built_for_every_bootable_kernel(box):
    """After a kernel update the box boots a kernel DKMS may not have built the module for
    (its headers were missing): every kernel in /boot, and the running one, has it."""
    state = kernels.parse_kernel_state(box.out(kernels.KERNEL_STATE_COMMAND).splitlines())
    assert state.dkms is not None, f"{box.name}: dkms is not installed: no kernel gets the module"
    lacking = kernels.kernels_lacking_module(state, box.config.driver_version)
    assert not lacking, (
        f"{box.name}: no NVIDIA {box.config.driver_version} module (dkms status) for kernel(s) "
        f"{', '.join(lacking)}: re-run the deploy (dkms autoinstall -k KERNEL, or that kernel's "
        "headers)"
    )


@pytest.mark.quick
def test_nouveau_is_not_loaded(box):
    assert not box.host.file("/sys/module/nouveau").exists, f"{box.name}: nouveau is loaded"


@pytest.mark.quick
def test_nvidia_persistenced_is_active(box):
    service = box.host.service("nvidia-persistenced")
    assert service.is_running, f"{box.name}: nvidia-persistenced is not running"


@pytest.mark.gpu
def test_nvidia_smi_lists_the_gpus(box):
    gpus = smi_gpus(box)
    model = box.config.gpu_model
    wrong = [f"GPU {g['index']} is {g['name']}" for g in gpus if g["name"] != model]
    assert len(gpus) == box.config.gpu_count and not wrong, (
        f"{box.name}: nvidia-smi lists {len(gpus)} GPU(s), expected {box.config.gpu_count} "
        f"{model}"
        + (f"; {', '.join(wrong)}" if wrong else "")
        + "; found: "
        + ", ".join(f"GPU {g['index']} {g['name']} {g['pci.bus_id']}" for g in gpus)
    )


@pytest.mark.gpu
def test_loaded_driver_is_the_installed_one(box):
    versions = {g["driver_version"] for g in smi_gpus(box)}
    module = box.run("cat /sys/module/nvidia/version")
    if module.rc == 0:
        versions.add(module.stdout.strip())
    assert versions == {box.config.driver_version}, (
        f"{box.name}: loaded driver {sorted(versions)}, installed {box.config.driver_version}"
    )


@pytest.mark.gpu
def test_persistence_mode_is_enabled_on_every_gpu(box):
    if not box.config.persistence_mode:
        pytest.skip("persistence_mode is false in the inventory")
    off = [
        f"GPU {g['index']} ({g['pci.bus_id']})"
        for g in smi_gpus(box)
        if g["persistence_mode"] != "Enabled"
    ]
    assert not off, f"{box.name}: persistence mode is not Enabled on {', '.join(off)}"


@pytest.mark.gpu
def test_nvlink_links_are_active(box):
    """Every GPU has its NVLink links up: `nvlink_links` of them when the inventory says how
    many (a V100 has six ports; a board wires fewer, the rest read <inactive>)."""
    if not box.config.nvlink:
        pytest.skip("nvlink is false in the inventory")
    status = parsers.parse_nvlink_status(box.out("nvidia-smi nvlink -s"))
    want = box.config.nvlink_links
    problems = []
    for gpu in range(box.config.gpu_count):
        links = status.get(gpu, [])
        active = [link.link for link in links if link.active]
        inactive = [link.link for link in links if not link.active]
        if not links:
            problems.append(f"GPU {gpu} reports no NVLink links")
        elif (want is None and not active) or (want is not None and len(active) != want):
            problems.append(
                f"GPU {gpu}: {len(active)} NVLink link(s) active, expected "
                f"{want if want is not None else 'at least 1'} (active: "
                f"{', '.join(map(str, active)) or 'none'}; inactive: "
                f"{', '.join(map(str, inactive)) or 'none'})"
            )
    assert not problems, f"{box.name}: " + "; ".join(problems)


@pytest.mark.gpu
def test_topology_joins_every_gpu_pair_by_nvlink(box):
    if not box.config.nvlink:
        pytest.skip("nvlink is false in the inventory")
    topo = parsers.parse_topo_matrix(box.out("nvidia-smi topo -m"))
    assert len(topo.gpus) == box.config.gpu_count, (
        f"{box.name}: topo -m shows {len(topo.gpus)} GPU(s), expected {box.config.gpu_count}"
    )
    missing = [
        f"{a}-{b} ({topo.links.get((a, b))})"
        for a, b in itertools.combinations(topo.gpus, 2)
        if topo.nvlinks(a, b) == 0
    ]
    assert not missing, f"{box.name}: GPU pairs not joined by NVLink: {', '.join(missing)}"
