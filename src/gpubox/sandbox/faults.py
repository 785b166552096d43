"""The faults a test plants in a running sandbox box, and what takes them back.

Hardware faults (a GPU missing or unbound, an NVLink port down, persistence reading Off) are
edits of the stand-in GPUs' state file (``plant_fault``; ``clear_faults`` restores the box's
reference hardware); the MOK screen of the next boot is answered with ``mok_screen`` and
played by the supervisor before the box boots again (``firmware_at_boot``). The firmware and
desktop faults (issue 16): Secure Boot, the DKMS signing key enrolled, a graphical desktop
with a logged-in session, a runfile driver; and a driver build whose module the kernel
refuses at boot (module-refuses, issue 30: an edit of the state too).

What the box cannot have is a stand-in (the firmware's EFI variables and MOK screen, the GT
710's nouveau, the kernel's signature check: standin/, STANDINS.md); everything else a fault
plants is real and done in the box over SSH: the DKMS key pair made by the box's openssl with
Debian's dkms command, systemd's graphical target, a display manager unit, a real logind
session through PAM. Configuration faults (a stopped service, a removed hold, ...) are planted
over SSH by the tests themselves: they are the box's."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpubox.sandbox import fleet, runfile_standin, standin
from gpubox.sandbox.box_ssh import ssh
from gpubox.sandbox.common import SandboxError
from gpubox.sandbox.processes import box_info
from gpubox.sandbox.rootfs import in_box, reference_hardware
from gpubox.sandbox.standin import state as standin_state

# Runs a shell command in the box: (command, stdin) -> the finished process.
Run = Callable[[str, str | None], subprocess.CompletedProcess[str]]

# Debian's dkms 3.0.10 (dkms.in prepare_signing; Debian 12 dkms 3.0.10-8+deb12u1): its key pair
# when framework.conf sets none, and the command that makes it when either file is missing.
DKMS_KEY = "/var/lib/dkms/mok.key"
DKMS_CERT = "/var/lib/dkms/mok.pub"
DKMS_KEYGEN = (
    'openssl req -new -x509 -nodes -days 36500 -subj "/CN=DKMS module signing key" '
    f"-newkey rsa:2048 -keyout {DKMS_KEY} -outform DER -out {DKMS_CERT}"
)

# What the faults leave in the box, so that clear_faults undoes exactly that.
MARKER_DIR = "/var/lib/gpubox-standin/faults"

DESKTOP_USER = "owner"
SESSION_UNIT = "gpubox-standin-desktop-session.service"
# GNOME's gdm.service.in at tag 46.2 (GNOME/gdm data/gdm.service.in; Ubuntu 24.04 ships gdm3
# 46.x), its meson variables filled as guessed for Ubuntu's build (VT 1, plymouth-quit.service,
# /etc/default/locale). Changed for the stand-in: ExecStart runs a sleeper instead of
# /usr/sbin/gdm3, and BusName= is dropped (it would make systemd wait, Type=dbus, for a bus
# name the sleeper never takes). Ubuntu's packaging changes to the unit, if any, are not in it.
GDM_UNIT = """\
# gpubox sandbox stand-in (never shipped to a real box): GNOME's gdm.service (GNOME/gdm 46.2
# data/gdm.service.in) with a sleeper for gdm3 and without BusName= (STANDINS.md).
[Unit]
Description=GNOME Display Manager

# replaces the getty
Conflicts=getty@tty1.service
After=getty@tty1.service

# replaces plymouth-quit since it quits plymouth on its own
Conflicts=plymouth-quit.service
After=plymouth-quit.service

# Needs all the dependencies of the services it's replacing
# pulled from getty@.service and plymouth-quit.service
# (except for plymouth-quit-wait.service since it waits until
# plymouth is quit, which we do)
After=rc-local.service plymouth-start.service systemd-user-sessions.service

# GDM takes responsibility for stopping plymouth, so if it fails
# for any reason, make sure plymouth still stops
OnFailure=plymouth-quit.service

