"""Stage plans against fake facts: pyinfra's @fake connector answers each fact command with a
canned output (facts in), and the operations' commands are collected without executing
anything (commands out). This is the Ubuntu 24.04 path's coverage: the sandbox runs Debian."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from helpers import REFERENCE as REFERENCE  # the plan tests import it from here
from pyinfra.api import Config, Host, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.context import ctx_host, ctx_inventory, ctx_state

from gpubox import catalog
from gpubox.base import layout
from gpubox.config import HostConfig, Target, load_host_config, target_for
from gpubox.knowledge import apt_versions
from gpubox.rules import offers

FACTS = Path(__file__).parent / "facts"

V100_LSPCI = [
    "0000:01:00.0 VGA compatible controller [0300]: NVIDIA Corporation GK208B [GeForce GT 710]"
    " [10de:128b] (rev a1)",
    "0000:01:00.1 Audio device [0403]: NVIDIA Corporation GK208 HDMI/DP Audio Controller"
    " [10de:0e0f] (rev a1)",
    "0000:05:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 32GB]"
    " [10de:1db5] (rev a1)",
    "0000:06:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 SXM2 32GB]"
    " [10de:1db5] (rev a1)",
]

# gpubox.rules.desktop's fact on a server (tests/ops/facts/README.md): multi-user.target, no display
# manager, the deploy's own ssh session (a tty, remote, no seat), the NVIDIA devices with no
# driver bound yet.
SERVER_DESKTOP_STATE = (FACTS / "desktop-state-server").read_text().splitlines()

# gpubox.base.kernels.KERNEL_METAS_COMMAND on a fresh Ubuntu 24.04 server: the GA kernel's image
# meta at the version of the running 6.8.0-88 kernel (Ubuntu's linux-meta source, noble-updates).
KERNEL_METAS = {"ubuntu2404": ["linux-image-generic\t6.8.0-88.89\tii "]}

OS_FAMILY = {"ubuntu2404": ("ubuntu", "24.04", "noble"), "debian12": ("debian", "12", "bookworm")}


# NCCL builds NVIDIA's CUDA repository carries, as public install scripts name them with
# `apt-get install libnccl2=... libnccl-dev=...` (2.25.1-1+cuda12.8, 2.26.2-1+cuda12.8,
# 2.32.3-1+cuda12.9); the catalog's pattern *+cuda12.8 resolves to 2.26.2-1+cuda12.8.
NCCL_OFFERED = ("2.25.1-1+cuda12.8", "2.26.2-1+cuda12.8", "2.32.3-1+cuda12.9")


def repo_answers(os_name: str) -> dict[object, object]:
    """What the repositories offer (gpubox.rules.offers' query): every catalog pin, and the driver
    roots of each branch at its package version, as NVIDIA's repositories carry them."""
    if os_name not in OS_FAMILY:
        return {}
    family, version_id, codename = OS_FAMILY[os_name]
    cat = catalog.load()
    cuda_repo = []
    for branch, info in cat["driver"]["branches"].items():
        pv = info["package_version"][family]
        for group in cat["driver"]["packages"][family].values():
            for name in group:
                cuda_repo.append(f"P {name.format(branch=branch, version=info['version'])} {pv}")
    cuda_repo += [
        f"P {c['package']} {c['package_version']}" for c in cat["cuda"]["versions"].values()
    ]
    cuda_repo += [f"P {n} {cat['dcgm']['version']}" for n in cat["dcgm"]["packages"]]
    cuda_repo += [f"P {n} {v}" for n in ("libnccl2", "libnccl-dev") for v in NCCL_OFFERED]
    toolkit = [
        f"P {n} {cat['container_toolkit']['version']}" for n in cat["container_toolkit"]["packages"]
    ]
    values = {"os_id": family, "version_id": version_id, "codename": codename}
    docker = [f"P {n} {v.format(**values)}" for n, v in cat["docker"]["packages"].items()]
    return {
        "gpubox-apt-query nvidia_cuda": cuda_repo,
        "gpubox-apt-query nvidia_container_toolkit": toolkit,
        "gpubox-apt-query docker": docker,
    }


def installed_pins(os_name: str, data: dict[str, object] = REFERENCE) -> list[str]:
    """`dpkg -l` lines of every package the deploy pins (gpubox.rules.offers.pinned_sets and the
    driver's roots), installed at its pin: what a converged box shows."""
    config, target = _config_target(os_name, data)
    driver = config.driver_packages(target.family)
    lines = [f"hi  {name}  {driver.package_version}  amd64  driver" for name in driver.installed]
    for pinned in offers.pinned_sets(config, target, {}):
        for n, v in pinned.packages.items():
            if apt_versions.is_pattern(v):  # NCCL's "*+cuda12.8": the build the repo gave
                v = apt_versions.newest(o for o in NCCL_OFFERED if fnmatchcase(o, v)) or v
            lines.append(f"hi  {n}  {v}  amd64  {pinned.stage}")
    return lines


def kept_offers(
    os_name: str, data: dict[str, object] = REFERENCE, files: dict[str, str] | None = None
) -> list[str]:
    """gpubox.preflight.answers' KeptOffers fact on a box that a deploy converged: the digests of
    the
    driver's pin file and blacklist (``files``: path -> text; default: the ones the
    repositories' answers give) and the answers the first deploy kept (repo_answers)."""
    import hashlib

    from gpubox.plans import driver as driver_plan
    from gpubox.preflight import answers

    config, target = _config_target(os_name, data)
    asked = answers.questions(config, target, offers.pinned_sets(config, target, {}))
    replies = repo_answers(os_name)
    indexes = {q.repo: offers.parse_query(replies[f"gpubox-apt-query {q.repo}"]) for q in asked}
    if files is None:
        plan = driver_plan.plan(config, target, indexes["nvidia_cuda"].offers)
        files = {layout.DRIVER_PIN: plan.pin, layout.UNATTENDED_BLACKLIST: plan.unattended}
    text = answers.to_keep(answers.Kept(), asked, indexes)
    assert text is not None
    return [f"D {path} {hashlib.sha256(t.encode()).hexdigest()}" for path, t in files.items()] + [
        "K",
        text,
    ]


def _config_target(os_name: str, data: dict[str, object]) -> tuple[HostConfig, Target]:
    family, version_id, _ = OS_FAMILY[os_name]
    config = load_host_config("box", data)
    target = target_for({"ID": family, "VERSION_ID": version_id}, config.catalog)
    assert target is not None
    return config, target


# The running kernels of the plan tests and their headers' versions in the archive (Ubuntu's
# linux source versions X.Y.Z-ABI.UPLOAD, its HWE builds ~24.04.N; Debian's the upstream
# version), and the archive's index line (apt-cache policy's source line).
HEADERS_VERSION = {
    "6.8.0-88-generic": "6.8.0-88.89",
    "6.14.0-36-generic": "6.14.0-36.36~24.04.1",
    "6.1.0-26-amd64": "6.1.112-1",
}
INDEX_LINE = {
    "generic": "http://archive.ubuntu.com/ubuntu noble-updates/main amd64 Packages",
    "amd64": "http://deb.debian.org/debian bookworm/main amd64 Packages",
}


def headers_query(release: str) -> str:
    """The key of gpubox.base.kernels.headers_query_command for the running kernel's headers."""
    return f"apt-cache policy linux-headers-{release}"


def headers_answer(release: str, offered: bool = True) -> list[str]:
    """Its answer on a box with package lists: `apt-cache policy` as apt 2.x prints it
    (tests/fixtures/apt/apt-cache-policy_linux-headers_debian12_local.txt: a candidate from the
    archive's index; nothing at all for a package the index no longer has)."""
    if not offered:
        return ["## lists"]
    version = HEADERS_VERSION[release]
    return [
        "## lists",
        f"linux-headers-{release}:",
        "  Installed: (none)",
        f"  Candidate: {version}",
        "  Version table:",
        f"     {version} 500",
        f"        500 {INDEX_LINE[release.rsplit('-', 1)[1]]}",
    ]


def fresh_box(os_name: str, **overrides: object) -> dict[object, object]:
    """Fact answers of a freshly installed box of ``os_name`` (ubuntu2404, debian12, ...)."""
    release = str(overrides.get("uname -r", "6.8.0-88-generic"))
    answers: dict[object, object] = {
        # the box's apt has lists and offers the running kernel's headers
        headers_query(release): headers_answer(release),
        "cat /etc/os-release": (FACTS / f"os-release-{os_name}").read_text().splitlines(),
        "lspci -Dnn -d 10de:": V100_LSPCI,
        "mokutil --sb-state": "SecureBoot disabled",
        "id -u": "0",
        "uname -r": "6.8.0-88-generic",
        "uname -s": "Linux",
        "command -v useradd": "/usr/sbin/useradd",
        "apt-mark showhold": [],
        "cat /sys/module/nvidia/version": {
            "stdout": [
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                "Make sure that the latest NVIDIA driver is installed and running."
            ]
        },
        "test -d /sys/module/nouveau": "no",
        "grep -qw contrib": "no",
        **repo_answers(os_name),
        # gpubox.base.kernels: the running kernel, no other, no dkms yet
        "for f in /boot/vmlinuz-*": ["R 6.8.0-88-generic"],
        "'linux-image-*'": KERNEL_METAS.get(os_name, []),
        # gpubox.rules.desktop: a server, not a desktop
        "echo '## default-target'": SERVER_DESKTOP_STATE,
        # gpubox.infra.runfile: no runfile driver (its command prints nothing on a clean box)
        "/var/lib/nvidia/log": [],
    }
    answers.update(overrides)
    return answers


@dataclass
class FakeHost:
    state: State
    host: Host


@dataclass
class Plan:
    ops: list[tuple[str, list[str]]]
    conditional: set[str]  # names of the operations that run only `_if` a condition holds

    @property
    def commands(self) -> list[str]:
        return [c for _, cmds in self.ops for c in cmds]

    def op(self, pattern: str) -> list[str]:
        """The commands of the one operation whose name matches ``pattern``."""
        found = [cmds for name, cmds in self.ops if re.search(pattern, name)]
        assert len(found) == 1, f"{len(found)} operations match {pattern!r}: {self.names}"
        return found[0]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.ops]

    def installs(self) -> list[str]:
        """Every package argument of every `apt-get install` command, in order."""
        out: list[str] = []
        for command in self.commands:
            if command.startswith("if "):  # a shell script (a repair), not an apt operation
                continue
            if " install " in command and "apt-get" in command and " -s " not in command:
                words = shlex.split(command.split(" install ", 1)[1])
                out += [w for w in words if not w.startswith("-")]
        return out


