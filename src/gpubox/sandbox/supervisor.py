"""The supervisor of a sandbox box: a detached process that boots the box with
systemd-nspawn, boots it again when it exits with 133 (the box ran ``reboot``; shim's MOK
screen is played in between: faults.firmware_at_boot), and stops otherwise. ``box.up`` starts
it (``python -c ... supervise STATE_DIR``) and reads nspawn's record it keeps in
``nspawn.pid``; the servers of the box exit when it is gone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpubox.sandbox.common import process_start_time
from gpubox.sandbox.faults import firmware_at_boot
from gpubox.sandbox.fleet import BOX_MODEL_DIR
from gpubox.sandbox.identity import Box
from gpubox.sandbox.processes import box_init, namespace_of, write_nspawn_record

# nspawn exits with this status when the box ran `reboot` (systemd-nspawn(1)).
NSPAWN_REBOOT_STATUS = 133
# A compiler cache that outlives the box: <cache dir>/ccache on the host, bind-mounted here in
# every box, so that a llama.cpp build through ccache (CCACHE_DIR set to this, the source and
# build at fixed paths) takes seconds in a fresh box once one box has built it.
CCACHE_DIR = "/var/cache/gpubox-ccache"


def nspawn_argv(box: Box, rootfs: Path, ccache: Path, model_volume: str | None = None) -> list[str]:
    """How the supervisor runs the box: systemd-nspawn booting ``rootfs`` in the box's network
    namespace, the host's compiler cache ``ccache`` bind-mounted at CCACHE_DIR, and the box's
    model volume (a host directory: fleet.py) at its model_dir when it has one."""
    volume = [f"--bind={model_volume}:{BOX_MODEL_DIR}"] if model_volume else []
    return [
        "systemd-nspawn",
        "--quiet",
        "--register=no",  # required when the host's PID 1 is not systemd
        "--keep-unit",
        "--console=read-only",
        "-M",
        box.name,
        "-D",
        str(rootfs),
        f"--network-namespace-path={box.netns_path}",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        f"--bind={ccache}:{CCACHE_DIR}",
        *volume,
        # the box's own loaded kernel modules, empty at every boot (the host's /sys/module is
        # read-only in the box and shows the host's): the stand-in module units write there
        "--tmpfs=/sys/module:mode=0755",
        # Docker inside the box: iptables/bridges, runc's keyring and
        # cgroup v2 device filter.
        "--capability=CAP_NET_ADMIN",
        "--system-call-filter=@keyring bpf",
        "--boot",
    ]


def supervise(sdir: Path) -> int:
    """The supervisor: boot the box, boot it again after a reboot (exit 133), stop otherwise."""
    spec = json.loads((sdir / "nspawn.json").read_text())
    stop_flag = sdir / "stopping"
    log_path = sdir / "logs" / "nspawn.log"
    env = dict(os.environ, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1")
    current: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for proc in current:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    boots = 0
    while not stopping and not stop_flag.exists():
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                spec["argv"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        current[:] = [proc]
        boots += 1
        record: dict[str, Any] = {
            "pid": proc.pid,
            "start_time": process_start_time(proc.pid) or 0,
            "boot": boots,
        }
        write_nspawn_record(sdir, record)
        print(f"{time.strftime('%H:%M:%S')} boot {boots}: nspawn pid {proc.pid}", flush=True)
        # The box's init (PID 1 of its PID namespace): down needs it if nspawn dies first,
        # since the box's processes outlive a killed nspawn.
        deadline = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < deadline:
            init = box_init(record)
            if init is not None:
                record["init"] = init
                record["pid_namespace"] = namespace_of(init["pid"])
                write_nspawn_record(sdir, record)
                break
            time.sleep(0.02)
        while True:
            try:
                rc = proc.wait()
                break
            except InterruptedError:
                continue
        current.clear()
        print(f"{time.strftime('%H:%M:%S')} nspawn exited with status {rc}", flush=True)
        if rc != NSPAWN_REBOOT_STATUS:
            break
        print(f"{time.strftime('%H:%M:%S')} the box rebooted: booting it again", flush=True)
        if "rootfs" in spec:
            outcome = firmware_at_boot(Path(spec["rootfs"]))
            if outcome:
                print(f"{time.strftime('%H:%M:%S')} MOK screen: {outcome}", flush=True)
    # nspawn.pid stays: down reads the box's init from it (the box outlives a killed nspawn)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The entry point of the detached supervisor process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "supervise":
        return supervise(Path(args[1]))
    print("usage: python -m gpubox.sandbox.supervisor supervise STATE_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
