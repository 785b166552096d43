"""Stage: the NVIDIA driver at the catalog's exact version, from NVIDIA's CUDA repository.

Pinned (apt preferences), held, kept out of unattended-upgrades, proprietary or open kernel
modules as the GPUs need, nouveau blacklisted, persistence mode on, and a reboot only when
the loaded driver is not the installed one.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.connectors.local import LocalConnector
from pyinfra.facts.server import KernelVersion
from pyinfra.operations import apt, server

from gpubox import parsers
from gpubox.base import kernels, layout
from gpubox.base.errors import HostStopped
from gpubox.base.rendering import FILES, render
from gpubox.config import HostConfig, Target
from gpubox.infra import driver_rollback, operations, runfile
from gpubox.infra.host_facts import (
    CommandOutput,
    HeadersOffered,
    HeldPackages,
    KernelMetas,
    KernelModuleLoaded,
    KernelModules,
    LoadedDriver,
    MokKey,
    SecureBoot,
    read_once,
)
from gpubox.infra.operations import ManagedFiles
from gpubox.knowledge import reads, secure_boot
from gpubox.ops import units
from gpubox.ops.apt_repo import nvidia_repo
from gpubox.ops.driver_kept import installed_at_pin, keep_driver, kept_source
from gpubox.ops.packages import install_pinned
from gpubox.parsers.secure_boot import MokState
from gpubox.plans import driver as driver_plan
from gpubox.plans import driver_move
from gpubox.plans import driver_rollback as rollback_plan
from gpubox.preflight import answers, driver_kept, driver_replacement
from gpubox.preflight import gate as preflight
from gpubox.rules import desktop
from gpubox.rules import driver_rollback as moves
from gpubox.stages import current_config

# The paths under the names the plan tests use.
PIN_FILE = layout.DRIVER_PIN
UNATTENDED_FILE = layout.UNATTENDED_BLACKLIST
NOUVEAU_FILE = layout.NOUVEAU_BLACKLIST
PERSISTENCED_DROPIN = layout.PERSISTENCED_DROPIN
PERSISTENCED_WANTED = layout.PERSISTENCED_WANTED
# debconf's answer to Debian's legacy-GPU check ("false": no check), empty when unanswered.
LEGACY_CHECK = (
    "awk '/^Name: nvidia-driver\\/check-for-unsupported-gpu$/{f=1} f&&/^Value:/{print $2; exit} "
    "/^$/{f=0}' /var/cache/debconf/config.dat 2>/dev/null || true"
)


@deploy("NVIDIA driver")
def driver() -> None:
    config = current_config()
    target = preflight.run(config)
    mok = secure_boot_gate(config, target)
    display = preflight.desktop_report(config)  # a desktop's owner hears it before any change
    # The driver's packages are what NVIDIA's repository offers at the pinned version (asked
    # by preflight), never a list written in advance; with the box's kept build of that
    # version counted as offered (preflight merged it: the way back).
    p = driver_plan.plan(config, target, answers.answer("nvidia_cuda").offers)
    loaded = read_once(LoadedDriver)
    nouveau_loaded = read_once(KernelModuleLoaded, module="nouveau")
    reason = desktop.reboot_reason(config.driver_version, loaded, nouveau_loaded)
    users = display.users_at_the_display
    reboot = driver_move.reboot_action(
        reason,
        config.allow_reboot,
        issubclass(host.connector_cls, LocalConnector),
        bool(users),
        config.allow_desktop_reboot,
    )
    # Another driver build installed (Ubuntu's, Debian's, an older or newer one): say the move
    # and what goes, first.
    old = driver_replacement.warn_before_install(
        config,
        target,
        p,
        reboot=reboot,
        who=desktop.who(users),
        secure_boot_key=(mok.key, mok.certificate) if mok else None,
    )
    # The kernels' headers and modules, decided here (facts read before any change) so that a
    # running kernel whose headers the archive dropped is said before the first change.
    headers = kernel_headers_plan(config)
    kept = driver_kept.kept(config)
    # The first change: the build the move replaces, kept on the box (a way back without the
    # repository); nothing when it is kept already.
    for version, package_versions in old.items():
        if version not in kept.versions:
            keep_driver(
                name=f"Keep driver {version}'s packages before replacing it "
                f"({driver_move.kept_dir(version)})",
                version=version,
                package_versions=package_versions,
            )
    runfile.uninstall(config)  # runfile_driver: uninstall, before the stage's own changes

    managed = ManagedFiles(
        {
            layout.DRIVER_PIN: p.pin,
            layout.UNATTENDED_BLACKLIST: p.unattended,
            layout.NOUVEAU_BLACKLIST: (FILES / "blacklist-nouveau.conf").read_text(),
            layout.PERSISTENCED_DROPIN: render(
                "nvidia-persistenced.conf.j2", persistence_mode=config.persistence_mode
            ),
            layout.PERSISTENCED_WANTED: render("nvidia-persistenced-wanted.conf.j2"),
        }
    )
    pin = managed.put("Pin the NVIDIA driver to one exact version", layout.DRIVER_PIN)
    managed.put("Keep unattended-upgrades off the pinned driver", layout.UNATTENDED_BLACKLIST)
    source = kept_source(config, kept, install=bool(old) or not installed_at_pin(p))
    nvidia_repo(config, target, also_changed=[pin] + ([source] if source else []))

    if headers.packages:
        apt.packages(
            name="Install the kernel headers DKMS builds against (this kernel and the next ones "
            "of each series the box boots)",
            packages=headers.packages,
            no_recommends=True,
        )
    apt.packages(
        name="Remove packages that would pull another driver or module flavour",
        packages=p.forbidden + p.refused,
        present=False,
    )
    if target.family == "debian" and host.get_fact(CommandOutput, command=LEGACY_CHECK) != "false":
        # Debian's packaging (libcuda1 Pre-Depends nvidia-legacy-check) aborts the install when
        # it sees a GPU only a legacy driver supports, such as the reference box's GT 710
        # display card. Preflight already judges every GPU against the branch (a warning for a
        # card the branch does not drive), so its question is answered "no check".
        server.shell(
            name="Preseed Debian's legacy-GPU check (preflight judges the GPUs)",
            commands=[
                "echo 'nvidia-legacy-check nvidia-driver/check-for-unsupported-gpu boolean false'"
                " | debconf-set-selections"
            ],
        )
    install_pinned(
        f"Install NVIDIA driver {config.driver_version} ({config.driver_kernel_modules})",
        p.install,
        p.package_version,
        hold="Hold the driver packages",
        no_recommends=True,
    )
    operations.reinstall(
        name="Reinstall driver packages missing a file (nvidia-smi, the libraries)",
        packages=p.pinned,
    )
    lacking = headers.repair
    if lacking:
        server.shell(
            name=f"Build the NVIDIA module for every bootable kernel ({', '.join(lacking)})",
            commands=[kernels.repair_command(lacking)],
        )

    nouveau = managed.put("Blacklist nouveau", layout.NOUVEAU_BLACKLIST)
    # every installed kernel's: -u alone rebuilds only the newest one's (update-initramfs(8):
    # "-k all" operates on all installed kernel versions), and booting another would load nouveau
    server.shell(
        name="Rebuild the initramfs without nouveau",
        commands=["update-initramfs -u -k all"],
        _if=nouveau.did_change,
    )

    mode = "on" if config.persistence_mode else "off"
    dropin = managed.put(
        f"nvidia-persistenced: persistence mode {mode}", layout.PERSISTENCED_DROPIN
    )
    wanted = managed.put("Start nvidia-persistenced at boot", layout.PERSISTENCED_WANTED)
    units.reload_units(dropin, wanted)

    if reboot == "stop-allow-reboot":
        operations.fail(
            name="Stop: a reboot is needed",
            message=f"{host.name}: a reboot is needed ({reason}) and allow_reboot is false: "
            "reboot the box, then run the deploy again",
        )
        raise HostStopped(f"{host.name}: stopped before the reboot ({reason}), allow_reboot")
    elif reboot == "stop-local" and reason:
        # pyinfra runs on the box itself: a reboot would end this run, the owner reboots.
        operations.fail(
            name="Stop before the reboot: the deploy runs on this box (@local)",
            message=desktop.local_stop_message(host.name, reason),
        )
        raise HostStopped(f"{host.name}: stopped before the reboot ({reason}), @local")
    elif reboot == "stop-desktop" and reason:
        # Someone is at the display: the driver is installed, the reboot is theirs to time.
        operations.fail(
            name="Stop before the reboot: a user is logged in to a graphical session",
            message=desktop.stop_message(host.name, reason, users),
        )
        raise HostStopped(f"{host.name}: stopped before the reboot ({reason})")
    elif reboot == "reboot" and reason:
        operations.reboot_and_wait(
            name=f"Reboot to load the driver ({reason})",
            reason=reason,
            timeout=config.reboot_timeout,
        )
        # a move from a loaded driver: its checks now, the way back if they fail
        verify_after_move(config, loaded, p, old, kept)

    # its unit is static (no [Install]): boot pulls it in through the wanted drop-in
    units.keep_running(layout.PERSISTENCED, "nvidia-persistenced", dropin, enabled=None)
    if loaded == config.driver_version and not nouveau_loaded:
        # Persistence switched by hand since (nvidia-smi -pm): set it back on the running
        # driver; after a start or a reboot the drop-in's ExecStartPost does it.
        want = "Enabled" if config.persistence_mode else "Disabled"
        try:  # the checks' own read of the GPUs (gpubox.knowledge.reads.GPU_QUERY)
            gpus = reads.GPU_QUERY.parse(
                host.get_fact(CommandOutput, command=reads.GPU_QUERY.command_for())
            )
        except parsers.ParseError:  # nvidia-smi failed: nothing to set back
            gpus = []
        modes = [g.get("persistence_mode") for g in gpus]
        if any(m in ("Enabled", "Disabled") and m != want for m in modes):
            server.shell(
                name=f"GPUs' persistence mode back {mode} (nvidia-smi -pm)",
                commands=[f"nvidia-smi -pm {1 if config.persistence_mode else 0}"],
                _if=lambda: not dropin.did_change(),
            )
    answers.keep_answers()  # this run's answers, kept (only if they changed)


def kernel_headers_plan(config: HostConfig) -> kernels.HeadersPlan:
    """The headers to install and the kernels to build the module for; the running kernel's
    headers are asked of the box's apt first (gpubox.base.kernels.headers_plan), and the owner
    is warned when the archive no longer has them."""
    release = host.get_fact(KernelVersion)
    state = host.get_fact(KernelModules)
    package = kernels.headers_question(
        release, state, config.driver_version, config.driver_kernel_headers
    )
    plan = kernels.headers_plan(
        release,
        state,
        host.get_fact(KernelMetas) if config.driver_kernel_headers else None,
        config.driver_version,
        config.driver_kernel_headers,
        host.get_fact(HeadersOffered, package=package) if package else None,
    )
    if plan.warning:
        logger.warning(f"{host.name}: {plan.warning}")
    return plan


def secure_boot_gate(config: HostConfig, target: Target) -> MokState | None:
    """With Secure Boot on, the module DKMS builds must be signed by an enrolled key
    (gpubox.knowledge.secure_boot): go on, refuse, or create the key if missing and stop before the
    driver with the enrollment steps (HostStopped: the operations so far run, then the stop).
    Returns the key's state when Secure Boot is on and the stage goes on, else None."""
    enabled = read_once(SecureBoot)
    if not enabled:
        return None
    state: MokState = read_once(MokKey, family=target.family)
    decision = secure_boot.gate(host.name, target.family, enabled, state, config.driver_version)
    for warning in decision.warnings:
        logger.warning(f"preflight warning: {warning}")
    if decision.action == "go":
        return state
    text = "\n".join(decision.lines)
    if decision.action == "refuse":
        preflight.refuse(f"preflight failed, nothing was changed:\n  - {config.host}: {text}")
    logger.warning(f"{host.name}: Secure Boot: stopping before the driver (steps below)")
    tools = (["mokutil"] if decision.install_mokutil else []) + (
        ["openssl"] if decision.create_key else []
    )
    if tools:
        apt.packages(
            name=f"Install {' and '.join(tools)} (Secure Boot key enrollment)",
            packages=tools,
            no_recommends=True,
        )
    if decision.create_key:
        server.shell(
            name="Create DKMS's module signing key (as the distribution's dkms would)",
            commands=[decision.create_key],
        )
    operations.fail(
        name="Stop: enroll DKMS's signing key (Secure Boot)",
        message=text,
    )
    raise HostStopped(f"{host.name}: Secure Boot: enroll DKMS's signing key first")