@contextmanager
def fake_host(data: dict[str, object], answers: dict[object, object]) -> Iterator[FakeHost]:
    """pyinfra's state for one @fake host ("box") with host data ``data``, whose facts are
    ``answers``: connected, and its contexts entered for the block."""
    inventory = Inventory(
        (
            [
                (
                    "@fake/box",
                    {**data, "fake_responses": answers, "fake_delay": 0, "fake_delay_jitter": 0},
                )
            ],
            {},
        )
    )
    state = State(inventory, Config())
    connect_all(state)
    (host,) = list(inventory)
    with ctx_state.use(state), ctx_inventory.use(inventory), ctx_host.use(host):
        yield FakeHost(state, host)


def make_plan(stage, data: dict[str, object], answers: dict[object, object]) -> Plan:
    ops: list[tuple[str, list[str]]] = []
    conditional: set[str] = set()
    with fake_host(data, answers) as fake:
        stage()
        for op_hash in fake.state.get_op_order():
            meta = fake.state.op_meta[op_hash]
            data_for_host = fake.state.get_op_data_for_host(fake.host, op_hash)
            commands = [str(c) for c in data_for_host.command_generator()]
            name = ", ".join(sorted(meta.names))
            ops.append((name, commands))
            if data_for_host.global_arguments.get("_if"):
                conditional.add(name)
    return Plan(ops, conditional)


