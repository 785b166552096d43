"""The sandbox box's lifecycle: a Debian 12 systemd host in systemd-nspawn, reached over SSH.

Up to four boxes at once (identity.py: the ``Box``, and which box a process works on), each in
its own network namespace (``gpubox-sandbox``, ``gpubox-sandbox-2``, ...): sshd, the stand-in
NVIDIA repository and a bridge to the host's Debian mirror all listen on 127.0.0.1 *inside*
that namespace, so nothing touches the host's network and nothing clashes with it. pyinfra
and pytest reach the boxes by running inside box 1's namespace (``gpubox sandbox exec --``),
where box k's sshd is bridged too.

Lifecycle (this module ties the parts together):

``up``   root filesystem from the cache (rootfs.py: debootstrap once per recipe hash, then a
         fresh ``cp -a`` per box, prepared for the box), netns, mirror bridge (socat host <->
         unix socket <-> socat in the netns), stand-in repository server (repo.py, which also
         serves the catalog's llama.cpp sdist as a PyPI mirror would and a tiny GGUF model:
         llamacpp.py, tinymodel.py), a Hugging Face Hub and PyPI mirror (hub.py, pypi.py: the
         tiny model for the real hf tool, and the wheels of hf and modelscope), a ModelScope
         mirror over HTTPS (modelscope_mirror.py: the tiny model for the real modelscope
         tool, its CA in the box's root filesystem), nspawn under a supervisor
         (supervisor.py) that boots the box again when it exits with 133 (the box ran
         ``reboot``), with the host's compiler cache bind-mounted at CCACHE_DIR; wait until
         systemd says running (box_ssh.py).
``down`` orderly poweroff (SIGTERM to nspawn, SIGKILL after 30 s), then every process we
         started, by PID (never by name: the box's processes are visible on the host), then
         the netns; checks that no process, mount or namespace is left behind (processes.py).

Everything we start is recorded in ``<state dir>/box.json`` with its PID and kernel start time,
so a recycled PID is never signalled. The faults a test plants: faults.py; the container
images built in the box: images.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from gpubox.sandbox import (
    fleet,
    hub,
    kernel,
    llamacpp,
    modelscope_mirror,
    onepanel,
    pypi,
    repo_build,
    repo_index,
    tinymodel,
)
from gpubox.sandbox.box_ssh import (
    ensure_key,
    failed_units,
    ssh,
    wait_ready,
    write_ssh_config,
)
from gpubox.sandbox.common import (
    HUB_PORT,
    MODELSCOPE_PORT,
    SandboxError,
    cache_dir,
    debian_mirror,
)
from gpubox.sandbox.identity import (
    MAX_BOXES,
    SSH_HOST,
    SSH_USER,
    Box,
    current,
    netns_argv,
)
from gpubox.sandbox.images import CHECK_IMAGE, EXPORTER_IMAGE
from gpubox.sandbox.processes import (
    alive,
    box_info,
    box_init,
    box_pid_namespace,
    listening,
    lock,
    mounts_under,
    nspawn_full_record,
    nspawn_record,
    processes_in_namespace,
    read_state,
    retire_state,
    send_signal,
    spawn,
    spawn_helper,
    spawn_server,
    stop,
    wait_for,
    wait_gone,
    write_state,
)
from gpubox.sandbox.rootfs import (
    Progress,
    clean_old_boxes,
    ensure_rootfs,
    host_port,
    prepare_box_rootfs,
    quiet,
    stderr_progress,
)
from gpubox.sandbox.supervisor import CCACHE_DIR, nspawn_argv

REPO_PORT = 8765
STOP_TIMEOUT_S = 30.0

# Host commands and the Debian package that provides each.
HOST_COMMANDS = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "dpkg-deb": "dpkg",
    "dpkg-divert": "dpkg",
    "dpkg-scanpackages": "dpkg-dev",
    "apt-ftparchive": "apt-utils",
    "gpg": "gnupg",
    "gpgconf": "gnupg",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "ip": "iproute2",
    "socat": "socat",
}


def check_host() -> None:
    """Root and the host packages the sandbox needs; names the apt packages if missing."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the sandbox needs root (debootstrap, systemd-nspawn, ip netns)")
    missing = sorted({pkg for cmd, pkg in HOST_COMMANDS.items() if not shutil.which(cmd)})
    if missing:
        problems.append(
            "missing host packages: "
            + " ".join(missing)
            + f" (apt-get install -y {' '.join(missing)})"
        )
    if problems:
        raise SandboxError("; ".join(problems))