[Service]
ExecStart=/bin/sleep infinity
KillMode=mixed
Restart=always
IgnoreSIGPIPE=no
EnvironmentFile=-/etc/default/locale
ExecReload=/bin/kill -SIGHUP $MAINPID
KeyringMode=shared

[Install]
Alias=display-manager.service
"""
# The owner's graphical session: a real logind session opened through PAM (pam_systemd reads
# the XDG_* variables systemd puts into the PAM environment), as gdm opens one for a user who
# logs in to GNOME on Wayland. No VT number: logind refuses one on a seat without VTs (a
# container's seat0).
SESSION_UNIT_TEXT = f"""\
# gpubox sandbox stand-in (never shipped to a real box): {DESKTOP_USER}'s graphical session,
# a real logind session (Type wayland, Class user, seat0) opened through PAM (STANDINS.md).
[Unit]
Description=gpubox sandbox stand-in: {DESKTOP_USER}'s GNOME on Wayland session
After=systemd-user-sessions.service systemd-logind.service gdm.service
Wants=gdm.service

[Service]
User={DESKTOP_USER}
PAMName=login
Environment=XDG_SESSION_TYPE=wayland XDG_SESSION_CLASS=user XDG_SEAT=seat0 \
XDG_SESSION_DESKTOP=ubuntu XDG_CURRENT_DESKTOP=ubuntu:GNOME
ExecStart=/bin/sleep infinity
Restart=on-failure

[Install]
WantedBy=graphical.target
"""


def _check(result: subprocess.CompletedProcess[str], what: str) -> str:
    if result.returncode != 0:
        raise SandboxError(
            f"in the box: {what} failed ({result.returncode}):\n{result.stderr}{result.stdout}"
        )
    return result.stdout


def _marker(run: Run, name: str, text: str = "") -> None:
    _check(run(f"mkdir -p {MARKER_DIR} && cat > {MARKER_DIR}/{name}", text), f"marker {name}")


# --------------------------------------------------------------------------- Secure Boot


def dkms_certificate(run: Run, create: bool) -> bytes | None:
    """The box's DKMS certificate (DER), made first as Debian's dkms 3.0.10 makes it when
    ``create`` and either file of the pair is missing (dkms regenerates both then)."""
    exists = run(f"test -f {DKMS_KEY} && test -f {DKMS_CERT}", None).returncode == 0
    if not exists:
        if not create:
            return None
        _check(run(f"mkdir -p /var/lib/dkms && {DKMS_KEYGEN} >/dev/null 2>&1", None), "openssl")
        _marker(run, "dkms-key")
    return base64.b64decode(_check(run(f"base64 -w0 {DKMS_CERT}", None), "reading mok.pub"))


def plant_secure_boot(state: dict[str, Any], run: Run, enrolled: bool) -> dict[str, Any]:
    """Secure Boot on; with ``enrolled`` the box's DKMS key is in MokListRT too."""
    standin_state.set_secure_boot(state, True)
    if enrolled:
        der = dkms_certificate(run, create=True)
        assert der is not None
        standin_state.enroll_certificate(state, der)
    return state


# --------------------------------------------------------------------------- desktop


