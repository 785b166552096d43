"""A desktop is a desktop: what a box shows on its display, and what the deploy will do to it.

The driver stage blacklists nouveau, leaves a display card that the pinned branch cannot drive
on the firmware framebuffer, and reboots when the loaded driver is not the installed one. On a
desktop (a display manager, a graphical session, or nouveau driving an NVIDIA card) the owner
is told so before the first change (``report``), and the reboot waits for their consent while
someone is logged in to a graphical session (key ``allow_desktop_reboot``).

Pure: the fact's sectioned output in (``parse_desktop``), lines out. The fact itself is
gpubox.infra.host_facts.DesktopState; its command is DESKTOP_COMMAND.

A default target of graphical.target alone does not make a desktop: it is systemd's own
default (the systemd package links default.target to graphical.target), so servers that never
had a display manager report it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpubox import parsers
from gpubox.base import compat, layout
from gpubox.config import HostConfig
from gpubox.parsers import LoginSession, PciKernelDevice, UnitState

# One command, every part exiting 0: each section starts with a "## " line.
DESKTOP_COMMAND = (
    "echo '## default-target'; systemctl get-default 2>/dev/null; "
    "echo '## display-manager'; "
    "systemctl show -p Id -p LoadState -p ActiveState -p SubState display-manager.service "
    "2>/dev/null; "
    "for s in $(loginctl list-sessions --no-legend 2>/dev/null | awk '{print $1}'); do "
    'echo "## session $s"; '
    'loginctl show-session "$s" -p Id -p Name -p Seat -p Type -p Class -p State -p Remote '
    "2>/dev/null; done; "
    "echo '## nvidia-devices'; "
    "if command -v lspci >/dev/null 2>&1; then lspci -Dnnk -d 10de: 2>/dev/null; else "
    "for d in /sys/bus/pci/devices/*; do "
    '[ "$(cat $d/vendor 2>/dev/null)" = 0x10de ] || continue; '
    "c=$(cut -c3-6 $d/class); v=$(cut -c3- $d/vendor); i=$(cut -c3- $d/device); "
    'echo "${d##*/} Class [$c]: NVIDIA Corporation Device [$v:$i]"; '
    '[ -e $d/driver ] && echo "	Kernel driver in use: $(basename $(readlink $d/driver))"; '
    "done; fi; true"
)

DISPLAY_CLASS = "0300"  # VGA compatible controller: a card with outputs


@dataclass(frozen=True)
class Desktop:
    default_target: str | None = None
    display_manager: UnitState | None = None  # display-manager.service, resolved
    sessions: tuple[LoginSession, ...] = ()
    cards: tuple[PciKernelDevice, ...] = ()  # NVIDIA devices with the driver bound to each

    @property
    def display_manager_unit(self) -> str | None:
        """The unit display-manager.service resolves to (gdm.service), None without one."""
        dm = self.display_manager
        return dm.id if dm is not None and dm.exists else None

    @property
    def graphical_sessions(self) -> list[LoginSession]:
        return [s for s in self.sessions if s.graphical]

    @property
    def users_at_the_display(self) -> list[LoginSession]:
        """Users logged in to a graphical session (the greeter is not one)."""
        return [s for s in self.sessions if s.user_at_the_display]

    @property
    def nouveau_cards(self) -> list[PciKernelDevice]:
        return [c for c in self.cards if c.driver == "nouveau"]

    @property
    def is_desktop(self) -> bool:
        """A display manager, a graphical session, or nouveau driving an NVIDIA card."""
        return bool(self.display_manager_unit or self.graphical_sessions or self.nouveau_cards)


def parse_desktop(lines: Iterable[str]) -> Desktop:
    """DESKTOP_COMMAND's output: its "## " sections, each read by its parser."""
    sections: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("## "):
            sections.append((line[3:].strip(), []))
        elif sections:
            sections[-1][1].append(line)
    target: str | None = None
    manager: UnitState | None = None
    sessions: list[LoginSession] = []
    cards: list[PciKernelDevice] = []
    for name, body in sections:
        text = "\n".join(body)
        if name == "default-target":
            target = parsers.parse_default_target(text)
        elif name == "display-manager":
            manager = parsers.parse_unit_state(text)
        elif name.startswith("session "):
            if text.strip():  # the session closed between the list and the show
                sessions.append(parsers.parse_login_session(text))
        elif name == "nvidia-devices":
            cards = parsers.parse_lspci_kernel(text)
    return Desktop(target, manager, tuple(sessions), tuple(cards))


def reboot_reason(driver_version: str, loaded: str | None, nouveau_loaded: bool) -> str | None:
    """Why the driver stage reboots (the loaded driver is not the installed one), or None."""
    if loaded == driver_version and not nouveau_loaded:
        return None
    if nouveau_loaded:
        return "nouveau is loaded"
    if loaded == "mismatch":
        return f"driver {driver_version} installed, a different driver loaded"
    if loaded:
        return f"driver {driver_version} installed, {loaded} loaded"
    return f"driver {driver_version} installed, no NVIDIA module loaded"


