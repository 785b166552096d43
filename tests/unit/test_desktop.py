"""A desktop is a desktop: the parsers of what a box shows on its display (real captures in
tests/fixtures, sources in tests/fixtures/SOURCES.md), the fact's one command run against
stand-in tools that print those captures, and the report's rules."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from gpubox import parsers
from gpubox.config import KEYS, load_host_config
from gpubox.parsers import ParseError
from gpubox.rules import desktop

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
OPS_FACTS = ROOT / "tests" / "ops" / "facts"
REFERENCE = {"gpu_model": "Tesla V100-SXM2-32GB", "gpu_count": 2}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- parsers


def test_lspci_k_reads_the_driver_in_use_and_the_modules():
    # pciutils 3.9.0 on the development VM: tabs, -D, Subsystem lines, no "Kernel modules"
    # (lspci could not load libkmod there)
    devices = parsers.parse_lspci_kernel(fixture("lspci/lspci-Dnnk_dev-vm_local.txt"))
    assert len(devices) == 6
    assert devices[0].driver is None  # the host bridge: no driver bound
    assert devices[1].device.slot == "0000:00:01.0"
    assert {d.driver for d in devices[1:]} == {"virtio-pci"}
    assert devices[1].modules == ()


def test_lspci_k_nouveau_in_use_and_an_nvidia_card_on_nvidia():
    (card,) = parsers.parse_lspci_kernel(fixture("lspci/lspci-nnk_9600GT_nouveau_ubuntuforums.txt"))
    assert (card.device.device_id, card.driver) == ("0622", "nouveau")
    assert card.modules == ("nvidia", "nvidiafb", "nouveau")
    # grep -A3's "--" between groups, spaces from the web page in another capture
    cards = parsers.parse_lspci_kernel(fixture("lspci/lspci-nnk_2xRTX3090_club3090-pr594.txt"))
    assert [(c.device.slot, c.driver) for c in cards] == [
        ("05:00.0", "nvidia"),
        ("05:00.1", "snd_hda_intel"),
        ("0a:00.0", "nvidia"),
        ("0a:00.1", "snd_hda_intel"),
    ]
    assert cards[0].modules == ("nvidiafb", "nouveau", "nvidia_drm", "nvidia")


def test_lspci_k_refuses_a_line_without_ids():
    with pytest.raises(ParseError, match="was -nn given"):
        parsers.parse_lspci_kernel("01:00.0 VGA compatible controller: NVIDIA Corporation GK208B")


def test_default_target():
    assert parsers.parse_default_target(
        fixture("systemd/systemctl-get-default_debian12_local.txt")
    ) == ("graphical.target")
    assert parsers.parse_default_target("") is None
    with pytest.raises(ParseError):
        parsers.parse_default_target("Failed to connect to bus: Host is down")


def test_show_session_reads_type_class_seat_state_in_any_order():
    session = parsers.parse_login_session(
        fixture("systemd/loginctl-show-session_x11_systemd-issue536.txt")
    )
    assert (session.id, session.name, session.type, session.klass, session.state) == (
        "1",
        "liveuser",
        "x11",
        "user",
        "active",
    )
    assert session.seat == "" and not session.remote  # that systemd printed no Seat= line
    assert session.user_at_the_display


@pytest.mark.parametrize(
    "props, at_the_display",
    [
        ("Id=2\nType=wayland\nClass=user\nState=active", True),
        ("Id=2\nType=x11\nClass=user\nState=online", True),  # switched away from, still there
        ("Id=c1\nType=wayland\nClass=greeter\nState=active", False),  # gdm's login screen
        ("Id=3\nRemote=yes\nType=tty\nClass=user\nState=active", False),  # ssh
        ("Id=4\nType=wayland\nClass=user\nState=closing", False),  # logging out
        ("Id=5\nType=unspecified\nClass=background\nState=active", False),
        ("Id=6\nType=wayland\nClass=user-early\nState=active", True),  # systemd 256 class
    ],
)
def test_who_counts_as_logged_in_to_the_display(props: str, at_the_display: bool):
    assert parsers.parse_login_session(props).user_at_the_display is at_the_display


def test_unit_state_of_an_alias_and_of_a_missing_unit():
    dm = parsers.parse_unit_state("Id=gdm.service\nLoadState=loaded\nActiveState=active")
    assert dm is not None and dm.exists and dm.active and dm.id == "gdm.service"
    none = parsers.parse_unit_state(
        "Id=display-manager.service\nLoadState=not-found\nActiveState=inactive\nSubState=dead"
    )
    assert none is not None and not none.exists
    assert parsers.parse_unit_state("") is None
    with pytest.raises(ParseError):
        parsers.parse_unit_state("Unit display-manager.service could not be found.")


# --------------------------------------------------------------------------- the fact's command


def stub(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_command(tmp_path: Path, tools: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """DESKTOP_COMMAND under bash, with only ``tools`` (stand-ins printing recorded outputs)
    and the basic utilities on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in tools.items():
        stub(bin_dir, name, script)
    for util in ("awk", "cat", "cut", "basename", "readlink"):
        found = subprocess.run(["sh", "-c", f"command -v {util}"], capture_output=True, text=True)
        if found.stdout.strip():
            os.symlink(found.stdout.strip(), bin_dir / util)
    return subprocess.run(
        ["/bin/bash", "-c", desktop.DESKTOP_COMMAND],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "LC_ALL": "C"},
    )