def plant_desktop(run: Run) -> None:
    """A graphical desktop's system side: graphical.target by default, a display manager
    (gdm.service, aliased display-manager.service) running, the owner logged in to a Wayland
    session on seat0 (a real logind session: libpam-systemd is installed from Debian's mirror
    when missing), and nouveau driving the GT 710 (standin boot-modules) until a boot finds it
    blacklisted (the state's display_driver, set and saved by the caller first). Everything is
    enabled: it survives the box's reboot."""
    script = f"""set -e
if ! dpkg-query -W -f='${{Status}}' libpam-systemd 2>/dev/null | grep -q 'ok installed'; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpam-systemd >/dev/null
    touch {MARKER_DIR}/desktop-libpam-systemd
fi
id -u {DESKTOP_USER} >/dev/null 2>&1 || {{ useradd -m -s /bin/bash {DESKTOP_USER}; \
touch {MARKER_DIR}/desktop-user; }}
cat > /etc/systemd/system/gdm.service <<'EOF'
{GDM_UNIT}EOF
cat > /etc/systemd/system/{SESSION_UNIT} <<'EOF'
{SESSION_UNIT_TEXT}EOF
systemctl get-default > {MARKER_DIR}/desktop-default-target
systemctl daemon-reload
systemctl set-default graphical.target >/dev/null 2>&1
systemctl enable gdm.service {SESSION_UNIT} >/dev/null 2>&1
systemctl start gdm.service {SESSION_UNIT}
systemctl restart gpubox-standin-boot-modules.service
for i in $(seq 50); do
    loginctl list-sessions --no-legend | grep -q ' {DESKTOP_USER} ' && exit 0
    sleep 0.1
done
echo "no logind session for {DESKTOP_USER}" >&2; loginctl list-sessions >&2; exit 1
"""
    _check(run(f"mkdir -p {MARKER_DIR}", None), "mkdir")
    _check(run("bash -s", script), "planting the desktop")


def clear_script() -> str:
    """Undo what the faults planted in the box (their markers say what): the desktop's
    units, target, user and libpam-systemd, the DKMS key pair the enrolled fault made."""
    return f"""set -e
m={MARKER_DIR}
if [ -f /etc/systemd/system/{SESSION_UNIT} ]; then
    systemctl disable --now {SESSION_UNIT} gdm.service >/dev/null 2>&1 || true
    rm -f /etc/systemd/system/{SESSION_UNIT} /etc/systemd/system/gdm.service
    if [ -f $m/desktop-default-target ]; then
        systemctl set-default "$(cat $m/desktop-default-target)" >/dev/null 2>&1
    fi
    systemctl daemon-reload
fi
if [ -f $m/desktop-user ]; then
    loginctl terminate-user {DESKTOP_USER} >/dev/null 2>&1 || true
    for i in $(seq 50); do pgrep -u {DESKTOP_USER} >/dev/null || break; sleep 0.1; done
    userdel -r {DESKTOP_USER} >/dev/null 2>&1 || true
fi
if [ -f $m/desktop-libpam-systemd ]; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq libpam-systemd >/dev/null
fi
if [ -f $m/dkms-key ]; then rm -f {DKMS_KEY} {DKMS_CERT}; fi
rm -rf $m
rm -rf /sys/module/nouveau
"""


# --------------------------------------------------------------------------- runfile


def plant_runfile(root: Path, version: str | None = None) -> list[str]:
    """NVIDIA's .run installer's leftovers (gpubox.sandbox.runfile_standin); the paths
    planted."""
    return runfile_standin.plant(root) if version is None else runfile_standin.plant(root, version)


# --------------------------------------------------------------------------- planting


# The faults ``plant_fault`` knows: name -> what it does.
FAULTS = {
    "gpu-missing": "GPU --gpu (default 1) falls off the bus: gone from lspci and nvidia-smi",
    "gpu-unbound": "GPU --gpu (default 1) stays on the bus but the driver does not bind it",
    "nvlink-down": "NVLink port --link (default 2) of GPU --gpu (default 0) and its peer go down",
    "persistence-off": "persistence mode reads Off even while nvidia-persistenced keeps it on",
    "secure-boot": "UEFI Secure Boot on, the DKMS signing key not enrolled (stand-in mokutil)",
    "secure-boot-enrolled": "Secure Boot on and the box's DKMS key (/var/lib/dkms/mok.pub, "
    "made as Debian's dkms makes it when missing) enrolled long ago",
    "desktop": "a graphical desktop: graphical.target, gdm.service (display-manager.service) "
    "running, user owner logged in to a Wayland session on seat0, nouveau driving the GT 710",
    "runfile-driver": "what NVIDIA's .run installer leaves: its files and nvidia-uninstall",
    "module-refuses": "from the next boot the kernel refuses the nvidia module of driver "
    "--version (modprobe: Exec format error): nothing loaded, nvidia-smi fails",
    "server-frozen": "the watchdog's API server frozen (SIGSTOP) each time a start of it answers "
    "/health 200, so the watchdog restarts it again and again (a transient unit in the box, "
    "gpubox-standin-freeze-server); --off or clear ends it and lets the server go on",
    "volume-full": "the box's model volume (box 3's model_dir, a small filesystem of its own) "
    "filled to 95 %; --off or clear empties it",
    "unreachable": "the box cut from box 1's namespace: its bridged sshd and exporters answer "
    "nothing there (box 2 and up); --off or clear bridges it again",
}
# The faults --off takes back one by one (clear takes back every fault).
OFF = ("gpu-missing", "gpu-unbound", "nvlink-down", "persistence-off", *list(FAULTS)[-3:])
FREEZER_UNIT = "gpubox-standin-freeze-server"
FREEZER_PATH = "/usr/local/lib/gpubox-standin/freeze-server"


