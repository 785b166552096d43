"""The sandbox's stand-in 1Panel v2 release package (1Panel-dev/1Panel), served on loopback.

1Panel's download hosts (resource.1panel.pro, resource.fit2cloud.com) cannot be reached from a
test machine, so the sandbox builds a stand-in of the "online installation package"
``1panel-v2.3.2-linux-amd64.tar.gz`` and its server publishes it, with a goreleaser
``checksums.txt`` and the ``latest`` file, under the real URLs' path shape:
``1panel/v2/stable/<version>/release/1panel-<version>-linux-<arch>.tar.gz`` (the intl URL is
``https://resource.1panel.pro/v2/stable/<version>/release/...``; "1panel/" stands for the
host, as "github/" and "pypi/" do for theirs). None of it is ever shipped to a real box.

What is recorded (sources in STANDINS.md, section "1Panel"):

- the file name, the URL shape and the checksums file: 1Panel-dev/1Panel
  ``.github/workflows/build-and-publish.yml`` @ 6b81868935fc559416e545a8688e5db36f5fe4d1
  (goreleaser uploads ``dist/*.tar.gz`` and ``checksums.txt`` to
  ``package/v2/stable/<tag>/release/``) and the third-party HandSonic/1Panel-offline-installer-V2
  ``official-sources-v2.3.2.json`` @ 5fa8258b7690852c8ebe468ba3ce577a35aca666;
- the members (top directory ``1panel-<version>-linux-<arch>/``; ``1panel-core``,
  ``1panel-agent``, ``1pctl``, ``install.sh``, the two units at the top and in
  ``initscript/`` with ``.init``/``.openrc``/``.procd`` variants, ``lang/{en,zh,fa,pt-BR,ru}.sh``,
  ``GeoIP.mmdb``): what 1Panel-dev/installer ``install.sh`` @
  aa4a6bbf24ae0fd938b32294672f5086f940e483 and 1Panel-dev/1Panel ``core/app/service/upgrade.go``
  @ 48256a9aa4487482654f9f26a3dc104b453430b4 copy out of the package;
- the systemd units' lines (1Panel-dev/installer branch v2 @
  17f2b15864598113e60640e726c45d2fd9f05280 ``1panel-core.service``/``1panel-agent.service``);
- the variables at the top of ``1pctl`` and their placeholder values (the v2.1.12 1pctl kept in
  HandSonic/1Panel-offline-installer-V2 ``tests/fixtures/historical-21/v2.1.12-custom-1pctl``
  @ cf1d831858dfdbf0b611390fbd9d7eea9966405b).

Guesses: the rest of 1pctl's text, the server binaries (Python stand-ins, see
``standin/1panel/``), the ``.init``/``.openrc``/``.procd`` scripts, the ``lang/*.sh`` texts
(English everywhere), the GeoIP file's content, the members' modes, owners and times, and
the directory entries in the archive. The real tarball of v2.3.2 amd64 has sha256
f1265a4f...61cac and 65,444,909 bytes; this one is a few tens of kilobytes with its own sha256.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from gpubox.sandbox.tarball import Member, tar_gz

STANDIN_DIR = Path(__file__).parent / "standin" / "1panel"
VERSION = "v2.3.2"
ARCH = "amd64"
MODE = "stable"
# URL paths on the sandbox's server ("1panel/" stands for resource.1panel.pro)
URL_ROOT = "1panel/v2/"
URL_TEMPLATE = URL_ROOT + MODE + "/{version}/release/1panel-{version}-linux-{arch}.tar.gz"
LATEST_PATH = URL_ROOT + MODE + "/latest"
# The members' time (guess: the day after v2.3.1's changelog, 1Panel-dev/docs PR #206/#207)
MTIME = 1790294400  # 2026-09-24T00:00:00Z
LANGS = ("en", "zh", "fa", "pt-BR", "ru")
SERVICES = ("core", "agent")
INIT_KINDS = ("service", "init", "openrc", "procd")
# The stand-in install.sh appends a line here when it is run (it must never be).
INSTALL_SH_RAN = "/var/lib/gpubox-standin/1panel-install-sh-ran"


def tarball_name(version: str = VERSION, arch: str = ARCH) -> str:
    return f"1panel-{version}-linux-{arch}.tar.gz"


def top_dir(version: str = VERSION, arch: str = ARCH) -> str:
    return f"1panel-{version}-linux-{arch}"


def url_path(version: str = VERSION, arch: str = ARCH) -> str:
    return URL_TEMPLATE.format(version=version, arch=arch)


# --------------------------------------------------------------------------- member texts


def unit(service: str) -> str:
    """The recorded systemd unit of 1panel-core or 1panel-agent."""
    return (
        "[Unit]\n"
        "Description=1Panel, a modern open source linux panel\n"
        "After=syslog.target network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        f"ExecStart=/usr/bin/1panel-{service}\n"
        "Restart=always\n"
        "RestartSec=5\n"
        "LimitNOFILE=1048576\n"
        "LimitNPROC=1048576\n"
        "LimitCORE=1048576\n"
        "Delegate=yes\n"
        "KillMode=process\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def _init_script(service: str, kind: str) -> str:
    """The other init systems' scripts (guesses: only their names are recorded)."""
    if kind == "service":
        return unit(service)
    program = f"/usr/bin/1panel-{service}"
    if kind == "openrc":
        return (
            "#!/sbin/openrc-run\n# gpubox sandbox stand-in (a guess at 1Panel's openrc script)\n"
            f'name="1panel-{service}"\ncommand="{program}"\ncommand_background=true\n'
            f'pidfile="/run/1panel-{service}.pid"\n\ndepend() {{\n    need net\n}}\n'
        )
    if kind == "procd":
        return (
            "#!/bin/sh /etc/rc.common\n# gpubox sandbox stand-in (a guess at 1Panel's procd "
            "script)\nSTART=99\nUSE_PROCD=1\n\nstart_service() {\n    procd_open_instance\n"
            f"    procd_set_param command {program}\n    procd_set_param respawn\n"
            "    procd_close_instance\n}\n"
        )
    return (
        "#!/bin/sh\n### BEGIN INIT INFO\n"
        f"# Provides:          1panel-{service}\n"
        "# Required-Start:    $network $remote_fs\n# Required-Stop:     $network $remote_fs\n"
        "# Default-Start:     2 3 4 5\n# Default-Stop:      0 1 6\n"
        f"# Short-Description: 1Panel {service}\n### END INIT INFO\n"
        "# gpubox sandbox stand-in (a guess at 1Panel's sysvinit script)\n"
        f'case "$1" in\n    start) start-stop-daemon --start --background --make-pidfile '
        f"--pidfile /run/1panel-{service}.pid --exec {program} ;;\n"
        f"    stop) start-stop-daemon --stop --pidfile /run/1panel-{service}.pid ;;\n"
        '    restart) "$0" stop; "$0" start ;;\n'
        '    *) echo "Usage: $0 {start|stop|restart}"; exit 1 ;;\nesac\n'
    )


