"""The sandbox's stand-in 1Panel v2 package (sandbox/onepanel.py): its layout against the
record, and the stand-in core, agent and 1pctl run here on a temporary BASE_DIR (servers on
loopback, stopped by PID), and the box record (tests/panel_record.py) against a tree laid out
as 1Panel's install.sh lays it out."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import importlib.machinery
import importlib.util
import io
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import tarfile
import time
import types
from pathlib import Path

import panel_record
import pytest

from gpubox.sandbox import onepanel

TOP = "1panel-v2.3.2-linux-amd64"
INST = "1Panel-dev/installer install.sh @ aa4a6bb"
UPGRADE = "1Panel-dev/1Panel core/app/service/upgrade.go @ 48256a9"
# (member, kind, marker, source): kind x = executable file, f = file, d = directory
RECORDED = [
    ("1panel-core", "x", "", INST + "; " + UPGRADE),
    ("1panel-agent", "x", "", INST + "; " + UPGRADE),
    ("1pctl", "x", "ORIGINAL_VERSION=v2.3.2", INST + "; HS-OFF v2.1.12 1pctl fixture"),
    ("install.sh", "x", "", "every source"),
    ("1panel-core.service", "f", "ExecStart=/usr/bin/1panel-core", UPGRADE + "; AUR 1panel-v2-bin"),
    ("1panel-agent.service", "f", "ExecStart=/usr/bin/1panel-agent", UPGRADE),
    ("GeoIP.mmdb", "f", "", INST),
    ("initscript", "d", "", INST),
    *[
        (f"initscript/1panel-{s}.service", "f", f"ExecStart=/usr/bin/1panel-{s}", INST)
        for s in ("core", "agent")
    ],
    # the other init systems' scripts: executable is a guess (only their names are recorded)
    *[
        (f"initscript/1panel-{s}.{k}", "x", "", INST)
        for s in ("core", "agent")
        for k in ("init", "openrc", "procd")
    ],
    ("lang", "d", "", INST + " AVAILABLE_LANGS"),
    *[
        (f"lang/{c}.sh", "f", "", INST + " AVAILABLE_LANGS")
        for c in ("en", "zh", "fa", "pt-BR", "ru")
    ],
]
CTL_VARIABLES = [
    "BASE_DIR",
    "ORIGINAL_PORT",
    "ORIGINAL_VERSION",
    "ORIGINAL_ENTRANCE",
    "ORIGINAL_USERNAME",
    "ORIGINAL_PASSWORD",
    "LANGUAGE",
    "PANEL_EDITION",
]


@pytest.fixture(scope="module")
def package() -> bytes:
    return onepanel.tarball()


def extract(data: bytes, dest: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="tar")
    return dest / TOP


def test_the_tarball_has_the_recorded_members(package: bytes) -> None:
    with tarfile.open(fileobj=io.BytesIO(package)) as tar:
        entries = {m.name: m for m in tar.getmembers()}
        assert set(entries) == {TOP} | {f"{TOP}/{name}" for name, *_ in RECORDED}
        assert entries[TOP].isdir()
        for name, kind, marker, source in RECORDED:
            member = entries[f"{TOP}/{name}"]
            if kind == "d":
                assert member.isdir(), (name, source)
                continue
            assert member.isfile(), (name, source)
            assert bool(member.mode & 0o111) == (kind == "x"), (name, oct(member.mode), source)
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            assert data, name
            if marker:
                assert marker in data.decode().splitlines(), (name, marker, source)
        for member in entries.values():
            assert (member.uid, member.gid, member.uname, member.mtime) == (
                0,
                0,
                "root",
                onepanel.MTIME,
            )


def test_the_tarball_is_reproducible() -> None:
    first, second = onepanel.tarball(), onepanel.tarball()
    assert hashlib.sha256(first).digest() == hashlib.sha256(second).digest()
    assert first[4:8] == b"\0\0\0\0"  # gzip header time 0
    assert gzip.decompress(first)  # a whole gzip stream


def test_the_units_carry_the_recorded_lines(package: bytes, tmp_path: Path) -> None:
    top = extract(package, tmp_path)
    for service in ("core", "agent"):
        text = (top / f"1panel-{service}.service").read_text()
        assert text == (top / "initscript" / f"1panel-{service}.service").read_text()
        lines = text.splitlines()
        assert [line for line in lines if "=" in line] == panel_record.unit_lines(service)
        assert "docker" not in text  # no ordering on docker.service, none between the two


def test_1pctl_has_the_variables_install_sh_edits_one_a_line(
    package: bytes, tmp_path: Path
) -> None:
    text = (extract(package, tmp_path) / "1pctl").read_text()
    assigned = [line.split("=", 1)[0] for line in text.splitlines() if line[:1].isupper()]
    assert assigned == CTL_VARIABLES
    assert "ORIGINAL_VERSION=v2.3.2" in text.splitlines()
    assert "CHANGE_USER_INFO" not in text


def test_install_sh_refuses_and_leaves_a_mark(package: bytes, tmp_path: Path) -> None:
    top = extract(package, tmp_path)
    env = {**os.environ, "GPUBOX_STANDIN_STATE_DIR": str(tmp_path / "state")}
    result = subprocess.run(
        ["bash", str(top / "install.sh")], env=env, capture_output=True, text=True, timeout=10
    )
    assert result.returncode == 1 and "never run this script" in result.stderr
    assert (tmp_path / "state" / Path(onepanel.INSTALL_SH_RAN).name).read_text().strip()


def test_served_files_checksums_and_facts(tmp_path: Path) -> None:
    built = onepanel.ensure(tmp_path / "cache")
    again = onepanel.ensure(tmp_path / "cache")
    assert built == again
    path = "1panel/v2/stable/v2.3.2/release/1panel-v2.3.2-linux-amd64.tar.gz"
    files = built["files"]
    assert set(files) == {
        path,
        "1panel/v2/stable/v2.3.2/release/checksums.txt",
        "1panel/v2/stable/latest",
    }
    data = files[path].read_bytes()
    assert hashlib.sha256(data).hexdigest() == built["sha256"]
    sums = files["1panel/v2/stable/v2.3.2/release/checksums.txt"].read_text()
    assert sums == f"{built['sha256']}  1panel-v2.3.2-linux-amd64.tar.gz\n"  # goreleaser's
    assert files["1panel/v2/stable/latest"].read_text() == "v2.3.2"
    facts = onepanel.facts("http://127.0.0.1:8765/", built)
    assert facts["panel_url"].format(version="v2.3.2", arch="amd64") == (
        "http://127.0.0.1:8765/" + path
    )
    assert facts["panel_sha256"] == built["sha256"]
    assert facts["panel_checksums_url"].endswith("/v2.3.2/release/checksums.txt")


# --------------------------------------------------------------------------- the stand-ins


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Panel:
    """An installed stand-in below tmp: 1pctl edited as install.sh edits it, a PATH with a
    systemctl that records its arguments and a 1panel link to the core."""

    def __init__(self, tmp: Path, top: Path, port: int, password: str) -> None:
        self.tmp, self.top, self.port, self.password = tmp, top, port, password
        self.base = tmp / "opt"
        self.ctl = tmp / "1pctl"
        self.bin = tmp / "bin"
        self.bin.mkdir()
        (self.bin / "1panel").symlink_to(top / "1panel-core")
        self.calls = tmp / "systemctl.calls"
        systemctl = self.bin / "systemctl"
        systemctl.write_text(f'#!/bin/sh\necho "$@" >> {self.calls}\n')
        systemctl.chmod(0o755)
        self.set_ctl(
            BASE_DIR=str(self.base),
            ORIGINAL_PORT=str(port),
            ORIGINAL_ENTRANCE="entr4nce",
            ORIGINAL_USERNAME="panel_admin",
            ORIGINAL_PASSWORD=password,
            LANGUAGE="en",
            PANEL_EDITION="intl",
        )
        self.env = {
            **os.environ,
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "GPUBOX_STANDIN_1PCTL": str(self.ctl),
            "GPUBOX_STANDIN_AGENT_SOCK": str(tmp / "etc1panel" / "agent.sock"),
        }
        self.db = self.base / "1panel" / "db" / "core.db"

    def set_ctl(self, **values: str) -> None:
        source = self.ctl if self.ctl.exists() else self.top / "1pctl"
        lines = source.read_text().splitlines()
        for key, value in values.items():
            found = [i for i, line in enumerate(lines) if line.startswith(f"{key}=")]
            if found:
                lines[found[0]] = f"{key}={value}"
            else:  # after LANGUAGE=, as install.sh puts CHANGE_USER_INFO
                at = next(i for i, line in enumerate(lines) if line.startswith("LANGUAGE="))
                lines.insert(at + 1, f"{key}={value}")
        self.ctl.write_text("\n".join(lines) + "\n")
        self.ctl.chmod(0o755)

    def setting(self, key: str) -> str | None:
        with sqlite3.connect(self.db) as conn:
            row = conn.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def loopback(self) -> None:
        """Servers in tests bind loopback: BindAddress is put in before the first start."""
        self.db.parent.mkdir(parents=True, exist_ok=True)
        core = load_core()
        conn = core.open_db(str(self.db))
        core.put(conn, "BindAddress", "127.0.0.1")
        conn.close()

    def cli(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "1panel"), "-l", "en", *args],
            input=stdin,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def serve(self, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(self.top / "1panel-core")], env=self.env, stdout=out, stderr=out
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"the core exited {proc.returncode}: {log.read_text()}")
            port = int(self.setting("ServerPort") or 0) if self.db.exists() else 0
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return proc
            except OSError:
                time.sleep(0.1)
        stop(proc)
        raise AssertionError(f"the core did not listen: {log.read_text()}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()  # by PID
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def load_core() -> types.ModuleType:
    path = onepanel.STANDIN_DIR / "1panel-core"
    loader = importlib.machinery.SourceFileLoader("standin_1panel_core", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def get(port: int, path: str) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read().decode()
    finally:
        conn.close()


def is_spa(body: str) -> bool:
    return all(
        m in body for m in ("<title>loading...</title>", '<div id="app">', "first-loading-wrap")
    )


def is_no_route(body: str) -> bool:
    return "Access Temporarily Unavailable" in body and "1pctl user-info" in body


@pytest.fixture
def panel(package: bytes, tmp_path: Path) -> Panel:
    top = extract(package, tmp_path / "pkg")
    return Panel(tmp_path, top, free_port(), "S3cret_pass.1")


def test_first_start_seeds_and_serves_the_entrance(panel: Panel, tmp_path: Path) -> None:
    panel.loopback()
    log = tmp_path / "core.log"
    proc = panel.serve(log)
    try:
        assert panel.setting("ServerPort") == str(panel.port)
        assert panel.setting("SecurityEntrance") == "entr4nce"
        assert panel.setting("UserName") == "panel_admin"
        assert panel.setting("Language") == "en"
        assert panel.setting("SystemVersion") == "v2.3.2"
        assert panel.setting("NoAuthSetting") == "200" and panel.setting("Ipv6") == "disable"
        stored = panel.setting("Password") or ""
        assert panel.password not in stored and stored.startswith("pbkdf2_sha256$")
        status, ctype, body = get(panel.port, "/entr4nce")
        assert (status, ctype.split(";")[0]) == (200, "text/html") and is_spa(body)
        assert not is_no_route(body)
        for wrong in ("/", "/wrong", "/api/v2/core/auth/login"):
            status, _, body = get(panel.port, wrong)
            assert status == 200 and is_no_route(body) and not is_spa(body), wrong
    finally:
        stop(proc)
    assert proc.returncode == 0
    assert panel.password not in log.read_text()
    # the first start does not mask 1pctl: install.sh's Check_Ready does
    assert f"ORIGINAL_PASSWORD={panel.password}" in panel.ctl.read_text()


def test_a_core_without_a_port_says_which_key(panel: Panel) -> None:
    panel.loopback()
    panel.set_ctl(ORIGINAL_PORT="port")  # 1pctl's placeholder, as install.sh had not edited it
    result = subprocess.run(
        [str(panel.top / "1panel-core")], env=panel.env, capture_output=True, text=True, timeout=20
    )
    assert result.returncode != 0
    assert "ServerPort='port' is not a port (1pctl ORIGINAL_PORT)" in result.stderr


def test_defaults_of_a_first_start() -> None:
    core = load_core()
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE settings (id INTEGER PRIMARY KEY, key TEXT UNIQUE, value TEXT)")
    assert core.seed(conn, {"ORIGINAL_PORT": "20410", "ORIGINAL_VERSION": "v2.3.2"}) is True
    assert core.get(conn, "BindAddress") == "0.0.0.0"
    assert core.seed(conn, {"ORIGINAL_PORT": "1"}) is False  # only once
    assert core.get(conn, "ServerPort") == "20410"


def test_change_user_info_use_existing_is_applied_then_removed(
    panel: Panel, tmp_path: Path
) -> None:
    panel.loopback()
    log = tmp_path / "core.log"
    stop(panel.serve(log))
    new_port = free_port()
    panel.set_ctl(
        ORIGINAL_PORT=str(new_port),
        ORIGINAL_USERNAME="other_admin",
        ORIGINAL_PASSWORD="N3w-password",
        ORIGINAL_ENTRANCE="n3wway",
        CHANGE_USER_INFO="use_existing",
    )
    proc = panel.serve(log)
    try:
        assert panel.setting("ServerPort") == str(new_port)
        assert panel.setting("UserName") == "other_admin"
        assert panel.setting("SecurityEntrance") == "n3wway"
        core = load_core()
        stored = panel.setting("Password") or ""
        _, rounds, salt, digest = stored.split("$")
        assert (
            hashlib.pbkdf2_hmac("sha256", b"N3w-password", salt.encode(), int(rounds)).hex()
            == digest
        )
        assert core.MASK == "**********"
        assert is_spa(get(new_port, "/n3wway")[2]) and is_no_route(get(new_port, "/entr4nce")[2])
    finally:
        stop(proc)
    lines = panel.ctl.read_text().splitlines()
    assert "ORIGINAL_PASSWORD=**********" in lines
    assert not [line for line in lines if line.startswith("CHANGE_USER_INFO")]
    assert "ORIGINAL_USERNAME=other_admin" in lines
    assert "N3w-password" not in log.read_text()


def test_cli_version_user_info_update_port_and_username(panel: Panel, tmp_path: Path) -> None:
    panel.loopback()
    stop(panel.serve(tmp_path / "core.log"))
    assert panel.cli("version").stdout == "version: v2.3.2\nmode: stable\n"
    info = panel.cli("user-info").stdout.splitlines()
    assert info == [
        f"Panel address: http://$LOCAL_IP:{panel.port}/entr4nce ",
        "Panel user: panel_admin",
        "Panel password: ********",
        "Tip: To change the password, you can execute the command: 1pctl update password",
    ]
    new_port = free_port()
    result = panel.cli("update", "port", stdin=f"{new_port}\n")
    assert result.returncode == 0
    assert result.stdout.endswith(f"Update successful!\nPanel Port: {new_port}\n")
    assert panel.setting("ServerPort") == str(new_port)
    assert panel.calls.read_text() == "restart 1panel-core.service\n"
    bad = panel.cli("update", "port", stdin="70000\n")
    assert "Update successful!" not in bad.stdout and panel.setting("ServerPort") == str(new_port)
    assert panel.cli("update", "username", stdin="ab\n").stdout.count("Error") == 1
    ok = panel.cli("update", "username", stdin="new_admin\n")
    assert (
        ok.stdout.endswith("Panel user: new_admin\n") and panel.setting("UserName") == "new_admin"
    )
    assert panel.cli("update", "password").returncode == 1  # needs a terminal
    panel.cli("update", "version", "v2.3.3")
    assert panel.cli("version").stdout.splitlines()[0] == "version: v2.3.3"
    out = panel.cli("listen-ip", "ipv6").stdout
    assert out == "Switch successful! Now listening on  tcp6 [::]\n"
    assert (panel.setting("BindAddress"), panel.setting("Ipv6")) == ("::", "enable")
    panel.cli("reset", "entrance")
    assert panel.setting("SecurityEntrance") == ""


def test_1pctl_drives_systemctl_and_the_cli(panel: Panel, tmp_path: Path) -> None:
    panel.loopback()
    stop(panel.serve(tmp_path / "core.log"))

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(panel.ctl), *args],
            env=panel.env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    assert ctl("restart", "core").returncode == 0
    assert ctl("stop", "all").returncode == 0
    assert ctl("status", "agent").returncode == 0
    assert panel.calls.read_text().splitlines() == [
        "restart 1panel-core.service",
        "stop 1panel-core.service",
        "stop 1panel-agent.service",
        "status 1panel-agent.service",
    ]
    assert ctl("version").stdout == "version: v2.3.2\nmode: stable\n"
    assert "Panel user: panel_admin" in ctl("user-info").stdout
    assert ctl("restart", "nothing").returncode == 1


def test_the_agent_listens_on_its_socket(panel: Panel, tmp_path: Path) -> None:
    sock = Path(panel.env["GPUBOX_STANDIN_AGENT_SOCK"])
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(panel.top / "1panel-agent")], env=panel.env, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        assert oct(sock.parent.stat().st_mode & 0o777) == "0o700"
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(sock))
            s.sendall(b"GET /api/v2/health HTTP/1.0\r\nHost: agent\r\n\r\n")
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200") and json.loads(body)["code"] == 200
        agent_db = panel.base / "1panel" / "db" / "agent.db"
        with sqlite3.connect(agent_db) as conn:
            row = conn.execute("SELECT value FROM settings WHERE key = 'SystemVersion'").fetchone()
        assert row == ("v2.3.2",)
    finally:
        stop(proc)
    assert proc.returncode == 0


# --------------------------------------------------------------------------- the box record


def lay_out(top: Path, root: Path, password: str) -> None:
    """What install.sh's Init_Panel and Check_Ready leave, below ``root`` (base dir /opt)."""
    usr_local = root / "usr/local/bin"
    usr_local.mkdir(parents=True)
    for name in ("1panel-core", "1panel-agent", "1pctl"):
        shutil.copy(top / name, usr_local / name)
        (usr_local / name).chmod(0o755)
    usr_bin = root / "usr/bin"
    usr_bin.mkdir(parents=True)
    for link, target in (
        ("1panel", "1panel-core"),
        ("1panel-core", "1panel-core"),
        ("1panel-agent", "1panel-agent"),
        ("1pctl", "1pctl"),
    ):
        (usr_bin / link).symlink_to(f"/usr/local/bin/{target}")
    ctl = usr_local / "1pctl"
    text = ctl.read_text().replace("BASE_DIR=directory", "BASE_DIR=/opt")
    ctl.write_text(text.replace("ORIGINAL_PASSWORD=password", f"ORIGINAL_PASSWORD={password}"))
    run = root / "opt/1panel"
    (run / "geo").mkdir(parents=True)
    shutil.copy(top / "GeoIP.mmdb", run / "geo/GeoIP.mmdb")
    shutil.copytree(top / "lang", usr_local / "lang")
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    for service in ("core", "agent"):
        shutil.copy(top / f"initscript/1panel-{service}.service", units)
    (run / "resource").mkdir()
    shutil.copytree(top / "initscript", run / "resource/initscript")
    (run / "db").mkdir()
    (run / "db/core.db").write_bytes(b"SQLite format 3\0")
    (root / "etc/1panel").mkdir(mode=0o700)
    (root / "etc/1panel").chmod(0o700)
    # Check_Ready masks the password
    ctl.write_text(ctl.read_text().replace(f"ORIGINAL_PASSWORD={password}", panel_record.MASK))