def hardware_state(info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The box's stand-in hardware state (standin/STATE.md), read from its root filesystem."""
    info = info or box_info()
    return standin_state.load_state(in_box(Path(info["rootfs"]), standin.STATE_PATH))


def save_hardware_state(new: dict[str, Any], info: dict[str, Any] | None = None) -> None:
    """Replace the box's stand-in hardware state (atomic; the stand-ins see it at once)."""
    info = info or box_info()
    standin_state.save_state(new, in_box(Path(info["rootfs"]), standin.STATE_PATH))


def _runner(info: dict[str, Any]) -> Callable[[str, str | None], subprocess.CompletedProcess[str]]:
    return lambda command, stdin: ssh(command, check=False, timeout=600, info=info, input=stdin)


def plant_fault(
    name: str,
    gpu: int | None = None,
    link: int | None = None,
    info: dict[str, Any] | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """Plant a fault (one of FAULTS) in the running box; returns the new stand-in state.

    Faults add up; ``clear_faults()`` restores the reference hardware and undoes what the
    firmware and desktop faults planted in the box. Configuration faults (a stopped service, a
    removed hold, ...) are planted over SSH instead: they are the box's. ``version``: the
    runfile driver's version (runfile-driver), the refused module's driver version
    (module-refuses, required)."""
    info = info or box_info()
    current = hardware_state(info)
    if name == "gpu-missing":
        standin_state.set_gpu_present(current, 1 if gpu is None else gpu, False)
    elif name == "gpu-unbound":
        standin_state.set_gpu_driver_bound(current, 1 if gpu is None else gpu, False)
    elif name == "nvlink-down":
        standin_state.set_link_active(
            current, 0 if gpu is None else gpu, 2 if link is None else link, False
        )
    elif name == "persistence-off":
        standin_state.set_persistence_forced_off(current, True)
    elif name in ("secure-boot", "secure-boot-enrolled"):
        plant_secure_boot(current, _runner(info), enrolled=name == "secure-boot-enrolled")
    elif name == "desktop":
        standin_state.set_display_driver(current, "nouveau")
        save_hardware_state(current, info)
        plant_desktop(_runner(info))
    elif name == "runfile-driver":
        plant_runfile(Path(info["rootfs"]), version)
    elif name == "module-refuses":
        if not version:
            raise SandboxError("fault module-refuses needs the driver version: --version V")
        standin_state.refuse_module(current, version)
    elif name == "server-frozen":
        freeze_server(info)
    elif name == "volume-full":
        fleet.fill_model_volume(info)
    elif name == "unreachable":
        fleet.cut(info.get("box", 1))
    else:
        raise SandboxError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    save_hardware_state(current, info)
    return current


def freeze_server(info: dict[str, Any]) -> None:
    """The server-frozen fault: freeze_server.py started in the box as a transient unit."""
    script = (Path(__file__).parent / "freeze_server.py").read_text()
    directory = FREEZER_PATH.rsplit("/", 1)[0]
    _check(
        ssh(f"mkdir -p {directory} && cat > {FREEZER_PATH}", check=False, info=info, input=script),
        "writing the freezer",
    )
    command = (
        f"systemctl stop {FREEZER_UNIT} 2>/dev/null; systemctl reset-failed {FREEZER_UNIT} "
        f"2>/dev/null; systemd-run --quiet --collect --unit={FREEZER_UNIT} "
        f"--property=RuntimeMaxSec=3600 /usr/bin/python3 {FREEZER_PATH}"
    )
    _check(ssh(command, check=False, timeout=60, info=info), f"starting {FREEZER_UNIT}")


def unfreeze_server(info: dict[str, Any]) -> None:
    """The server-frozen fault taken back: the freezer stopped (it lets the server go on)."""
    ssh(f"systemctl stop {FREEZER_UNIT} 2>/dev/null || true", check=False, info=info)


def clear_fault(
    name: str,
    gpu: int | None = None,
    link: int | None = None,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Take back one fault (one of OFF) and leave the others; returns the stand-in state."""
    if name not in OFF:
        raise SandboxError(f"fault {name} has no --off: take it back with clear")
    info = info or box_info()
    current = hardware_state(info)
    if name == "gpu-missing":
        standin_state.set_gpu_present(current, 1 if gpu is None else gpu, True)
    elif name == "gpu-unbound":
        standin_state.set_gpu_driver_bound(current, 1 if gpu is None else gpu, True)
    elif name == "nvlink-down":
        standin_state.set_link_active(
            current, 0 if gpu is None else gpu, 2 if link is None else link, True
        )
    elif name == "persistence-off":
        standin_state.set_persistence_forced_off(current, False)
    elif name == "server-frozen":
        unfreeze_server(info)
        return current
    elif name == "volume-full":
        fleet.empty_model_volume(info)
        return current
    elif name == "unreachable":
        fleet.restore(info.get("box", 1))
        return current
    save_hardware_state(current, info)
    return current


def clear_faults(info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Restore the reference hardware (standin.state.default_state(), without EFI), undo
    what the secure-boot-enrolled and desktop faults planted in the box (the runfile-driver
    fault's files stay: a fresh box has none), and take back the fleet's faults (the frozen
    server, the filled model volume, the box cut from box 1's view)."""
    info = info or box_info()
    fresh = reference_hardware(info.get("box", 1))
    save_hardware_state(fresh, info)
    if info.get("cut"):
        fleet.restore(info.get("box", 1))
    if info.get("model_volume"):
        fleet.empty_model_volume(info)
    if in_box(Path(info["rootfs"]), FREEZER_PATH).exists():
        unfreeze_server(info)
    if Path(info["rootfs"], MARKER_DIR.lstrip("/")).exists():
        ssh("bash -s", timeout=600, info=info, input=clear_script())
    return fresh


def mok_screen(
    answer: str, password: str | None = None, info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What someone at the console does at the box's next boot's MOK screen: "enroll" with
    the password given to ``mokutil --import`` (pending keys become enrolled when it matches;
    a wrong one enrolls nothing), or "timeout" (nobody answers: the request is discarded, as
    MokManager does after about 10 s). It takes effect when the box boots again (a test then
    runs ``systemctl reboot`` and ``wait_ready(since_boot_id=...)``); a reboot without an
    answer is a timeout. Returns the new stand-in state."""
    info = info or box_info()
    current = hardware_state(info)
    try:
        standin_state.mok_screen(current, answer, password)
    except ValueError as exc:
        raise SandboxError(str(exc)) from exc
    save_hardware_state(current, info)
    return current


def firmware_at_boot(rootfs: Path) -> str | None:
    """What the box's firmware does before the OS boots again: shim's MOK screen (applies the
    answer ``mok_screen`` prepared, or times out). Run by the supervisor before a reboot."""
    path = in_box(rootfs, standin.STATE_PATH)
    try:
        current = standin_state.load_state(path)
    except (OSError, ValueError):
        return None
    outcome = standin_state.apply_mok_screen(current)
    if outcome is not None:
        standin_state.save_state(current, path)
    return outcome