def verify_after_move(
    config: HostConfig,
    loaded: str | None,
    p: driver_plan.DriverPlan,
    old: dict[str, list[str]],
    kept: driver_move.KeptState,
) -> None:
    """After the reboot of a move from loaded driver ``loaded`` to the pinned one: the driver
    checks against the box's state before the move (read now, before any change), and the
    automatic rollback to ``loaded``'s kept packages when they fail (key driver_rollback;
    gpubox.infra.driver_rollback). ``loaded`` is kept when it is already (``kept``) or when
    this run keeps it first (``old``: the builds the move replaces). Its reboot is allowed
    where the move's was: it is planned only after the move's own reboot."""
    new = config.driver_version
    if not loaded or loaded == "mismatch" or loaded == new:
        return  # a first install, or a reboot that is no move: nothing to go back to
    before = moves.state_before(
        loaded,
        read_once(CommandOutput, command=reads.GPU_QUERY.command_for()),
        read_once(CommandOutput, command=reads.NVLINK_STATUS.command_for()),
    )
    kept_dir = driver_move.kept_dir(loaded)
    back = (
        f'To go back, set "driver_branch" to {loaded.split(".")[0]} (or "driver_version" to '
        f'"{loaded}") in the inventory and deploy again'
    )
    script = None
    is_kept = loaded in kept.versions or loaded in old
    if not config.driver_rollback:
        where = f"kept in {kept_dir}" if is_kept else "not kept"
        no_rollback = (
            f"driver_rollback is false: the box stays on {new}, failing; {loaded}, the driver "
            f"before, is {where}. {back}"
        )
    elif not is_kept:
        logger.warning(
            f"{host.name}: the driver moves from {loaded} to {new}, and {loaded} is not kept "
            f"({kept_dir}): no automatic rollback is possible if {new} fails its checks after "
            "the reboot"
        )
        no_rollback = f"No rollback was possible: driver {loaded} is not kept in {kept_dir}. {back}"
    else:
        # the pin file kept with it: the kept one, or the one on the box that this run keeps
        pin = f"{kept_dir}/apt-preferences" if loaded in kept.versions else layout.DRIVER_PIN
        blacklist = rollback_plan.blacklist_for_pin(read_once(CommandOutput, command=f"cat {pin}"))
        # apt's marks before the move come back with the kept packages
        auto = read_once(CommandOutput, command="apt-mark showauto").split()
        script = rollback_plan.script(
            loaded, p.package_version, blacklist, held=read_once(HeldPackages), auto=auto
        )
        no_rollback = ""
    driver_rollback.verify_driver_move(
        name=f"Check driver {new} after the reboot"
        + (f", back to {loaded} if it fails (driver_rollback)" if script else ""),
        old=loaded,
        new=new,
        before=before,
        rollback=script,
        no_rollback=no_rollback,
        timeout=config.reboot_timeout,
    )