def test_the_command_reads_each_session_and_exits_0(tmp_path: Path):
    # list-sessions --no-legend: the rows of the recorded Ubuntu listing, legend dropped
    rows = fixture("systemd/loginctl-list-sessions_ubuntu-gdm_python-systemd-issue81.txt")
    rows = "\n".join(r for r in rows.splitlines()[1:] if r.strip() and "listed" not in r)
    reference = OPS_FACTS / "desktop-state-ubuntu2404-desktop"
    ref = desktop.parse_desktop(reference.read_text().splitlines())
    lspci = "\n".join(
        line for line in reference.read_text().split("## nvidia-devices\n", 1)[1].splitlines()
    )
    result = run_command(
        tmp_path,
        {
            "systemctl": 'case "$1" in get-default) echo graphical.target;; '
            "show) printf 'Id=gdm.service\\nLoadState=loaded\\nActiveState=active\\n"
            "SubState=running\\n';; esac\n",
            "loginctl": 'case "$1" in list-sessions) [ "$2" = --no-legend ] && cat <<EOF\n'
            + rows
            + '\nEOF\n;; show-session) case "$2" in 2) printf \'Id=2\\nName=hossein\\n'
            "Seat=seat0\\nRemote=no\\nType=wayland\\nClass=user\\nState=active\\n';; "
            "c1) printf 'Id=c1\\nName=gdm\\nSeat=seat0\\nRemote=no\\nType=wayland\\n"
            "Class=greeter\\nState=online\\n';; esac;; esac\n",
            "lspci": '[ "$1 $2 $3" = "-Dnnk -d 10de:" ] && cat <<EOF\n' + lspci + "\nEOF\n",
        },
    )
    assert result.returncode == 0, result.stderr
    seen = desktop.parse_desktop(result.stdout.splitlines())
    assert seen.default_target == "graphical.target"
    assert seen.display_manager_unit == "gdm.service"
    assert [(s.id, s.name, s.klass) for s in seen.sessions] == [
        ("2", "hossein", "user"),
        ("c1", "gdm", "greeter"),
    ]
    assert seen.cards == ref.cards and [c.driver for c in seen.nouveau_cards] == ["nouveau"]
    assert seen.is_desktop


def test_the_command_exits_0_on_a_box_without_systemd_loginctl_or_lspci(tmp_path: Path):
    result = run_command(tmp_path, {})
    assert result.returncode == 0
    seen = desktop.parse_desktop(result.stdout.splitlines())
    assert seen == desktop.Desktop() and not seen.is_desktop


# --------------------------------------------------------------------------- the report's rules


def config(**values: object):
    return load_host_config("box", {**REFERENCE, **values})


def reference_desktop() -> desktop.Desktop:
    return desktop.parse_desktop(
        (OPS_FACTS / "desktop-state-ubuntu2404-desktop").read_text().splitlines()
    )


def server() -> desktop.Desktop:
    return desktop.parse_desktop((OPS_FACTS / "desktop-state-server").read_text().splitlines())