# --------------------------------------------------------------------------- served files


def ensure_served_files(progress: Progress = quiet) -> tuple[dict[str, Path], dict[str, Any]]:
    """What the loopback server publishes beside the stand-in repositories, from caches of
    their own: the catalog's llama.cpp source (PyPI's llama-cpp-python sdist, unchanged, at a
    path that mirrors files.pythonhosted.org), the tiny GGUF model and the stand-in 1Panel
    release package (onepanel.py). Returns (URL path -> file, the box.json facts)."""
    try:
        source = llamacpp.ensure_sdist(cache_dir() / "llamacpp", progress)
        model = tinymodel.ensure(cache_dir() / "models")
    except (llamacpp.LlamaCppSourceError, tinymodel.TinyModelError) as exc:
        raise SandboxError(str(exc)) from exc
    server = f"http://127.0.0.1:{REPO_PORT}/"
    files = {
        source["served_path"]: Path(source["path"]),
        tinymodel.URL_PATH: Path(model["path"]),
    }
    panel = onepanel.ensure(cache_dir() / "1panel")
    files.update(panel["files"])
    facts: dict[str, Any] = {
        # the only llama.cpp override of the sandbox inventory: a PyPI mirror's URL
        "llamacpp_url": server + source["served_path"],
        "model_url": server + tinymodel.URL_PATH,
        "model_file": model["file"],
        "model_sha256": model["sha256"],
        "model_size": model["size"],
        "model_reply": model["reply"],
        **onepanel.facts(server, panel),
    }
    return files, facts


def _prepare_hub(
    sdir: Path, served: dict[str, Path], progress: Progress
) -> tuple[list[str], dict[str, Any]]:
    """The Hub and PyPI mirror's arguments and box.json facts (hub.py): the tiny model in a
    Hub repository, the wheels of the hf tool in a simple index."""
    try:
        return hub.prepare(cache_dir(), sdir, served[tinymodel.URL_PATH], progress)
    except pypi.PyPIMirrorError as exc:
        raise SandboxError(str(exc)) from exc


def _prepare_modelscope(
    sdir: Path, served: dict[str, Path], hub_args: list[str], progress: Progress
) -> tuple[list[str], dict[str, Any]]:
    """The ModelScope mirror's arguments and box.json facts (modelscope_mirror.py): the tiny
    model over HTTPS with a new CA, and the modelscope tool's wheels added to the Hub's PyPI
    index (``hub_args``)."""
    try:
        args, facts = modelscope_mirror.prepare(
            cache_dir(), sdir, served[tinymodel.URL_PATH], progress
        )
    except pypi.PyPIMirrorError as exc:
        raise SandboxError(str(exc)) from exc
    hub_args.append(f"--pypi={facts['modelscope_pypi_wheels']}")
    return args, facts


# --------------------------------------------------------------------------- up / down


def up(
    rebuild: bool = False,
    progress: Progress = stderr_progress,
    sdir: Path | None = None,
    box: Box | None = None,
) -> dict[str, Any]:
    """Bring ``box`` (the current box by default) up, if it is not, and return its box.json
    facts."""
    check_host()
    box = box or current()
    sdir = sdir or box.state_dir()
    with lock(sdir):
        state = read_state(sdir)
        if state is not None:
            if (
                state.get("state") == "up"
                and alive(state["processes"].get("supervisor"))
                and not rebuild
            ):
                progress("the sandbox is already up")
                return state
            progress("cleaning up the previous sandbox first")
            _down(sdir, box, state, progress)
        elif box.netns_path.exists():
            raise SandboxError(
                f"network namespace {box.name} exists but this state dir ({sdir}) has no box: "
                "another gpubox sandbox (other GPUBOX_STATE_DIR?) may be up; bring it down "
                f"there, or remove the namespace with: ip netns delete {box.name}"
            )
        return _up(sdir, box, rebuild, progress)


