"""``gpubox sandbox``: bring the local stand-in box up and down, and reach it.

gpubox sandbox up [--rebuild] [--boxes N] [--download-rate BYTES_PER_S]
                                  build/boot the box, or boxes 1 to N (N up to 4)
gpubox sandbox down               power every box off; nothing is left running
gpubox sandbox status             whether each box is up, and how to reach it
(ssh, exec, fault and mok-screen take --box K: box K, 1 by default)
gpubox sandbox ssh [-- CMD ...]   a shell or a command in the box (exit status passed on)
gpubox sandbox exec -- CMD ...    a host command inside the box's network namespace,
                                  where the box is 127.0.0.1 (pyinfra, pytest)
gpubox sandbox fault NAME|clear   plant a stand-in hardware fault (or clear them all)
                                  (module-refuses --version V: the module loader refuses V;
                                  NAME --off takes that one back: gpu-missing, nvlink-down,
                                  server-frozen, volume-full, unreachable, ...)
gpubox sandbox repo withdraw VERSION | restore
                                  the stand-in NVIDIA repository stops (starts) offering a
                                  driver build, from every box's next apt-get update
gpubox sandbox mok-screen --enroll --password-file F | --timeout
                                  what the console does at the next boot's MOK screen
gpubox sandbox image              build and load the host checks' container image in every
                                  box that is up (--box K: box K only; Docker must be installed
                                  there); prints its name
gpubox sandbox hub reupload [--json]
                                  a commit on main of the box's Hub mirror with other bytes
                                  for the model's file (as a re-upload on the Hub makes one);
                                  the earlier commits stay, box.json keeps the first sha256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence

from gpubox.sandbox import box, box_ssh, faults, hub, identity, images, processes, repo_index, serve
from gpubox.sandbox.common import SandboxError


def _command(words: Sequence[str]) -> list[str]:
    words = list(words)
    if words and words[0] == "--":
        words = words[1:]
    return words


def _print_facts(info: dict[str, object]) -> None:
    keys = (
        "ssh_hostname",
        "ssh_port",
        "ssh_user",
        "ssh_key",
        "ssh_config",
        "netns",
        "rootfs",
        "repo_url",
        "key_url",
        "key_fingerprint",
        "toolkit_repo_url",
        "toolkit_key_url",
        "toolkit_key_fingerprint",
        "gpu_burn_url",
        "gpu_burn_commit",
        "gpu_burn_sha256",
        "llamacpp_url",
        "model_url",
        "model_sha256",
        "model_size",
        "panel_url",
        "panel_version",
        "panel_sha256",
        "download_rate",
        "ccache_dir",
        "ccache_host_dir",
        "check_image",
        "state_dir",
    )
    for key in keys:
        if key in info:
            print(f"{key}: {info[key]}")


def _status(as_json: bool) -> int:
    """Box 1's status, then every other box that has a state; 0 when box 1 is up."""
    reports = []
    for k in range(1, identity.MAX_BOXES + 1):
        report = box.status(identity.state_dir(k))
        if k == 1 or "processes" in report:
            reports.append(report)
    if as_json:
        print(json.dumps(reports[0] if len(reports) == 1 else {"boxes": reports}, indent=2))
        return 0 if reports[0]["up"] else 1
    for k, report in enumerate(reports, 1):
        name = report.get("name", identity.box_name(k))
        if not report["up"]:
            state = "stale (run gpubox sandbox down)" if "processes" in report else "down"
            print(f"sandbox {name}: {state}" if len(reports) > 1 else f"sandbox: {state}")
            continue
        label = f"sandbox {name}" if len(reports) > 1 else "sandbox"
        print(f"{label}: up ({report.get('system_state', '?')})")
        _print_facts(report)
        print(
            "processes: "
            + ", ".join(
                f"{pname} {rec['pid']}{'' if report['alive'][pname] else ' (gone)'}"
                for pname, rec in report["processes"].items()
            )
        )
    return 0 if reports[0]["up"] else 1