def test_a_server_is_not_a_desktop_and_gets_no_lines():
    assert not server().is_desktop
    assert desktop.report(config(), server(), None, False) == []
    # graphical.target alone is systemd's default, not a desktop
    graphical = desktop.Desktop(default_target="graphical.target", cards=server().cards)
    assert desktop.report(config(), graphical, None, False) == []


def test_the_reference_desktop_hears_the_blacklist_the_framebuffer_and_the_stop():
    lines = desktop.report(config(), reference_desktop(), None, True)
    assert len(lines) == 4
    assert "display manager gdm.service (active)" in lines[0]
    assert lines[1].startswith("nouveau drives 0000:01:00.0 GeForce GT 710: the deploy blacklists")
    assert "firmware framebuffer (firmware resolution, no acceleration)" in lines[2]
    assert "(Maxwell or newer)" in lines[2] and "its last branch is 470" in lines[2]
    assert "stops before the reboot (allow_desktop_reboot is false)" in lines[3]
    assert "sudo systemctl reboot" in lines[3]


def test_a_display_card_the_branch_drives_is_driven_after_the_reboot():
    line = "0000:01:00.0 VGA compatible controller [0300]: NVIDIA Corporation TU117 [10de:1f82]"
    card = parsers.parse_lspci_kernel(line + "\n\tKernel driver in use: nouveau")
    seen = desktop.Desktop(cards=tuple(card))
    lines = desktop.report(config(), seen, None, True)
    assert (
        "GeForce GTX 1650 (Turing) is a display card: after the reboot the NVIDIA driver "
        in (lines[2])
    )
    assert "the deploy reboots the box" in lines[-1] and "session" not in lines[-1]


def test_consent_and_allow_reboot_change_the_reboot_line():
    seen = reference_desktop()
    consent = desktop.report(config(allow_desktop_reboot=True), seen, None, True)[-1]
    assert consent.endswith(
        "the deploy reboots the box; it ends the session of owner (wayland on seat0, active)"
    )
    no_reboot = desktop.report(config(allow_reboot=False), seen, None, True)[-1]
    assert "allow_reboot is false, so the deploy stops there" in no_reboot
    loaded = desktop.report(config(), seen, "570.211.01", False)
    assert not [line for line in loaded if "reboot at the end" in line]


@pytest.mark.parametrize(
    "loaded, nouveau, reason",
    [
        ("570.211.01", False, None),
        ("570.211.01", True, "nouveau is loaded"),
        (None, False, "driver 570.211.01 installed, no NVIDIA module loaded"),
        ("580.105.08", False, "driver 570.211.01 installed, 580.105.08 loaded"),
        ("mismatch", False, "driver 570.211.01 installed, a different driver loaded"),
    ],
)
def test_reboot_reason(loaded, nouveau, reason):
    assert desktop.reboot_reason("570.211.01", loaded, nouveau) == reason


def test_the_stop_message_names_who_how_and_that_the_next_deploy_continues():
    users = reference_desktop().users_at_the_display
    text = desktop.stop_message("box", "nouveau is loaded", users)
    assert text.startswith("box: the driver is installed and a reboot is needed")
    assert "owner (wayland on seat0, active) is logged in" in text
    assert "sudo systemctl reboot" in text and '"allow_desktop_reboot": True' in text
    assert "the next deploy continues" in text


# --------------------------------------------------------------------------- the key


def test_allow_desktop_reboot_defaults_to_false_and_must_be_a_bool():
    assert config().allow_desktop_reboot is False
    from gpubox.config import validate

    _, problems = validate("box", {**REFERENCE, "allow_desktop_reboot": "yes"})
    assert [p.key for p in problems if p.severity == "error"] == ["allow_desktop_reboot"]


def test_docs_keys_is_gpubox_keys_markdown_with_a_row_for_every_key(capsys):
    """docs/keys.md's table is `gpubox keys --markdown`, whole (regenerate it after adding or
    changing a key in src/gpubox/config/keys.py)."""
    from gpubox import cli

    assert cli.main(["keys", "--markdown"]) == 0
    table = capsys.readouterr().out
    page = (ROOT / "docs" / "keys.md").read_text(encoding="utf-8")
    assert page.split("\n\n| key |", 1)[1].rstrip() == table.split("| key |", 1)[1].rstrip()
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", page, re.M)
    assert "allow_desktop_reboot" in rows
    assert rows == [k.name for k in KEYS]