def probe(root: Path, password: str | None = "Pw_0123456789") -> list[str]:
    def run(script: str) -> str:
        return subprocess.run(
            ["bash", "-s"], input=script, capture_output=True, text=True, timeout=60, check=True
        ).stdout

    return panel_record.check(
        run, "/opt", version="v2.3.2", password=password, services=False, root=str(root)
    )


@pytest.fixture
def box_tree(package: bytes, tmp_path: Path):  # type: ignore[no-untyped-def]
    top = extract(package, tmp_path / "pkg")
    # a short root: the agent socket's path must fit in sun_path
    root = Path(f"/tmp/gpubox-panel-{os.getpid()}-{tmp_path.name[-12:]}")
    shutil.rmtree(root, ignore_errors=True)
    lay_out(top, root, "Pw_0123456789")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "etc/1panel/agent.sock"))
    listener.listen(1)
    try:
        yield root
    finally:
        listener.close()
        shutil.rmtree(root, ignore_errors=True)


def test_the_record_accepts_the_installers_layout(box_tree: Path) -> None:
    assert probe(box_tree) == []


def test_the_record_names_each_deviation(box_tree: Path) -> None:
    root = box_tree
    (root / "usr/local/bin/1pctl").chmod(0o644)
    (root / "usr/bin/1panel").unlink()
    (root / "usr/bin/1panel").symlink_to("/usr/local/bin/1panel-agent")
    unit = root / "etc/systemd/system/1panel-agent.service"
    unit.write_text(unit.read_text().replace("KillMode=process\n", ""))
    (root / "opt/1panel/geo/GeoIP.mmdb").unlink()
    (root / "etc/1panel").chmod(0o755)
    pkg = root / "root/1panel-v2.3.2-linux-amd64"
    pkg.mkdir(parents=True)
    (pkg / "install.log").write_text("Panel password: Pw_0123456789\n")
    problems = "\n".join(probe(root))
    assert "/usr/local/bin/1pctl: not an executable file" in problems
    assert "/usr/bin/1panel: links to '/usr/local/bin/1panel-agent'" in problems
    assert "1panel-agent.service: has no line 'KillMode=process'" in problems
    assert "1panel-agent.service: differs from /opt/1panel/resource/initscript" in problems
    assert "/opt/1panel/geo/GeoIP.mmdb: not a regular file" in problems
    assert "/etc/1panel: mode 755, not 700" in problems
    assert "holds install.log" in problems
    assert "the panel password is in clear text in: " in problems
    assert "root/1panel-v2.3.2-linux-amd64/install.log" in problems
    assert len(problems.splitlines()) == 8, problems


def test_the_record_sees_an_unmasked_password_and_a_leftover_change_line(box_tree: Path) -> None:
    ctl = box_tree / "usr/local/bin/1pctl"
    text = ctl.read_text().replace(panel_record.MASK, "ORIGINAL_PASSWORD=Pw_0123456789")
    ctl.write_text(text.replace("LANGUAGE=en\n", "LANGUAGE=en\nCHANGE_USER_INFO=use_existing\n"))
    problems = "\n".join(probe(box_tree))
    assert "has no line 'ORIGINAL_PASSWORD=**********'" in problems
    assert "still has a line beginning 'CHANGE_USER_INFO='" in problems
    assert "clear text in: " in problems and "/usr/local/bin/1pctl" in problems
    assert probe(box_tree, password=None)  # the layout facts alone see it too
