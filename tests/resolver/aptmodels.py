"""The apt worlds the resolver tier runs in: the distribution's real archive (recorded stanzas,
tests/fixtures/apt/) plus a model of NVIDIA's CUDA repository built here from those stanzas.

Every deliberate difference from the real packages is written down in
tests/fixtures/apt/README.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aptsim import Action, AptRoot, Repo, Result, Stanza, read_stanzas
from helpers import REFERENCE

from gpubox.config import HostConfig, Target, load_host_config, target_for
from gpubox.parsers.apt import format_stanza, format_stanzas
from gpubox.plans import driver as driver_plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "apt"

NVIDIA_ORIGIN, NVIDIA_LABEL = "NVIDIA", "NVIDIA CUDA"

# Ubuntu: NVIDIA's builds are modelled on Ubuntu's newest real 580 build (Ubuntu's own 570 is
# only stubs). Debian: on Debian's real 535 build of bookworm.
UBUNTU_TEMPLATE = ("580", "580.178.04", "580.178.04-0ubuntu0.24.04.1")
DEBIAN_TEMPLATE = ("535", "535.261.03", "535.261.03-1")

# What the model repositories carry: the catalog's 570 and 580, an older 570 and a newer 580.
UBUNTU_DRIVERS = ("570.195.03-0ubuntu1", "570.211.01-0ubuntu1", "580.105.08-0ubuntu1")
UBUNTU_NEWEST = "580.126.09-1ubuntu1"  # NVIDIA's revision scheme from 580.126.09 on
DEBIAN_DRIVERS = ("570.195.03-1", "570.211.01-1", "580.105.08-1")
DEBIAN_NEWEST = "580.126.09-1"

CUDA_TOOLKIT = "12.8.1-1"

# The rest of the system, modelled: every package the recorded and modelled stanzas a test
# installs depend on outside them, installed at the release's version (its dpkg status stanza
# carries no relations, so nothing else is pulled in). Provides where a dependency names a
# virtual package.
BASE = {
    "ubuntu": """
        adduser 3.137ubuntu1
        dpkg-dev 1.22.6ubuntu6.1
        gcc 4:13.2.0-7ubuntu1
        gcc-13 13.3.0-6ubuntu2~24.04
        kmod 31+20240202-2ubuntu7.1
        lsb-release 12.0-2
        libc6 2.39-0ubuntu8.4
        libdrm2 2.4.122-1~ubuntu0.24.04.1
        libgbm1 24.2.8-1ubuntu1~24.04.1
        libgcc-s1 14.2.0-4ubuntu2~24.04
        libncursesw6 6.4+20240113-1ubuntu2
        libnvidia-egl-wayland1 1:1.1.13-1build1
        libpciaccess0 0.17-3ubuntu0.24.04.2
        libssl3t64 3.0.13-0ubuntu3.5
        libsystemd0 255.4-1ubuntu8.6
        libtinfo6 6.4+20240113-1ubuntu2
        libwayland-client0 1.22.0-2.1build1
        libwayland-server0 1.22.0-2.1build1
        libx11-6 2:1.8.7-1build1
        libx11-xcb1 2:1.8.7-1build1
        libxcb-dri3-0 1.15-1ubuntu2
        libxcb-present0 1.15-1ubuntu2
        libxcb1 1.15-1ubuntu2
        libxext6 2:1.3.4-1build2
        make 4.3-4.1build2
        ocl-icd-libopencl1 2.3.2-1build1
        patch 2.7.6-7build3
        xserver-xorg-core 2:21.1.12-1ubuntu1.4 xorg-video-abi-25
    """,
    "debian": """
        adduser 3.134
        debconf 1.5.82 debconf-2.0
        dpkg 1.21.22
        dpkg-dev 1.21.22
        gcc 4:12.2.0-3
        init-system-helpers 1.65.2
        kmod 30+20221128-1
        lsb-release 12.0-1
        libc6 2.36-9+deb12u10
        libgcc-s1 12.2.0-14+deb12u1
        libncursesw6 6.4-4
        libssl3 3.0.17-1~deb12u2
        libsystemd0 252.38-1~deb12u1
        libtinfo6 6.4-4
        libtirpc3 1.3.3+ds-1
        make 4.3-4.1
        ocl-icd-libopencl1 2.3.1-1
        patch 2.7.6-7
        pciutils 1:3.9.0-4
    """,
}


def base_status(family: str) -> list[Stanza]:
    """The modelled base system as dpkg status stanzas."""
    out = []
    for line in BASE[family].split("\n"):
        if not line.strip():
            continue
        name, version, *provides = line.split()
        fields = f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
        if provides:
            fields += f"Provides: {', '.join(provides)}\n"
        out.append(Stanza.parse(fields).as_installed())
    return out


# A desktop's NVIDIA-named packages that are not driver builds (their own sources), and what
# they depend on outside the recorded stanzas (versions from noble as remembered, modelled: only
# that each relation is satisfied matters).
DESKTOP_SOURCES = {"egl-wayland", "egl-gbm", "egl-x11", "nvidia-settings", "nvidia-prime"}
DESKTOP_RELEASE = {  # each at its noble release version, from the recorded and written stanzas
    "libnvidia-egl-wayland1": "1:1.1.13-1build1",
    "libnvidia-egl-gbm1": "1.1.1-1",
    "libnvidia-egl-xcb1": "1.0.0-1",
    "libnvidia-egl-xlib1": "1.0.0-1",
    "nvidia-settings": "510.47.03-0ubuntu4",
    "nvidia-prime": "0.8.17.2",
}
DESKTOP_DEPENDS = """
    libcairo2 1.18.0-3build1
    libgdk-pixbuf-2.0-0 2.42.10+dfsg-3ubuntu3
    libglib2.0-0t64 2.80.0-6ubuntu1
    libgtk-3-0t64 3.24.41-4ubuntu1
    libjansson4 2.14-2build2
    libpango-1.0-0 1.52.1+ds-1build1
    libpangocairo-1.0-0 1.52.1+ds-1build1
    libvdpau1 1.5-2build1
    libxnvctrl0 510.47.03-0ubuntu4
    libxxf86vm1 1:1.1.4-1build4
    pkg-config 1.8.1-2build1
    screen-resolution-extra 0.18.3ubuntu0.24.04.1
