"""The driver stage's plan on Ubuntu 24.04 and Debian 12: packages, versions, pins, repos."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import (
    REFERENCE,
    fresh_box,
    headers_query,
    installed_pins,
    kept_offers,
    repo_answers,
)

from gpubox.base.errors import DeployRefused
from gpubox.config import load_host_config, target_for
from gpubox.parsers import parse_stanzas
from gpubox.plans import driver as driver_plan
from gpubox.preflight import dpkg_ready
from gpubox.rules import offers
from gpubox.stages import driver as driver_stage
from gpubox.stages import run_stages


def offered(os_name: str) -> dict[str, list[str]]:
    """NVIDIA's CUDA repository as the fake box's apt answers for it."""
    return offers.parse_query(repo_answers(os_name)["gpubox-apt-query nvidia_cuda"]).offers


def plan_for(os_name: str, data: dict[str, object] = REFERENCE) -> driver_plan.DriverPlan:
    config = load_host_config("box", data)
    os_id, version = {"ubuntu2404": ("ubuntu", "24.04"), "debian12": ("debian", "12")}[os_name]
    target = target_for({"ID": os_id, "VERSION_ID": version}, config.catalog)
    assert target is not None
    return driver_plan.plan(config, target, offered(os_name))


UBUNTU_570 = [
    "libnvidia-compute-570",
    "libnvidia-cfg1-570",
    "nvidia-utils-570",
    "nvidia-compute-utils-570",
    "nvidia-kernel-common-570",
    "nvidia-firmware-570-570.211.01",
    "nvidia-dkms-570",
    "nvidia-kernel-source-570",
]
DEBIAN_570 = ["nvidia-driver-cuda", "nvidia-kernel-dkms"]  # NVIDIA's documented roots


def test_ubuntu_installs_nvidias_exact_570_with_proprietary_modules(plan_of):
    plan = plan_of(driver_stage.driver, REFERENCE, fresh_box("ubuntu2404"))
    installed = plan.installs()
    assert sorted(installed) == sorted(
        ["linux-headers-6.8.0-88-generic", "linux-headers-generic"]
        + [f"{n}=570.211.01-0ubuntu1" for n in UBUNTU_570]
    )
    assert not [p for p in installed if "open" in p or p.startswith(("cuda", "nvidia-driver-5"))]
    command = plan.op(r"Install NVIDIA driver")[0]
    assert "--allow-downgrades" in command and "--allow-change-held-packages" in command
    assert plan.op("Hold the driver packages") == ["apt-mark hold " + " ".join(UBUNTU_570)]


def test_ubuntu_repository_is_nvidias_ubuntu2404_with_a_pinned_key(plan_of):
    plan = plan_of(driver_stage.driver, REFERENCE, fresh_box("ubuntu2404"))
    key = plan.op("NVIDIA CUDA .* key \\(")[0]
    assert (
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"
        "cuda-archive-keyring.gpg" in key
    )
    assert "EB693B3035CD5710E231E123A4B469963BF863CC" in key
    assert "apt-key" not in " ".join(plan.commands)
    assert not [n for n in plan.names if "contrib" in n]  # Debian only
    (update,) = [n for n in plan.names if "apt update" in n]
    (command,) = plan.op("apt update")
    # apt-get update ignores DPkg::Lock::Timeout: it waits for the lists lock itself first
    assert command.endswith(" && apt-get update") and "/var/lib/apt/lists/lock" in command
    assert update in plan.conditional
    config = load_host_config("box", REFERENCE)
    from gpubox.ops.apt_repo import cuda_source_line as source_line

    target = target_for({"ID": "ubuntu", "VERSION_ID": "24.04"}, config.catalog)
    assert source_line(config, target) == (
        "deb [signed-by=/usr/share/keyrings/gpubox-nvidia-cuda.gpg] "
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/ /\n"
    )


def test_ubuntu_pin_is_exact_and_refuses_the_archives_stubs_and_open_modules():
    pin = plan_for("ubuntu2404").pin
    fields = parse_stanzas(pin)
    assert fields[0]["Pin"] == "version 570.211.01-0ubuntu1"
    assert fields[0]["Pin-Priority"] == "1001"
    assert sorted(fields[0]["Package"].split()) == sorted(UBUNTU_570)
    assert (fields[1]["Pin"], fields[1]["Pin-Priority"]) == ("version *", "-1")
    assert fields[2]["Package"].split() == ["nvidia-dkms-570-open", "nvidia-kernel-source-570-open"]
    assert fields[2]["Pin-Priority"] == "-1"
    assert fields[3]["Pin"] == "release o=Ubuntu" and fields[3]["Pin-Priority"] == "-1"
    # Ubuntu's driver builds by source package, never every NVIDIA name
    assert "src:nvidia-graphics-drivers-*" in fields[3]["Package"].split()
    assert "nvidia-*" not in fields[3]["Package"].split()


def test_unattended_upgrades_blacklist_names_every_driver_package():
    text = plan_for("ubuntu2404").unattended
    patterns = re.findall(r'^\s+"(.*)";$', text, re.M)
    for name in UBUNTU_570:
        assert any(re.match(p, name) for p in patterns), name
    assert not any(re.match(p, "nvidia-container-toolkit") for p in patterns)


def test_debian_uses_unsuffixed_names_contrib_and_the_debian12_repository(plan_of):
    plan = plan_of(driver_stage.driver, REFERENCE, fresh_box("debian12"))
    assert sorted(plan.installs()) == sorted(
        ["linux-headers-6.8.0-88-generic", "linux-headers-generic"]
        + [f"{n}=570.211.01-1" for n in DEBIAN_570]
    )
    assert plan.op("contrib")  # enabled because the box's sources lack it
    assert "/repos/debian12/x86_64/" in plan.op("NVIDIA CUDA .* key \\(")[0]
    pin = plan_for("debian12").pin
    assert "Pin: version 570.211.01-1\nPin-Priority: 1001" in pin
    # Debian's own driver builds by source package, never its support packages by name
    assert "Package: src:nvidia-graphics-drivers*\nPin: release o=Debian\nPin-Priority: -1" in pin
    assert "nvidia-kernel-open-dkms\nPin: version *\nPin-Priority: -1" in pin


def test_contrib_already_enabled_is_left_alone(plan_of):
    plan = plan_of(
        driver_stage.driver, REFERENCE, fresh_box("debian12", **{"grep -qw contrib": "yes"})
    )
    assert plan.op("contrib") == []


def test_drivers_metas_and_the_open_flavour_are_removed_never_installed(plan_of):
    dpkg = [
        "ii  cuda-drivers  580.105.08-1  amd64  meta",
        "ii  nvidia-kernel-open-dkms  580.105.08-1  amd64  open",
    ]
    plan = plan_of(driver_stage.driver, REFERENCE, fresh_box("debian12", **{"dpkg -l": dpkg}))
    (remove,) = plan.op("Remove packages")
    assert re.search(r" remove cuda-drivers nvidia-kernel-open-dkms$", remove)


def test_reboot_when_no_driver_is_loaded_and_none_when_it_is(plan_of):
    fresh = plan_of(driver_stage.driver, REFERENCE, fresh_box("ubuntu2404"))
    assert [n for n in fresh.names if "Reboot to load the driver" in n]
    loaded = plan_of(
        driver_stage.driver,
        REFERENCE,
        fresh_box("ubuntu2404", **{"cat /sys/module/nvidia/version": "570.211.01"}),
    )
    assert not [n for n in loaded.names if "Reboot" in n or "reboot is needed" in n]


def test_reboot_when_nouveau_is_loaded(plan_of):
    plan = plan_of(
        driver_stage.driver,
        REFERENCE,
        fresh_box(
            "ubuntu2404",
            **{
                "cat /sys/module/nvidia/version": "570.211.01",
                "test -d /sys/module/nouveau": "yes",
            },
        ),
    )
    assert [n for n in plan.names if "nouveau is loaded" in n]


def test_no_reboot_allowed_stops_with_a_message(plan_of):
    plan = plan_of(
        lambda: run_stages(driver_stage.driver),  # a stop for the owner (HostStopped: exit 4)
        {**REFERENCE, "allow_reboot": False},
        fresh_box("ubuntu2404", **{"cat /sys/module/nvidia/version": "580.105.08"}),
    )
    assert not [n for n in plan.names if "Reboot to load" in n]
    assert [n for n in plan.names if "a reboot is needed" in n]


def test_persistence_dropin_and_initramfs(plan_of):
    plan = plan_of(driver_stage.driver, REFERENCE, fresh_box("ubuntu2404"))
    # -u alone rebuilds only the newest kernel's initramfs (update-initramfs(8)): the others
    # would keep nouveau in theirs.
    assert plan.op("Rebuild the initramfs") == ["update-initramfs -u -k all"]
    (initramfs,) = [n for n in plan.names if "initramfs" in n]
    assert initramfs in plan.conditional  # only when the blacklist file changed
    assert plan.op("nvidia-persistenced running") == ["systemctl start nvidia-persistenced.service"]
    from gpubox.base.rendering import render

    dropin = render("nvidia-persistenced.conf.j2", persistence_mode=True)
    # the packaged ExecStart (and the user it names, which differs by distribution) is kept
    assert "ExecStart=" not in dropin.replace("ExecStartPost=", "")
    assert "--user" not in dropin
    assert "ExecStartPost=/usr/bin/nvidia-smi -pm 1\n" in dropin
    off = render("nvidia-persistenced.conf.j2", persistence_mode=False)
    assert "ExecStartPost=/usr/bin/nvidia-smi -pm 0\n" in off


def test_kernel_headers_can_be_left_out(plan_of):
    plan = plan_of(
        driver_stage.driver, {**REFERENCE, "driver_kernel_headers": False}, fresh_box("ubuntu2404")
    )
    assert not [p for p in plan.installs() if p.startswith("linux-headers")]


# Issue 29 D12: the running kernel's headers, asked of the box's apt first. A Debian 12 box
# not rebooted since a kernel update: 6.1.0-26 runs, the update installed 6.1.0-57 and moved
# linux-image-amd64 to it; the archive's index lists the headers of 6.1.0-57 and the meta, not
# those of 6.1.0-26 (recorded on Debian 12: tests/fixtures/apt/
# apt-cache-policy_linux-headers_debian12_local.txt).
POLICY_HEADERS = (
    Path(__file__).parents[1] / "fixtures/apt/apt-cache-policy_linux-headers_debian12_local.txt"
).read_text()


def not_rebooted(lists: bool = True) -> dict[object, object]:
    return fresh_box(
        "debian12",
        **{
            "uname -r": "6.1.0-26-amd64",
            "for f in /boot/vmlinuz-*": [
                "R 6.1.0-26-amd64",
                "K 6.1.0-26-amd64",
                "K 6.1.0-57-amd64",
                "H 6.1.0-57-amd64",
            ],
            "'linux-image-*'": [
                "linux-image-6.1.0-26-amd64\t6.1.112-1\tii ",
                "linux-image-6.1.0-57-amd64\t6.1.192-3\tii ",
                "linux-image-amd64\t6.1.192-3\tii ",
            ],
            # without lists apt knows nothing: the command prints no "## lists" line
            headers_query("6.1.0-26-amd64"): (["## lists"] if lists else [])
            + POLICY_HEADERS.splitlines(),
        },
    )


def headers_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "kernel headers:" in r.getMessage()]


def test_headers_the_archive_no_longer_has_are_skipped_with_a_warning(plan_of, caplog):
    plan = plan_of(driver_stage.driver, REFERENCE, not_rebooted())
    headers = [p for p in plan.installs() if "headers" in p]
    assert headers == ["linux-headers-amd64"]  # which brings 6.1.0-57's
    (build,) = plan.op("Build the NVIDIA module for every bootable kernel \\(6.1.0-57-amd64\\)")
    assert "dkms autoinstall -k 6.1.0-57-amd64" in build and "6.1.0-26" not in build
    (warning,) = headers_warnings(caplog)
    assert "linux-headers-6.1.0-26-amd64 is in none of the box's apt repositories" in warning
    assert "DKMS cannot build the NVIDIA module for 6.1.0-26-amd64" in warning
    assert "Reboot into the newest kernel (6.1.0-57-amd64, installed)" in warning
    assert "whose headers linux-headers-amd64 brings" in warning


def test_the_running_kernel_offered_is_installed_and_built_without_a_warning(plan_of, caplog):
    answers = not_rebooted()
    answers[headers_query("6.1.0-26-amd64")] = ["## lists"] + POLICY_HEADERS.replace(
        "6.1.0-57", "6.1.0-26"
    ).splitlines()
    plan = plan_of(driver_stage.driver, REFERENCE, answers)
    headers = [p for p in plan.installs() if "headers" in p]
    assert headers == ["linux-headers-6.1.0-26-amd64", "linux-headers-amd64"]
    build = plan.op("Build the NVIDIA module for every bootable kernel")[0]
    assert "linux-headers-6.1.0-26-amd64" in build
    assert not headers_warnings(caplog)


def test_without_package_lists_the_headers_are_asked_for_as_before(plan_of, caplog):
    """A box whose apt lists were never fetched (a cloud image): apt knows nothing yet, and
    the deploy's apt update comes before the install."""
    plan = plan_of(driver_stage.driver, REFERENCE, not_rebooted(lists=False))
    assert "linux-headers-6.1.0-26-amd64" in plan.installs()
    assert not headers_warnings(caplog)