@pytest.fixture
def plan_of():
    return make_plan


def spy_commands(monkeypatch: pytest.MonkeyPatch, connector: type) -> list[str]:
    """Every command ``connector`` is sent from now on (facts and operations alike)."""
    sent: list[str] = []
    real = connector.run_shell_command

    def spy(self, command, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(str(command))
        return real(self, command, *args, **kwargs)

    monkeypatch.setattr(connector, "run_shell_command", spy)
    return sent


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every command the fake box is sent (facts and operations alike)."""
    from pyinfra.connectors.fake import FakeConnector

    return spy_commands(monkeypatch, FakeConnector)


# The plan tests run without the read-ahead (gpubox.infra.readahead): run_stages would otherwise
# wrap pyinfra's Host for the rest of the process and keep the fake hosts' fact commands in
# the user's cache. tests/ops/test_readahead.py turns it on for its own runs.
os.environ["GPUBOX_READAHEAD"] = "0"


def unit_state(unit: str, active: str = "active") -> dict[str, str]:
    """The answer to gpubox.knowledge.reads.UNIT_STATES for one unit (the backend's, read at plan
    time):
    systemctl show's block, keyed by the end of its command."""
    return {
        f"ActiveState,UnitFileState {unit}": (
            f"Id={unit}.service\nLoadState=loaded\nActiveState={active}\nUnitFileState=enabled"
        )
    }