def _up(sdir: Path, box: Box, rebuild: bool, progress: Progress) -> dict[str, Any]:
    started = time.monotonic()
    mirror = debian_mirror()
    mirror_host, mirror_port = host_port(mirror)
    pristine = ensure_rootfs(rebuild=rebuild, progress=progress)
    repo = repo_build.ensure_repo(cache_dir() / "repo", rebuild=rebuild, progress=progress)
    if box.number == 1 and repo_index.restore(repo):  # a new sandbox: nothing withdrawn
        progress("the stand-in repository offers every driver build again")
    served, served_facts = ensure_served_files(progress)
    hub_args, hub_facts = _prepare_hub(sdir, served, progress)
    ms_args, ms_facts = _prepare_modelscope(sdir, served, hub_args, progress)
    ccache = cache_dir() / "ccache"
    ccache.mkdir(parents=True, exist_ok=True)

    boxes = cache_dir() / "boxes" / box.name
    boxes.mkdir(parents=True, exist_ok=True)
    box_dir = boxes / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    rootfs = box_dir / "rootfs"
    (sdir / "logs").mkdir(parents=True, exist_ok=True)
    for stale in ("stopping", "nspawn.pid", "mirror.sock", *fleet.socket_names(box.number)):
        (sdir / stale).unlink(missing_ok=True)
    key = ensure_key(sdir)
    known_hosts = sdir / "known_hosts"
    known_hosts.write_text("")  # a new box may have new host keys on the same address
    ssh_config = write_ssh_config(sdir, key, box)

    state: dict[str, Any] = {
        "name": box.name,
        "box": box.number,
        "state": "starting",
        "state_dir": str(sdir),
        "rootfs": str(rootfs),
        "netns": box.name,
        "netns_path": str(box.netns_path),
        "ssh_hostname": SSH_HOST,
        "ssh_port": box.ssh_port,
        "ssh_user": SSH_USER,
        "ssh_key": str(key),
        "ssh_known_hosts_file": str(known_hosts),
        "ssh_config": str(ssh_config),
        "ssh_host_alias": box.name,
        "debian_mirror": mirror,
        "check_image": CHECK_IMAGE,
        "exporter_image": EXPORTER_IMAGE,
        "processes": {},
    }
    state.update(repo_build.repo_facts(repo, REPO_PORT))
    state.update(served_facts)
    state.update(hub_facts)
    state.update(ms_facts)
    state.update(ccache_dir=CCACHE_DIR, ccache_host_dir=str(ccache))
    write_state(sdir, state)

    try:
        t0 = time.monotonic()
        progress(f"copying the root filesystem to {rootfs}")
        box_dir.mkdir()
        subprocess.run(["cp", "-a", "--reflink=auto", str(pristine), str(rootfs)], check=True)
        (rootfs / ".gpubox-rootfs-complete").unlink(missing_ok=True)
        prepare_box_rootfs(rootfs, box, mirror, Path(f"{key}.pub").read_text())
        modelscope_mirror.install_ca(rootfs, Path(ms_facts["modelscope_ca"]))
        clean_old_boxes(boxes, box_dir)
        state["timings"] = {"copy_s": round(time.monotonic() - t0, 2)}

        # network namespace: lo only; forwarding on for Docker's bridge inside the box
        subprocess.run(["ip", "netns", "add", box.name], check=True)
        subprocess.run(["ip", "-n", box.name, "link", "set", "lo", "up"], check=True)
        sysctl = ["sysctl", "-qw", "net.ipv4.ip_forward=1"]
        subprocess.run(netns_argv(sysctl, box.name), check=True)

        # the Debian mirror, bridged into the namespace through a unix socket
        sock = sdir / "mirror.sock"
        procs = state["processes"]
        procs["mirror_socat_host"] = spawn(
            [
                "socat",
                f"UNIX-LISTEN:{sock},fork,unlink-early,mode=600",
                f"TCP:{mirror_host}:{mirror_port}",
            ],
            sdir / "logs" / "socat-host.log",
        )
        write_state(sdir, state)
        wait_for(lambda: sock.exists(), 5, "the host side of the mirror bridge")
        procs["mirror_socat_netns"] = spawn(
            netns_argv(
                [
                    "socat",
                    f"TCP-LISTEN:{mirror_port},bind=127.0.0.1,reuseaddr,fork",
                    f"UNIX-CONNECT:{sock}",
                ],
                box.name,
            ),
            sdir / "logs" / "socat-netns.log",
        )
        write_state(sdir, state)

        # box 3's model_dir on a small filesystem of its own (fleet.py), bound by nspawn
        volume = fleet.mount_model_volume(sdir, box)
        if volume:
            state["model_volume"] = volume
            write_state(sdir, state)
        # the supervisor, then the stand-in repository server (which exits with it)
        argv = nspawn_argv(box, rootfs, ccache, volume["host_dir"] if volume else None)
        (sdir / "nspawn.json").write_text(json.dumps({"argv": argv, "rootfs": str(rootfs)}))
        procs["supervisor"] = spawn_helper(
            box, "supervisor", ["supervise", str(sdir)], sdir / "logs" / "supervisor.log"
        )
        write_state(sdir, state)
        procs["repo_server"] = spawn_server(
            sdir,
            box,
            "repo",
            [
                "--root",
                str(repo),
                "--bind",
                "127.0.0.1",
                "--port",
                str(REPO_PORT),
                *(f"--file={url_path}={path}" for url_path, path in served.items()),
            ],
            procs["supervisor"],
        )
        write_state(sdir, state)
        wait_for(
            lambda: listening(procs["mirror_socat_netns"], mirror_port),
            5,
            "the namespace side of the mirror bridge",
        )
        wait_for(
            lambda: listening(procs["repo_server"], REPO_PORT),
            10,
            "the stand-in repository server",
        )
        # the Hugging Face Hub and PyPI mirror (hub.py), which exits with the supervisor too
        procs["hub_server"] = spawn_server(sdir, box, "hub", hub_args, procs["supervisor"])
        write_state(sdir, state)
        wait_for(lambda: listening(procs["hub_server"], HUB_PORT), 10, "the Hub and PyPI mirror")
        # the ModelScope mirror over HTTPS (modelscope_mirror.py), which exits with it too
        procs["modelscope_server"] = spawn_server(
            sdir, box, "modelscope_mirror", ms_args, procs["supervisor"]
        )
        write_state(sdir, state)
        wait_for(
            lambda: listening(procs["modelscope_server"], MODELSCOPE_PORT),
            10,
            "the ModelScope mirror",
        )
        if box.number > 1:  # sshd and the exporters, into box 1's namespace (fleet.py)
            fleet.bridge_all(sdir, box, procs)
            write_state(sdir, state)
        wait_for(lambda: nspawn_record(sdir) is not None, 10, "systemd-nspawn to start")
        procs["nspawn"] = nspawn_record(sdir)
        t1 = time.monotonic()
        progress("booting the box")
        system_state = wait_ready(info=state)
        state["timings"]["boot_s"] = round(time.monotonic() - t1, 2)
    except BaseException:
        progress("bringing the half-started sandbox down again")
        with contextlib.suppress(Exception):
            _down(sdir, box, state, quiet)
        raise

    state["state"] = "up"
    state["system_state"] = system_state
    state["timings"]["up_s"] = round(time.monotonic() - started, 2)
    write_state(sdir, state)
    progress(
        f"up in {state['timings']['up_s']:.1f} s: {state['repo_url']} and "
        f"ssh {SSH_USER}@{SSH_HOST}:{box.ssh_port} inside network namespace {box.name}"
    )
    if system_state != "running":
        raise SandboxError(
            f"the box is up but {system_state}; failed units:\n" + failed_units(state)
        )
    return state