def test_without_driver_kernel_headers_the_repair_skips_a_kernel_the_archive_lacks(plan_of, caplog):
    data = {**REFERENCE, "driver_kernel_headers": False}
    plan = plan_of(driver_stage.driver, data, not_rebooted())
    assert not [p for p in plan.installs() if p.startswith("linux-headers")]
    (build,) = plan.op("Build the NVIDIA module for every bootable kernel \\(6.1.0-57-amd64\\)")
    assert "6.1.0-26" not in build
    (warning,) = headers_warnings(caplog)
    assert warning.endswith(
        "Reboot into the newest kernel (6.1.0-57-amd64, installed), whose headers are "
        "installed: DKMS builds the module for it"
    )


# Refusals: nothing is planned, the error names the host and the problem.


def refused(plan_of, data, answers) -> str:
    with pytest.raises(DeployRefused) as err:
        plan_of(driver_stage.driver, data, answers)
    return str(err.value)


def test_invalid_inventory_is_refused_before_anything(plan_of):
    text = refused(plan_of, {**REFERENCE, "driver_brach": "570"}, fresh_box("ubuntu2404"))
    assert "@fake/box: driver_brach: unknown key; did you mean 'driver_branch'?" in text


def test_unsupported_os_release_is_refused(plan_of):
    text = refused(plan_of, REFERENCE, fresh_box("ubuntu2204"))
    assert "@fake/box: os: unsupported OS release ubuntu 22.04" in text