def who(sessions: Iterable[LoginSession]) -> str:
    """'alice (wayland on seat0, active)' for each session, joined."""
    return ", ".join(
        f"{s.name} ({s.type}{' on ' + s.seat if s.seat else ''}, {s.state})" for s in sessions
    )


def _card_name(card: PciKernelDevice) -> tuple[str, str | None]:
    """(what to call it, its architecture or None when gpubox does not know the card)."""
    d = card.device
    known = compat.pci_id_architecture(f"{d.vendor_id}:{d.device_id}")
    if known is None:
        return f"{d.slot} {d.description} [{d.vendor_id}:{d.device_id}]", None
    return f"{d.slot} {known[0]}", known[1]


def _oldest_driven(branch: int) -> str:
    """The oldest architecture that ``branch`` still drives ("Maxwell" for 570)."""
    for name in compat.ARCHITECTURES:
        if compat.branch_supports(name, branch):
            return name
    return "a newer architecture"


def report(
    config: HostConfig, desktop: Desktop, loaded: str | None, nouveau_loaded: bool
) -> list[str]:
    """What the driver stage will do to the display, in lines for the owner; [] on a box that
    is not a desktop (see Desktop.is_desktop)."""
    if not desktop.is_desktop:
        return []
    branch = config.branch
    seen = [f"default target {desktop.default_target or 'unknown'}"]
    unit = desktop.display_manager_unit
    if unit:
        state = desktop.display_manager.active_state if desktop.display_manager else ""
        seen.append(f"display manager {unit} ({state or 'state unknown'})")
    users = desktop.users_at_the_display
    if users:
        seen.append(f"logged in to a graphical session: {who(users)}")
    greeters = [s for s in desktop.graphical_sessions if s.klass == "greeter"]
    if greeters:
        seen.append(f"login screen: {who(greeters)}")
    lines = ["this box is a desktop: " + "; ".join(seen)]

    nouveau = desktop.nouveau_cards
    if nouveau:
        names = ", ".join(_card_name(c)[0] for c in nouveau)
        lines.append(
            f"nouveau drives {names}: the deploy blacklists nouveau ({layout.NOUVEAU_BLACKLIST}) "
            "and rebuilds the initramfs, so it no longer loads from the next boot"
        )
    for card in desktop.cards:
        if card.device.class_code != DISPLAY_CLASS:
            continue
        name, architecture = _card_name(card)
        if architecture is None:
            lines.append(
                f"{name} is a display card gpubox does not know: driver branch {branch} may or "
                "may not drive it; if not, it runs on the firmware framebuffer after the reboot"
            )
        elif compat.branch_supports(architecture, branch):
            lines.append(
                f"{name} ({architecture}) is a display card: after the reboot the NVIDIA driver "
                f"{config.driver_version} drives it"
            )
        else:
            last = compat.ARCHITECTURES[architecture].last_driver_branch
            lines.append(
                f"{name} ({architecture}) is a display card that driver branch {branch} does not "
                f"drive (its last branch is {last}): after the reboot it runs on the firmware "
                "framebuffer (firmware resolution, no acceleration). For an accelerated desktop, "
                "connect the monitor to the CPU's integrated graphics, or use a display card "
                f"branch {branch} drives ({_oldest_driven(branch)} or newer)"
            )

    reason = reboot_reason(config.driver_version, loaded, nouveau_loaded)
    if reason:
        when = f"a reboot at the end of the driver stage, after the driver is installed ({reason})"
        if not config.allow_reboot:
            lines.append(
                f"{when}: allow_reboot is false, so the deploy stops there; reboot the box "
                "yourself, then deploy again"
            )
        elif users and not config.allow_desktop_reboot:
            lines.append(
                f"{when}: {who(users)} is logged in, so the deploy installs the driver and stops "
                "before the reboot (allow_desktop_reboot is false): reboot when it suits them "
                '(sudo systemctl reboot), or set "allow_desktop_reboot": True; the next deploy '
                "continues"
            )
        else:
            ends = f"; it ends the session of {who(users)}" if users else ""
            lines.append(f"{when}: the deploy reboots the box{ends}")
    return lines


def stop_message(host: str, reason: str, users: list[LoginSession]) -> str:
    """The driver stage's stop before a reboot while users are logged in to the display."""
    return (
        f"{host}: the driver is installed and a reboot is needed ({reason}), but {who(users)} "
        "is logged in to a graphical session and allow_desktop_reboot is false, so gpubox does "
        "not reboot. Reboot when it suits them (sudo systemctl reboot on the box), or set "
        '"allow_desktop_reboot": True in the inventory; the next deploy continues from there'
    )


def local_stop_message(host: str, reason: str) -> str:
    """The driver stage's stop before a reboot when the deploy runs on the box itself
    (pyinfra's @local): a reboot would end the deploy that asked for it, mid-run."""
    return (
        f"{host}: the driver is installed and a reboot is needed ({reason}), but this deploy "
        "runs on the box itself (pyinfra's @local), and rebooting would end it mid-run. Reboot "
        "(sudo systemctl reboot), then run the deploy again; it continues from there"
    )