def up_boxes(
    count: int, rebuild: bool = False, progress: Progress = stderr_progress
) -> list[dict[str, Any]]:
    """Boxes 1 to ``count`` up (one after another: they share the caches); their box.json."""
    if not 1 <= count <= MAX_BOXES:
        raise SandboxError(f"--boxes {count}: the sandbox runs 1 to {MAX_BOXES} boxes")
    infos = []
    for k in range(1, count + 1):
        box = Box.of(k)
        named = progress if k == 1 else _named(progress, box.name)
        infos.append(up(rebuild=rebuild and k == 1, progress=named, box=box))
    return infos


def down_all(progress: Progress = stderr_progress) -> list[dict[str, Any]]:
    """Every box down (those with a state or a network namespace); a report per box."""
    reports = []
    for k in range(MAX_BOXES, 0, -1):  # box 1 last: the others' ssh bridges run in its netns
        box = Box.of(k)
        if k > 1 and not (box.state_dir() / "box.json").exists() and not box.netns_path.exists():
            continue
        reports.append(down(progress if k == 1 else _named(progress, box.name), box=box))
    return reports


def _named(progress: Progress, name: str) -> Progress:
    return lambda message: progress(f"{name}: {message}")


def down(
    progress: Progress = stderr_progress, sdir: Path | None = None, box: Box | None = None
) -> dict[str, Any]:
    """Power ``box`` (the current box by default) off and remove everything ``up`` started.
    Returns a report dict."""
    check_host()
    box = box or current()
    sdir = sdir or box.state_dir()
    with lock(sdir):
        state = read_state(sdir)
        if state is None:
            leftover = box.netns_path.exists()
            if leftover:
                raise SandboxError(
                    f"no sandbox in {sdir}, but network namespace {box.name} exists "
                    f"(another state dir?); remove it with: ip netns delete {box.name}"
                )
            progress("the sandbox is not up")
            return {"was_up": False}
        return _down(sdir, box, state, progress)