def test_gpus_on_the_bus_must_match_the_inventory(plan_of):
    text = refused(plan_of, {**REFERENCE, "gpu_count": 4}, fresh_box("ubuntu2404"))
    assert "@fake/box: gpu_count: lspci shows 2 Tesla V100-SXM2-32GB (gpu_count is 4)" in text


def test_not_root_and_no_sudo_is_refused(plan_of):
    text = refused(plan_of, REFERENCE, fresh_box("ubuntu2404", **{"id -u": "1000"}))
    assert "@fake/box: privileges: commands run as uid 1000" in text


def converged_ubuntu_box() -> dict[object, object]:
    """Fact answers of an Ubuntu 24.04 box that a deploy already converged."""
    import hashlib

    from gpubox.base.rendering import FILES, render
    from gpubox.ops.apt_repo import cuda_source_line as source_line
    from gpubox.stages import cuda as cuda_stage

    config = load_host_config("box", REFERENCE)
    target = target_for({"ID": "ubuntu", "VERSION_ID": "24.04"}, config.catalog)
    plan = plan_for("ubuntu2404")
    cuda = cuda_stage.plan(config, target)
    files = {
        driver_stage.PIN_FILE: plan.pin,
        driver_stage.UNATTENDED_FILE: plan.unattended,
        driver_stage.NOUVEAU_FILE: (FILES / "blacklist-nouveau.conf").read_text(),
        driver_stage.PERSISTENCED_DROPIN: render(
            "nvidia-persistenced.conf.j2", persistence_mode=True
        ),
        driver_stage.PERSISTENCED_WANTED: render("nvidia-persistenced-wanted.conf.j2"),
        config.catalog["repos"]["nvidia_cuda"]["source_file"]: source_line(config, target),
        cuda_stage.PROFILE_FILE: cuda.profile,
        cuda_stage.LD_FILE: cuda.ld_conf,
        dpkg_ready.CONF_FILE: dpkg_ready.lock_timeout_conf(900),
    }
    digests = [
        f"{path} 644 {hashlib.sha256(text.encode()).hexdigest()}" for path, text in files.items()
    ]
    dpkg = [f"hi  {name}  570.211.01-0ubuntu1  amd64  driver" for name in UBUNTU_570] + [
        "ii  cuda-toolkit-12-8  12.8.1-1  amd64  toolkit",
        "ii  linux-headers-6.8.0-88-generic  6.8.0-88.89  amd64  headers",
        "ii  linux-headers-generic  6.8.0-88.89  amd64  headers meta",
        # NCCL left from a tensor split (two GPUs, llama.cpp with CUDA), at an older
        # +cuda12.8 build than the newest offered: the layer split asks for none, and the
        # installed packages stay as they are
        "hi  libnccl2  2.25.1-1+cuda12.8  amd64  NCCL",
        "hi  libnccl-dev  2.25.1-1+cuda12.8  amd64  NCCL",
    ]
    dpkg += [line for line in installed_pins("ubuntu2404") if line.split()[1] not in UBUNTU_570]
    return fresh_box(
        "ubuntu2404",
        **{
            # the repositories' answers the first deploy kept (gpubox.preflight.answers)
            "gpubox-kept-offers": kept_offers("ubuntu2404"),
            "sha256sum <": digests,
            "dpkg -l": dpkg,
            "apt-mark showhold": UBUNTU_570 + ["libnccl2", "libnccl-dev"],
            "gpg --homedir": "EB693B3035CD5710E231E123A4B469963BF863CC",
            "cat /sys/module/nvidia/version": "570.211.01",
            "systemctl show": ["Id=nvidia-persistenced.service", "SubState=running"],
            "readlink -e /usr/local/cuda": "/usr/local/cuda-12.8",
            "for f in /boot/vmlinuz-*": [
                "R 6.8.0-88-generic",
                "K 6.8.0-88-generic",
                "H 6.8.0-88-generic",
                "DKMS",
                "D nvidia/570.211.01, 6.8.0-88-generic, x86_64: installed",
            ],
        },
    )