"""


def fixture(name: str) -> list[Stanza]:
    return read_stanzas((FIXTURES / name).read_text())


def by_suite(stanzas: Iterable[Stanza]) -> dict[str, list[Stanza]]:
    """Recorded stanzas grouped by the suite they were recorded from."""
    suites: dict[str, list[Stanza]] = {}
    for s in stanzas:
        suite = s.get("X-Recorded-From", "").split("/")[0]
        suites.setdefault(suite, []).append(s)
    return suites


def _reversion(stanza: Stanza, template: tuple[str, str, str], version: str) -> Stanza:
    """A stanza of the template build rewritten for another driver version: the version
    string, the upstream version inside names and relations, the branch in names (Ubuntu's
    suffixes) and in ``(>= branch)`` relations, and the pool path."""
    branch, upstream, full = template
    new_upstream = version.split("-")[0]
    new_branch = new_upstream.split(".")[0]
    text = format_stanza(stanza).replace(full, version).replace(upstream, new_upstream)
    text = re.sub(rf"-{branch}(?=$|[-_/\s,:)])", f"-{new_branch}", text, flags=re.M)
    text = text.replace(f"(>= {branch})", f"(>= {new_branch})")
    return Stanza.parse(text).replace(Origin=None, Bugs=None, X_Recorded_From=None)


def _meta(name: str, version: str, depends: str, source: str = "cuda-drivers") -> Stanza:
    return Stanza.parse(
        f"Package: {name}\nSource: {source}\nVersion: {version}\nArchitecture: amd64\n"
        f"Maintainer: cudatools <cudatools@nvidia.com>\nDepends: {depends}\n"
        f"Filename: pool/{name}_{version}_amd64.deb\nSize: 2048\nSection: devel\n"
    )


def _cuda_toolkit() -> list[Stanza]:
    """cuda-toolkit-12-8 and a few of its parts: a toolkit, no driver."""
    parts = ("cuda-compiler-12-8", "cuda-libraries-12-8", "cuda-tools-12-8")
    out = [
        _meta(
            "cuda-toolkit-12-8",
            CUDA_TOOLKIT,
            ", ".join(f"{p} (>= 12.8.1)" for p in parts),
            source="cuda-toolkit-12-8",
        )
    ]
    out += [_meta(p, CUDA_TOOLKIT, "cuda-toolkit-config-common", source=p) for p in parts]
    out.append(_meta("cuda-toolkit-config-common", "12.8.90-1", "libc6", source="cuda-config"))
    return out


# -- Ubuntu 24.04 --------------------------------------------------------------------------


def ubuntu_archive() -> list[Repo]:
    suites = by_suite(
        fixture("ubuntu-noble-nvidia.Packages") + fixture("ubuntu-noble-desktop-extra.Packages")
    )
    return [
        Repo(f"ubuntu-{suite}", "Ubuntu", "Ubuntu", suite, tuple(_downloadable(s) for s in stanzas))
        for suite, stanzas in suites.items()
    ]


def _downloadable(stanza: Stanza) -> Stanza:
    """A stanza recorded without Filename and Size (egl-wayland's) gets placeholders: apt
    plans no install of a version it cannot download."""
    if stanza.get("Filename"):
        return stanza
    version = stanza.version.split(":")[-1]
    arch = stanza.get("Architecture", "")
    return stanza.replace(Filename=f"pool/{stanza.package}_{version}_{arch}.deb", Size="4096")


def desktop_status() -> list[Stanza]:
    """Ubuntu's modelled base plus a desktop's NVIDIA-named packages that are not driver builds,
    installed at their release versions as their real (recorded or written) stanzas."""
    status = {s.package: s for s in base_status("ubuntu")}
    for line in DESKTOP_DEPENDS.split("\n"):
        if line.strip():
            name, version = line.split()
            status[name] = Stanza.parse(
                f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
            ).as_installed()
    status["python3"] = Stanza.parse(  # nvidia-prime: Depends python3:any
        "Package: python3\nVersion: 3.12.3-0ubuntu2\nArchitecture: amd64\nMulti-Arch: allowed\n"
    ).as_installed()
    archive = fixture("ubuntu-noble-nvidia.Packages") + fixture(
        "ubuntu-noble-desktop-extra.Packages"
    )
    for name, version in DESKTOP_RELEASE.items():
        (stanza,) = [s for s in archive if s.package == name and s.version == version]
        status[name] = stanza.as_installed()
    return list(status.values())


def ubuntu_template() -> list[Stanza]:
    """Ubuntu's real non-server 580 build, the stanzas NVIDIA's builds are modelled on."""
    _, _, full = UBUNTU_TEMPLATE
    return [
        s
        for s in fixture("ubuntu-noble-nvidia.Packages")
        if s.source == "nvidia-graphics-drivers-580" and s.version == full
    ]


def nvidia_ubuntu2404(drop: Iterable[tuple[str, str]] = ()) -> Repo:
    """Model of NVIDIA's ubuntu2404 repository (flat, Origin NVIDIA, Label NVIDIA CUDA).

    ``drop``: (package, version) pairs left out (a repository that lacks a root)."""
    stanzas = [
        _reversion(s, UBUNTU_TEMPLATE, v)
        for v in (*UBUNTU_DRIVERS, UBUNTU_NEWEST)
        for s in ubuntu_template()
    ]
    newest = UBUNTU_NEWEST.split("-")[0]
    stanzas += [
        _meta("cuda-drivers-570", "570.211.01-1", "nvidia-driver-570 (>= 570.211.01)"),
        _meta("cuda-drivers-580", "580.126.09-1", f"nvidia-driver-580 (>= {newest})"),
        _meta("cuda-drivers", "580.126.09-1", "cuda-drivers-580 (= 580.126.09-1)"),
        *_cuda_toolkit(),
    ]
    stanzas = [s for s in stanzas if (s.package, s.version) not in set(drop)]
    return Repo("nvidia-ubuntu2404", NVIDIA_ORIGIN, NVIDIA_LABEL, "/", tuple(stanzas))


# -- Debian 12 -----------------------------------------------------------------------------


def debian_archive() -> list[Repo]:
    suites = by_suite(fixture("debian-bookworm-nvidia.Packages"))
    release = {  # Origin and Label as Debian's Release files carry them
        "bookworm": ("Debian", "Debian", False),
        "bookworm-security": ("Debian", "Debian-Security", False),
        "bookworm-backports": ("Debian Backports", "Debian Backports", True),
    }
    return [
        Repo(f"debian-{suite}", *release[suite][:2], suite, tuple(stanzas), release[suite][2])
        for suite, stanzas in suites.items()
    ]


def debian_template() -> list[Stanza]:
    """Debian's real 535 build of bookworm: every binary package of nvidia-graphics-drivers."""
    _, _, full = DEBIAN_TEMPLATE
    return [
        s
        for s in fixture("debian-bookworm-nvidia.Packages")
        if s.source == "nvidia-graphics-drivers" and s.version == full
    ]


def _debian_recorded(package: str, version: str) -> Stanza:
    (found,) = [
        s
        for s in fixture("debian-bookworm-nvidia.Packages")
        if s.package == package and s.version == version
    ]
    return found


def _debian_build(version: str) -> list[Stanza]:
    """One NVIDIA debian12 driver build: Debian's source re-versioned, plus what Debian does
    not ship (nvidia-driver-cuda, nvidia-kernel-open-dkms) and NVIDIA's own builds of
    nvidia-persistenced and nvidia-modprobe at the driver's version."""
    upstream = version.split("-")[0]
    out = [_reversion(s, DEBIAN_TEMPLATE, version) for s in debian_template()]
    dkms = next(s for s in out if s.package == "nvidia-kernel-dkms")
    out = [s.replace(Conflicts="nvidia-kernel-open-dkms") if s is dkms else s for s in out]
    out.append(
        dkms.replace(
            Package="nvidia-kernel-open-dkms",
            Source="nvidia-open-gpu-kernel-modules",
            Provides=f"nvidia-open-kernel-{upstream}, nvidia-kernel-dkms-any (= {upstream})",
            Conflicts="nvidia-kernel-dkms",
            Filename=f"pool/nvidia-kernel-open-dkms_{version}_amd64.deb",
        )
    )
    exact = ", ".join(
        f"{name} (= {version})"
        for name in (  # the same guess as the sandbox's stand-in (gpubox/sandbox/repo_driver.py)
            "nvidia-smi",
            "libcuda1",
            "libnvidia-ml1",
            "libnvidia-cfg1",
            "libnvidia-ptxjitcompiler1",
            "nvidia-persistenced",
            "nvidia-modprobe",
        )
    )
    out.append(
        Stanza.parse(
            f"Package: nvidia-driver-cuda\nSource: nvidia-graphics-drivers\nVersion: {version}\n"
            f"Architecture: amd64\nMaintainer: cudatools <cudatools@nvidia.com>\n"
            f"Depends: {exact}\n"
            f"Recommends: nvidia-kernel-dkms (= {version})"
            f" | nvidia-kernel-open-dkms (= {version})\n"
            f"Filename: pool/nvidia-driver-cuda_{version}_amd64.deb\nSize: 2048\n"
            "Section: non-free/libs\n"
        )
    )
    for name, recorded in (
        ("nvidia-persistenced", "535.171.04-1~deb12u1"),
        ("nvidia-modprobe", "535.309.01-0+deb12u1"),
    ):
        out.append(
            _debian_recorded(name, recorded).replace(
                Version=version,
                Filename=f"pool/{name}_{version}_amd64.deb",
                X_Recorded_From=None,
                Origin=None,
            )
        )
    return out


def nvidia_debian12(drop: Iterable[tuple[str, str]] = ()) -> Repo:
    """Model of NVIDIA's debian12 repository (flat, Origin NVIDIA, Label NVIDIA CUDA)."""
    stanzas = [s for v in (*DEBIAN_DRIVERS, DEBIAN_NEWEST) for s in _debian_build(v)]
    stanzas += [
        _meta(
            "cuda-drivers-570",
            "570.211.01-1",
            "nvidia-driver-cuda (>= 570.211.01), "
            "nvidia-kernel-dkms (>= 570.211.01) | nvidia-kernel-open-dkms (>= 570.211.01)",
        ),
        _meta(
            "cuda-drivers-580",
            DEBIAN_NEWEST,
            "nvidia-driver-cuda (>= 580.126.09), "
            "nvidia-kernel-dkms (>= 580.126.09) | nvidia-kernel-open-dkms (>= 580.126.09)",
        ),
        _meta("cuda-drivers", DEBIAN_NEWEST, f"cuda-drivers-580 (= {DEBIAN_NEWEST})"),
        *_cuda_toolkit(),
    ]
    stanzas = [s for s in stanzas if (s.package, s.version) not in set(drop)]
    return Repo("nvidia-debian12", NVIDIA_ORIGIN, NVIDIA_LABEL, "/", tuple(stanzas))


# -- the worlds the tests run in ---------------------------------------------------------

OS_RELEASE = {
    "ubuntu": {"ID": "ubuntu", "VERSION_ID": "24.04"},
    "debian": {"ID": "debian", "VERSION_ID": "12"},
}


def host_config(**data: Any) -> HostConfig:
    return load_host_config("resolver-box", {**REFERENCE, **data})


@dataclass
class World:
    """One distribution's private apt root: its archive plus the model of NVIDIA's
    repository, and the modelled base system."""

    family: str
    root: AptRoot
    nvidia: Repo
    target: Target
    _index: str = ""  # the model repository's Packages text, made once

    def reset(self) -> None:
        self.root.set_status(base_status(self.family))
        self.root.set_pin(None)

    def plan(self, config: HostConfig, nvidia: Repo | None = None) -> driver_plan.DriverPlan:
        """driver_plan.plan with ``offered`` computed from the repository's index, as the
        driver stage's fact computes it from the host's."""
        if nvidia is None:
            if not self._index:
                self._index = format_stanzas(self.nvidia.stanzas)
            index = self._index
        else:
            index = format_stanzas(nvidia.stanzas)
        install, _ = driver_plan.roots(config, self.family)
        offered = driver_plan.offered_from_stanzas(
            index,
            driver_plan.package_version(config, self.family),
            install,
        )
        return driver_plan.plan(config, self.target, offered)

    def install(self, plan: driver_plan.DriverPlan) -> Result:
        """The driver stage's install command, simulated."""
        return self.root.simulate(
            "install",
            "--no-install-recommends",
            "--allow-downgrades",
            *[f"{name}={plan.package_version}" for name in plan.install],
        )

    def origin(self, action: Action) -> str:
        repo, _ = self.root.find(action.package, action.version)
        return repo.origin

    def source(self, action: Action) -> str:
        _, stanza = self.root.find(action.package, action.version)
        return stanza.source


def build_world(family: str, path: Path) -> World:
    root = AptRoot(path)
    if family == "ubuntu":
        repos = [*ubuntu_archive(), nvidia_ubuntu2404()]
    else:
        repos = [*debian_archive(), nvidia_debian12()]
    for repo in repos:
        root.add_repo(repo)
    root.update()
    config = load_host_config("resolver-box", REFERENCE)
    target = target_for(OS_RELEASE[family], config.catalog)
    assert target is not None
    return World(family, root, repos[-1], target)