def _images() -> int:
    """The check image in every box that is up: its name on stdout once, each box's failure
    on stderr (exit 1 when one failed)."""
    results = images.load_check_images()
    failed = [(info, r) for info, r in results if isinstance(r, SandboxError)]
    for info, error in failed:
        print(f"gpubox sandbox: error: {info['name']}: {str(error).strip()}", file=sys.stderr)
    for image in dict.fromkeys(r for _, r in results if isinstance(r, str)):
        print(image)
    return 1 if failed else 0


def _repo(parser: argparse.ArgumentParser, action: str, version: str | None) -> int:
    root = repo_index.current_root()
    if action == "withdraw":
        if not version:
            parser.error("repo withdraw needs a VERSION, e.g. 570.211.01")
        gone = repo_index.withdraw(version, root)
    else:
        if version:
            parser.error("repo restore takes no VERSION: it restores every build")
        repo_index.restore(root)
        gone = []
    offered = [v for v in repo_index.served_builds(root) if v not in gone]
    print(f"repo: offers {', '.join(offered)}" + (f"; withdrawn {', '.join(gone)}" if gone else ""))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpubox sandbox",
        description="A local stand-in box (Debian 12, systemd-nspawn) to try and test gpubox.",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="build (once) and boot the box")
    up.add_argument(
        "--rebuild",
        action="store_true",
        help="rebuild the cached root filesystem and stand-in repository first",
    )
    up.add_argument("--json", action="store_true", help="print box.json on stdout")
    up.add_argument(
        "--boxes",
        type=int,
        default=1,
        help=f"boot boxes 1 to N (at most {identity.MAX_BOXES}); box 1 is the reference box, "
        "box 2 has one Tesla T4 and no NVLink",
    )
    up.add_argument(
        "--download-rate",
        type=int,
        metavar="BYTES_PER_S",
        help="cap every response body of the servers the sandbox runs itself (the Hub and "
        "PyPI mirror, the stand-in repositories, the URL server) at this rate; recorded in "
        "box.json as download_rate (Debian's mirror is bridged and stays unthrottled); takes "
        "effect when the servers start (after `down`)",
    )
    sub.add_parser("down", help="power every box off and remove what up started")
    st = sub.add_parser("status", help="whether the box is up, and its connection facts")
    st.add_argument("--json", action="store_true")
    ssh = sub.add_parser("ssh", help="run a command (or a shell) in the box")
    ssh.add_argument("command", nargs=argparse.REMAINDER)
    ex = sub.add_parser("exec", help="run a host command inside the box's network namespace")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    fault = sub.add_parser(
        "fault",
        help="plant a stand-in hardware fault in the box, or clear them",
        description="Faults: " + "; ".join(f"{k}: {v}" for k, v in faults.FAULTS.items()),
    )
    fault.add_argument("name", choices=[*faults.FAULTS, "clear"])
    fault.add_argument("--gpu", type=int, help="the GPU's position in the state (0, 1)")
    fault.add_argument("--link", type=int, help="the NVLink port of that GPU")
    fault.add_argument(
        "--off",
        action="store_true",
        help="take this fault back and leave the others (" + ", ".join(faults.OFF) + ")",
    )
    fault.add_argument(
        "--version",
        help="runfile-driver: the runfile's driver version; module-refuses: the driver version "
        "whose nvidia module the kernel refuses (required)",
    )
    mok = sub.add_parser(
        "mok-screen",
        help="answer the next boot's MOK screen (enroll with the import password, or time out)",
        description="What someone at the console does at the MOK screen of the box's next boot "
        "(it takes effect when the box reboots: gpubox sandbox ssh -- systemctl reboot).",
    )
    answer = mok.add_mutually_exclusive_group(required=True)
    answer.add_argument("--enroll", action="store_true", help="Enroll MOK, with the password")
    answer.add_argument("--timeout", action="store_true", help="nobody answers (10 s)")
    mok.add_argument(
        "--password-file", help="a file whose first line is the mokutil --import password"
    )
    image = sub.add_parser(
        "image",
        help="build and load the host checks' container image in every box that is up; prints "
        "its name",
    )
    image.add_argument("--box", type=int, help="box K only (1..4); default: every box that is up")
    hub_parser = sub.add_parser(
        "hub",
        help="change what the box's Hugging Face Hub mirror serves",
        description="reupload: a new commit on main with other bytes for the model's file, as "
        "a re-upload on the Hub makes one; the earlier commits stay in the history, and "
        "box.json (gpubox sandbox status --json) keeps the first upload's sha256 and commit.",
    )
    hub_parser.add_argument("hub_action", choices=["reupload"])
    hub_parser.add_argument("--json", action="store_true", help="print the new commit as JSON")
    repo = sub.add_parser(
        "repo",
        help="withdraw a driver build from the stand-in NVIDIA repository, or restore them",
        description="withdraw VERSION: the stand-in NVIDIA CUDA repository stops offering the "
        "driver build VERSION (every package at that version; the files stay on disk), as "
        "NVIDIA's repository drops old builds; restore: it offers every build again. Each box "
        "sees the change at its next apt-get update; a new sandbox (up after down) starts "
        "with nothing withdrawn.",
    )
    repo.add_argument("repo_action", choices=["withdraw", "restore"])
    repo.add_argument("version", nargs="?", help="withdraw: the driver build, e.g. 570.211.01")
    for name in ("ssh", "exec", "fault", "mok-screen", "hub"):
        sub.choices[name].add_argument("--box", type=int, default=1, help="which box (1..4)")
    args = parser.parse_args(argv)

    try:
        if args.action == "up":
            if args.download_rate is not None:
                if args.download_rate < serve.MIN_RATE:
                    parser.error(f"--download-rate must be at least {serve.MIN_RATE} bytes/s")
                # the servers inherit it (gpubox.sandbox.serve.download_rate)
                os.environ[serve.RATE_ENV] = str(args.download_rate)
            infos = box.up_boxes(args.boxes, rebuild=args.rebuild)
            if args.json:
                document = infos[0] if len(infos) == 1 else {"boxes": infos}
                print(json.dumps(document, indent=2, sort_keys=True))
            else:
                for info in infos:
                    if len(infos) > 1:
                        print(f"== {info['name']}")
                    _print_facts(info)
            return 0
        if args.action == "down":
            box.down_all()
            return 0
        if args.action == "status":
            return _status(args.json)
        if args.action == "repo":
            return _repo(parser, args.repo_action, args.version)
        if args.action == "image" and args.box is None:
            return _images()
        if getattr(args, "box", 1) != 1:
            identity.use_box(args.box)
        if args.action == "ssh":
            info = processes.box_info()
            command = _command(args.command)
            tty = not command and sys.stdin.isatty()
            return subprocess.call(box_ssh.ssh_argv(info, command, tty=tty))
        if args.action == "fault":
            if args.name == "clear":
                faults.clear_faults()
            elif args.off:
                faults.clear_fault(args.name, gpu=args.gpu, link=args.link)
            else:
                faults.plant_fault(args.name, gpu=args.gpu, link=args.link, version=args.version)
            return 0
        if args.action == "mok-screen":
            password = None
            if args.enroll:
                if not args.password_file:
                    parser.error("mok-screen --enroll needs --password-file FILE")
                with open(args.password_file, encoding="utf-8") as handle:
                    password = handle.readline().rstrip("\n")
            faults.mok_screen("enroll" if args.enroll else "timeout", password)
            return 0
        if args.action == "image":
            print(images.load_check_image())
            return 0
        if args.action == "hub":
            done = hub.add_reupload(processes.box_info())
            if args.json:
                print(json.dumps(done, indent=2, sort_keys=True))
            else:
                print(
                    f"hub: {done['file']} re-uploaded: main is commit {done['commit']} "
                    f"(sha256 {done['sha256']}); {done['parent']} and the commits before it "
                    "stay in the history"
                )
            return 0
        if args.action == "exec":
            command = _command(args.command)
            if not command:
                parser.error("exec needs a command: gpubox sandbox exec -- CMD ...")
            processes.box_info()
            os.execvp("ip", identity.netns_argv(command))
    except (SandboxError, ValueError, IndexError, OSError) as exc:
        print(f"gpubox sandbox: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