def test_a_converged_ubuntu_box_plans_no_change(plan_of):
    from gpubox.stages import cuda as cuda_stage

    answers = converged_ubuntu_box()
    for stage in (driver_stage.driver, cuda_stage.cuda):
        plan = plan_of(stage, REFERENCE, answers)
        changing = [
            (name, commands)
            for name, commands in plan.ops
            if commands and name not in plan.conditional
        ]
        assert changing == [], changing
    # and the same box with one file edited by hand plans exactly that file's repair
    edited = dict(answers)
    edited["sha256sum <"] = [
        line.replace(" 644 ", " 600 ") if driver_stage.PIN_FILE in line else line
        for line in answers["sha256sum <"]
    ]
    plan = plan_of(driver_stage.driver, REFERENCE, edited)
    assert [n for n, c in plan.ops if c and n not in plan.conditional] == [
        "NVIDIA driver | Pin the NVIDIA driver to one exact version"
    ]


# What the repository offers decides; a catalog pin it does not carry is one clear line.


def test_a_driver_root_the_repository_lacks_is_refused_naming_what_it_offers(plan_of):
    answers = fresh_box("debian12")
    answers["gpubox-apt-query nvidia_cuda"] = [
        line
        for line in answers["gpubox-apt-query nvidia_cuda"]
        if not line.startswith("P nvidia-driver-cuda 570.")
    ]
    text = refused(plan_of, REFERENCE, answers)
    assert "nothing was changed" in text
    assert "nvidia-driver-cuda (the repository has 580.105.08-1)" in text