def _down(sdir: Path, box: Box, state: dict[str, Any], progress: Progress) -> dict[str, Any]:
    started = time.monotonic()
    procs: dict[str, dict[str, int]] = state.get("processes", {})
    (sdir / "stopping").write_text("")  # the supervisor must not boot the box again
    nspawn = nspawn_record(sdir) or procs.get("nspawn")
    record = nspawn_full_record(sdir)
    init = record.get("init") or box_init(nspawn)
    pid_namespace = record.get("pid_namespace") or box_pid_namespace(nspawn)
    supervisor = procs.get("supervisor")
    rootfs = Path(state["rootfs"])
    if alive(nspawn):
        progress("powering the box off")
        send_signal(nspawn, signal.SIGTERM)  # nspawn turns SIGTERM into an orderly poweroff
    elif alive(init):
        # nspawn is gone but the box runs on (it outlives a killed nspawn): no orderly way left
        progress("systemd-nspawn is gone but the box still runs: killing its init")
        send_signal(init, signal.SIGKILL)
    send_signal(supervisor, signal.SIGTERM)  # forwards SIGTERM to a nspawn it started meanwhile
    if not wait_gone([nspawn, supervisor], STOP_TIMEOUT_S):
        progress(f"the box did not power off in {STOP_TIMEOUT_S:.0f} s: killing it")
        latest = nspawn_record(sdir)
        for rec in (nspawn, latest, supervisor):
            send_signal(rec, signal.SIGKILL)
        wait_gone([nspawn, latest, supervisor], 10)
    # killing PID 1 of the box's PID namespace takes every process in the box with it
    if send_signal(init, signal.SIGKILL):
        wait_gone([init], 10)
    for name in (
        *fleet.process_names(box.number),
        "modelscope_server",
        "hub_server",
        "repo_server",
        "mirror_socat_netns",
        "mirror_socat_host",
    ):
        stop(procs.get(name))
    # the box's own processes die with its PID namespace's init; make sure, by PID
    for pid in processes_in_namespace(pid_namespace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes_in_namespace(pid_namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    if box.netns_path.exists():
        subprocess.run(["ip", "netns", "delete", box.name], check=False)
    with contextlib.suppress(OSError):  # nspawn's lock file for the box's directory
        st = rootfs.stat()
        Path(f"/run/systemd/nspawn/locks/inode-{st.st_dev}:{st.st_ino}").unlink()
    for name in ("mirror.sock", *fleet.socket_names(box.number), "nspawn.pid", "nspawn.json"):
        (sdir / name).unlink(missing_ok=True)
    fleet.unmount_model_volume(sdir)
    if box.number == 1 and Path(state.get("repo_root", "/nonexistent"), "meta.json").exists():
        repo_index.restore(Path(state["repo_root"]))  # the sandbox ends: nothing withdrawn

    problems = []
    running = [f"{n} ({r['pid']})" for n, r in procs.items() if alive(r)]
    if running:
        problems.append("still running: " + ", ".join(running))
    if processes_in_namespace(pid_namespace):
        problems.append(f"processes still in the box: {processes_in_namespace(pid_namespace)}")
    if rootfs.exists() and mounts_under(rootfs):
        problems.append(f"mounts left under {rootfs}: {mounts_under(rootfs)}")
    if fleet.volume_dir(sdir).exists() and mounts_under(fleet.volume_dir(sdir)):
        problems.append(f"the model volume is still mounted at {fleet.volume_dir(sdir)}")
    if box.netns_path.exists():
        problems.append(f"network namespace {box.name} still exists")
    if problems:
        raise SandboxError("down left things behind: " + "; ".join(problems))
    retire_state(sdir)
    (sdir / "stopping").unlink(missing_ok=True)
    seconds = time.monotonic() - started
    progress(f"down in {seconds:.1f} s")
    return {
        "was_up": True,
        "down_s": round(seconds, 2),
        "rootfs": str(rootfs),
        "pid_namespace": pid_namespace,
    }


def status(sdir: Path | None = None) -> dict[str, Any]:
    """What is known about the box: {"up": bool, ...box.json facts, "system_state"}."""
    sdir = sdir or current().state_dir()
    state = read_state(sdir)
    if state is None:
        return {"up": False, "state_dir": str(sdir)}
    report = dict(state)
    procs = state.get("processes", {})
    nspawn = nspawn_record(sdir)
    if nspawn:
        report["processes"] = dict(procs, nspawn=nspawn)
    report["alive"] = {name: alive(rec) for name, rec in report["processes"].items()}
    report["up"] = state.get("state") == "up" and report["alive"].get("supervisor", False)
    if report["up"]:
        result = ssh("systemctl is-system-running", check=False, timeout=20, info=state)
        report["system_state"] = result.stdout.strip() or result.stderr.strip()
    return report


# --------------------------------------------------------------------------- kernels


def plant_kernel(
    version: str,
    headers: bool = True,
    run_hooks: bool = True,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Plant a second stand-in kernel in the running box, as if a kernel update had installed
    ``linux-image-<version>`` (and ``linux-headers-<version>`` with ``headers``). With
    ``run_hooks`` it then runs what those packages' postinst scripts run for DKMS:
    ``run-parts --arg=<version> /etc/kernel/header_postinst.d`` (headers) and DKMS's
    ``/etc/kernel/postinst.d/dkms <version> /boot/vmlinuz-<version>`` (image; the other image
    hooks, such as initramfs-tools', are not run for a stand-in kernel). Returns what was
    planted and the hooks' output; afterwards ``dkms status`` in the box shows whether the
    NVIDIA module was built for the new kernel (only with its headers)."""
    info = info or box_info()
    kernel.check_version(version)
    root = Path(info["rootfs"])
    written = kernel.install_kernel(root, version, headers)
    out: dict[str, Any] = {"version": version, "headers": headers, "files": written, "hooks": []}
    if run_hooks:
        commands = []
        if headers:
            commands.append(
                "if [ -d /etc/kernel/header_postinst.d ]; then run-parts --report "
                f"--exit-on-error --arg={version} /etc/kernel/header_postinst.d; fi"
            )
        commands.append(
            "if [ -x /etc/kernel/postinst.d/dkms ]; then /etc/kernel/postinst.d/dkms "
            f"{version} /boot/vmlinuz-{version}; fi"
        )
        for command in commands:
            result = ssh(command, check=False, timeout=600, info=info)
            out["hooks"].append(
                {
                    "command": command,
                    "returncode": result.returncode,
                    "output": result.stdout + result.stderr,
                }
            )
            if result.returncode != 0:
                raise SandboxError(
                    f"in the box: the kernel hook for {version} failed "
                    f"({result.returncode}): {command}\n{result.stderr}{result.stdout}"
                )
    return out