def _lang(code: str) -> str:
    return (
        f"# gpubox sandbox stand-in for 1Panel's lang/{code}.sh (the real one holds the\n"
        "# installer's and 1pctl's messages in its language; this one, English only)\n"
        'TXT_RUN_AS_ROOT="Please run this script as root or with sudo"\n'
        'TXT_PANEL_SERVICE_STATUS="Check 1Panel service status"\n'
        'TXT_PANEL_SERVICE_RESTART="Restart 1Panel service"\n'
    )


# The MaxMind DB format's metadata marker (maxmind.github.io/MaxMind-DB, "Database Metadata");
# the stand-in file is no database (nothing in the sandbox reads it).
GEOIP = (
    b"gpubox sandbox stand-in for 1Panel's GeoIP.mmdb: not a real MaxMind database\n"
    b"\xab\xcd\xefMaxMind.com"
)


def members(version: str = VERSION) -> list[Member]:
    """The package's files, in archive order."""

    def standin(name: str) -> bytes:
        return (STANDIN_DIR / name).read_text().replace("@VERSION@", version).encode()

    out = [
        Member("1panel-core", standin("1panel-core"), 0o755),
        Member("1panel-agent", standin("1panel-agent"), 0o755),
        Member("1pctl", standin("1pctl"), 0o755),
        Member("install.sh", standin("install.sh"), 0o755),
        Member("1panel-core.service", unit("core").encode(), 0o644),
        Member("1panel-agent.service", unit("agent").encode(), 0o644),
        Member("GeoIP.mmdb", GEOIP, 0o644),
    ]
    for service in SERVICES:
        for kind in INIT_KINDS:
            mode = 0o644 if kind == "service" else 0o755
            text = _init_script(service, kind)
            out.append(Member(f"initscript/1panel-{service}.{kind}", text.encode(), mode))
    out += [Member(f"lang/{code}.sh", _lang(code).encode(), 0o644) for code in LANGS]
    return out


def tarball(version: str = VERSION, arch: str = ARCH) -> bytes:
    """The package, reproducibly (tarball.py): fixed mtime, owner root (0/0), gzip without name
    or time."""
    return tar_gz(top_dir(version, arch), members(version), mtime=MTIME, dir_mode=0o755)


def checksums(files: dict[str, bytes]) -> str:
    """goreleaser's checksums.txt: ``<sha256>  <file name>`` a line."""
    return "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in files.items())


# --------------------------------------------------------------------------- serving


def ensure(base: Path, version: str = VERSION, arch: str = ARCH) -> dict[str, Any]:
    """Write the package, checksums.txt and latest under ``base/<sha256 prefix>/`` (once);
    returns {"files": URL path -> file, "sha256", "version", "arch"}."""
    data = tarball(version, arch)
    sha = hashlib.sha256(data).hexdigest()
    root = base / sha[:16]
    path = url_path(version, arch)
    release = path.rpartition("/")[0]
    contents = {
        path: data,
        release + "/checksums.txt": checksums({tarball_name(version, arch): data}).encode(),
        LATEST_PATH: version.encode(),  # the real latest file's body is the bare version
    }
    files = {}
    for served, content in contents.items():
        target = root / served.replace("/", "_")
        if not target.exists() or target.read_bytes() != content:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(content)
            tmp.replace(target)
        files[served] = target
    for old in base.iterdir():  # packages of older inputs (small: delete now)
        if old != root and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return {"files": files, "sha256": sha, "version": version, "arch": arch}


def facts(server: str, built: dict[str, Any]) -> dict[str, Any]:
    """The box.json facts for a package from ``ensure`` served at ``server`` (ends in /).
    ``panel_url`` keeps ``{version}`` and ``{arch}`` for the catalog's template."""
    release = URL_TEMPLATE.rpartition("/")[0].format(version=built["version"])
    return {
        "panel_url": server + URL_TEMPLATE,
        "panel_version": built["version"],
        "panel_arch": built["arch"],
        "panel_sha256": built["sha256"],
        "panel_checksums_url": server + release + "/checksums.txt",
        "panel_latest_url": server + LATEST_PATH,
    }