def test_a_toolkit_pin_the_repository_no_longer_carries_names_the_key(plan_of):
    answers = fresh_box("ubuntu2404")
    answers["gpubox-apt-query nvidia_cuda"] = [
        line.replace("cuda-toolkit-12-8 12.8.1-1", "cuda-toolkit-12-8 12.8.2-1")
        for line in answers["gpubox-apt-query nvidia_cuda"]
    ]
    text = refused(plan_of, REFERENCE, answers)
    assert (
        "@fake/box: cuda: repos.nvidia_cuda does not offer cuda-toolkit-12-8=12.8.1-1 "
        "(offered: 12.8.2-1); pin one it offers with catalog_overrides "
        "'cuda.versions.12.8.package_version'" in text
    )


def test_an_unreadable_repository_is_refused_before_anything(plan_of):
    answers = fresh_box(
        "ubuntu2404", **{"gpubox-apt-query nvidia_container_toolkit": "E 404 Not Found"}
    )
    text = refused(plan_of, REFERENCE, answers)
    assert "repos.nvidia_container_toolkit: cannot read the repository (404 Not Found)" in text


def test_the_pin_covers_every_package_nvidia_builds_at_the_version(plan_of):
    answers = fresh_box("debian12")
    answers["gpubox-apt-query nvidia_cuda"] = [
        *answers["gpubox-apt-query nvidia_cuda"],
        "P nvidia-smi 570.211.01-1",
        "P libcuda1 570.211.01-1",
    ]
    plan = plan_of(driver_stage.driver, REFERENCE, answers)
    (pin_upload,) = [c for c in plan.op("Pin the NVIDIA driver") if "nvidia-smi" in c] or [""]
    config = load_host_config("box", REFERENCE)
    target = target_for({"ID": "debian", "VERSION_ID": "12"}, config.catalog)
    assert target is not None
    p = driver_plan.plan(
        config, target, offers.parse_query(answers["gpubox-apt-query nvidia_cuda"]).offers
    )
    assert {"nvidia-smi", "libcuda1", "nvidia-driver-cuda"} <= set(p.pinned)
    assert "nvidia-kernel-open-dkms" not in p.pinned and p.install == DEBIAN_570


def test_kernel_headers_meta_and_the_module_for_every_bootable_kernel(plan_of):
    fresh = plan_of(driver_stage.driver, REFERENCE, fresh_box("debian12"))
    assert "linux-headers-generic" in fresh.installs()
    build = fresh.op("Build the NVIDIA module for every bootable kernel")[0]
    assert "dkms autoinstall -k 6.8.0-88-generic" in build
    # a kernel update installed 6.8.0-90 without the module: only that one is built
    updated = fresh_box(
        "ubuntu2404",
        **{
            "for f in /boot/vmlinuz-*": [
                "R 6.8.0-88-generic",
                "K 6.8.0-88-generic",
                "K 6.8.0-90-generic",
                "H 6.8.0-88-generic",
                "DKMS",
                "D nvidia/570.211.01, 6.8.0-88-generic, x86_64: installed",
            ]
        },
    )
    plan = plan_of(driver_stage.driver, REFERENCE, updated)
    (command,) = plan.op("Build the NVIDIA module for every bootable kernel \\(6.8.0-90-generic\\)")
    assert "6.8.0-88" not in command and "linux-headers-6.8.0-90-generic" in command


def test_debians_legacy_gpu_check_is_answered_once_before_the_install(plan_of):
    fresh = plan_of(driver_stage.driver, REFERENCE, fresh_box("debian12"))
    names = fresh.names
    preseed = [i for i, n in enumerate(names) if "legacy-GPU check" in n]
    install = [i for i, n in enumerate(names) if "Install NVIDIA driver" in n]
    assert preseed and install and preseed[0] < install[0]
    assert "check-for-unsupported-gpu boolean false" in fresh.op("legacy-GPU check")[0]
    answered = plan_of(
        driver_stage.driver,
        REFERENCE,
        fresh_box("debian12", **{"/var/cache/debconf/config.dat": "false"}),
    )
    assert not [n for n in answered.names if "legacy-GPU check" in n]
    ubuntu = plan_of(driver_stage.driver, REFERENCE, fresh_box("ubuntu2404"))
    assert not [n for n in ubuntu.names if "legacy-GPU check" in n]


def _gpus(*modes: str) -> dict[str, str]:
    """The answer of the GPUs' query (gpubox.knowledge.reads.GPU_QUERY) with these persistence
    modes."""
    rows = [
        f"{i}, Tesla V100-SXM2-32GB, GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd, "
        f"00000000:0{6 + i}:00.0, 570.211.01, {mode}, 0, 32768, 35, 41.20, 300.00"
        for i, mode in enumerate(modes)
    ]
    return {"--query-gpu=index,name,uuid": "\n".join(rows)}


def test_persistence_switched_off_by_hand_is_switched_back_on_the_running_driver(plan_of):
    loaded = {"cat /sys/module/nvidia/version": "570.211.01"}
    off = fresh_box("ubuntu2404", **loaded, **_gpus("Enabled", "Disabled"))
    plan = plan_of(driver_stage.driver, REFERENCE, off)
    assert plan.op("persistence mode back on") == ["nvidia-smi -pm 1"]
    on = fresh_box("ubuntu2404", **loaded, **_gpus("Enabled", "Enabled"))
    plan = plan_of(driver_stage.driver, REFERENCE, on)
    assert not [n for n in plan.names if "persistence mode back" in n]
    # no driver loaded yet: the reboot and the unit's ExecStartPost see to it
    fresh = plan_of(driver_stage.driver, REFERENCE, fresh_box("ubuntu2404"))
    assert not [n for n in fresh.names if "persistence mode back" in n]
