"""The panel's keys and pure rules (gpubox.knowledge.panel, docs/panel.md): gpubox check accepts
panel: "1panel" and refuses a bad panel_port, user, entrance or directory, naming the key;
the package for the box's architecture and its sha256 from the catalog (an architecture with
none is refused naming the catalog_overrides key); the box's state parsed from its sections;
what the stage decides (install, keep, converge, upgrade, refuse)."""

from __future__ import annotations

from helpers import REFERENCE

from gpubox import parsers
from gpubox.cli import main
from gpubox.config import load_host_config, validate
from gpubox.config.validation import HOSTENGINE_PORT
from gpubox.knowledge import panel
from gpubox.stages import dcgm

PANEL = {**REFERENCE, "panel": "1panel"}
SHA = "f1265a4fadeaab3d7066dd71e3c6904ac54bb687baab1b205a23c369abb61cac"


def errors(**data: object) -> list[str]:
    _, problems = validate("box", {**PANEL, **data})
    return [f"{p.key}: {p.message}" for p in problems if p.severity == "error"]


def test_gpubox_check_accepts_a_panel_and_refuses_a_bad_port(tmp_path, capsys):
    good = tmp_path / "good.py"
    good.write_text("hosts = [('a', {'ssh_hostname': '192.0.2.1', 'panel': '1panel'})]\n")
    assert main(["check", str(good)]) == 0
    bad = tmp_path / "bad.py"
    bad.write_text(
        "hosts = [('a', {'ssh_hostname': '192.0.2.1', 'panel': '1panel', 'panel_port': 70000}),\n"
        "         ('b', {'ssh_hostname': '192.0.2.2', 'panel': '1panel', 'panel_port': 8080})]\n"
    )
    assert main(["check", str(bad)]) == 2
    out = capsys.readouterr().out
    assert "error: a: panel_port: must be 1 to 65535, got 70000" in out
    assert "error: b: panel_port: 8080 is also api_port's port: choose another for the panel" in out


def test_the_keys_defaults_and_choices():
    config = load_host_config("box", PANEL)
    assert (config.panel_port, config.panel_user, config.panel_entrance) == (10100, "gpubox", None)
    assert (config.panel_edition, config.panel_version_policy, config.panel_dir) == (
        "intl",
        "warn",
        "/opt",
    )
    assert load_host_config("box", REFERENCE).panel == "none"
    assert errors(panel="1panel-v1") == ["panel: must be one of 'none', '1panel', got '1panel-v1'"]
    assert errors(panel_edition="us") == ["panel_edition: must be one of 'intl', 'cn', got 'us'"]
    assert errors(panel_version_policy="upgrade") == [
        "panel_version_policy: must be one of 'warn', 'converge', got 'upgrade'"
    ]


def test_the_port_clashes_with_the_boxs_other_ports():
    assert errors(panel_port=22) == [
        "panel_port: 22 is also ssh_port's port: choose another for the panel"
    ]
    assert errors(panel_port=2222, ssh_port=2222) == [
        "panel_port: 2222 is also ssh_port's port: choose another for the panel"
    ]
    assert errors(panel_port=9400) == []  # dcgm-exporter is off
    assert errors(panel_port=9400, dcgm_exporter=True) == [
        "panel_port: 9400 is also dcgm_exporter_port's port: choose another for the panel"
    ]
    assert errors(panel_port=5555) == [
        "panel_port: 5555 is also nv-hostengine (DCGM)'s port: choose another for the panel"
    ]
    assert HOSTENGINE_PORT == dcgm.HOSTENGINE_PORT
    assert errors(panel_port=0) == ["panel_port: must be 1 to 65535, got 0"]
    # without a panel its keys are not judged
    _, problems = validate("box", {**REFERENCE, "panel_port": 8080})
    assert not [p for p in problems if p.severity == "error"]


def test_the_user_entrance_and_dir_rules():
    assert errors(panel_user="ab") == [
        "panel_user: must be 3 to 30 of a-z, A-Z, 0-9 and _, got 'ab'"
    ]
    assert errors(panel_user="admin-1") == [
        "panel_user: must be 3 to 30 of a-z, A-Z, 0-9 and _, got 'admin-1'"
    ]
    assert errors(panel_entrance="x" * 31) == [
        f"panel_entrance: must be 3 to 30 of a-z, A-Z, 0-9 and _, got {'x' * 31!r}"
    ]
    assert errors(panel_entrance="my_Entrance_42", panel_user="ops_team") == []
    assert errors(panel_dir="opt") == [
        "panel_dir: must be an absolute directory like '/opt', got 'opt'"
    ]
    assert errors(panel_dir="/") == [
        "panel_dir: must be an absolute directory like '/opt', got '/'"
    ]
    assert errors(panel_dir="/srv/panel") == []


def test_the_package_for_the_boxs_architecture():
    config = load_host_config("box", PANEL)
    assert panel.onepanel_arch("amd64\n") == "amd64" and panel.onepanel_arch("armhf") == "armv7"
    p = panel.package(config, "amd64")
    assert p.url == (
        "https://resource.1panel.pro/v2/stable/v2.3.2/release/1panel-v2.3.2-linux-amd64.tar.gz"
    )
    assert p.sha256 == SHA
    assert p.tarball == "/var/cache/gpubox/panel/1panel-v2.3.2-linux-amd64.tar.gz"
    cn = panel.package(load_host_config("box", {**PANEL, "panel_edition": "cn"}), "amd64")
    assert cn.url.startswith("https://resource.fit2cloud.com/1panel/package/v2/stable/v2.3.2/")
    assert panel.arch_problem(config, "amd64") is None
    assert panel.arch_problem(config, "arm64") == (
        "the catalog records no sha256 of 1Panel's package for arm64: set catalog_overrides "
        "panel.onepanel.sha256.arm64 (from the release's checksums.txt)"
    )
    mirrored = load_host_config(
        "box",
        {
            **PANEL,
            "catalog_overrides": {
                "panel.onepanel.sha256.arm64": "ab" * 32,
                "panel.onepanel.url.intl": "http://mirror.example/{version}/{arch}.tgz",
            },
        },
    )
    assert panel.arch_problem(mirrored, "arm64") is None
    assert panel.package(mirrored, "arm64").url == "http://mirror.example/v2.3.2/arm64.tgz"
    assert "no package for architecture 'i386'" in str(panel.arch_problem(config, "i386"))


def state_text(**over: str) -> str:
    parts = {
        "ctl": "BASE_DIR=/opt\nORIGINAL_PORT=10100\nORIGINAL_VERSION=v2.3.2\n"
        "ORIGINAL_USERNAME=gpubox\nLANGUAGE=en\nPANEL_EDITION=intl\nPASSWORD=masked\n",
        "units": "Id=1panel-core.service\nLoadState=loaded\nActiveState=active\n"
        "UnitFileState=enabled\n\nId=1panel-agent.service\nLoadState=loaded\n"
        "ActiveState=active\nUnitFileState=enabled\n",
        "info": "port=10100\nuser=gpubox\nentrance=same\n",
        "version": "v2.3.2\n",
        "socket": "yes\n",
        "entrance_file": "0" * 64 + "\n",
        "page": "status=200\nmark=0\nmark=1\nmark=2\n",
        **over,
    }
    return "".join(f"{parsers.SECTION}{k}\n{v}" for k, v in parts.items())


FRESH = panel.parse_state(
    state_text(ctl="", info="", version="", socket="no\n", entrance_file="", page="")
)
EMPTY_DIR = panel.DirState(False, False, False, "amd64", (), True)


def test_the_state_parsed():
    s = panel.parse_state(state_text())
    assert s.installed and s.installed_version == "v2.3.2" and s.port == 10100
    assert s.unit("1panel-core") == ("active", "enabled") and s.socket
    assert (s.page, s.page_status, s.entrance) == ("login", 200, "same")
    wrong = panel.parse_state(state_text(page="status=200\nunavailable\n"))
    assert wrong.page == "unavailable"
    assert not FRESH.installed and FRESH.unit("1panel-core") == ("active", "enabled")
    missing = panel.parse_state(
        state_text(units="Id=1panel-core.service\nLoadState=not-found\nActiveState=inactive\n")
    )
    assert missing.unit("1panel-core") == ("missing", "missing")
    assert panel.parse_dir("dir=full\ndb=yes\narch=amd64\nlisten=LISTEN 0 4096 *:10100\n") == (
        panel.DirState(True, True, False, "amd64", ("LISTEN 0 4096 *:10100",), False)
    )


def test_the_decisions():
    config = load_host_config("box", PANEL)
    assert panel.plan(config, FRESH, EMPTY_DIR).action == "install"
    kept = panel.plan(config, panel.parse_state(state_text()), EMPTY_DIR)
    assert (kept.action, kept.differs, kept.warnings, kept.refused) == ("keep", [], [], [])
    moved = panel.plan(
        config,
        panel.parse_state(state_text(info="port=20000\nuser=gpubox\nentrance=same\n")),
        EMPTY_DIR,
    )
    assert (moved.action, moved.use_existing) == ("converge", True)
    assert moved.differs == ["panel_port (the panel has 20000)"]
    old = panel.parse_state(state_text(version="v2.2.5\n"))
    warned = panel.plan(config, old, EMPTY_DIR)
    assert warned.action == "keep" and warned.warnings == [
        "1Panel v2.2.5 is installed, the catalog pins v2.3.2: kept (panel_version_policy: "
        "converge installs the pin)"
    ]
    converge = load_host_config("box", {**PANEL, "panel_version_policy": "converge"})
    assert panel.plan(converge, old, EMPTY_DIR).action == "upgrade"


def test_the_refusals_name_the_key():
    config = load_host_config("box", PANEL)
    full = panel.DirState(True, False, False, "amd64", (), True)
    assert panel.plan(config, FRESH, full).refused == [
        "panel_dir: /opt/1panel exists and holds files but no 1Panel database (db/core.db) and no "
        "gpubox marker: 1Panel's installer would delete them; move them away or choose another "
        "panel_dir"
    ]
    ours = panel.DirState(True, False, True, "amd64", (), True)
    assert panel.plan(config, FRESH, ours).refused == []
    data = panel.DirState(True, True, False, "amd64", (), True)
    kept_data = panel.plan(config, FRESH, data)
    assert kept_data.refused == [] and kept_data.use_existing
    arm = panel.DirState(False, False, False, "arm64", (), True)
    assert panel.plan(config, FRESH, arm).refused == [
        "panel: the catalog records no sha256 of 1Panel's package for arm64: set "
        "catalog_overrides panel.onepanel.sha256.arm64 (from the release's checksums.txt)"
    ]
    taken = panel.DirState(
        False, False, False, "amd64", ('LISTEN *:10100 users:(("nginx"))',), True
    )
    assert (
        panel.plan(config, FRESH, taken)
        .refused[0]
        .startswith("panel_port: 10100 is taken by another program")
    )
    v1 = panel.parse_state(state_text(version="v1.10.3\n"))
    assert panel.plan(config, v1, EMPTY_DIR).refused[0].startswith("panel: 1Panel v1.10.3 (v1)")


def test_the_settings_problems_never_show_the_entrance():
    config = load_host_config("box", {**PANEL, "panel_entrance": "secret_path_1"})
    state = panel.parse_state(
        state_text(
            info="port=10100\nuser=gpubox\nentrance=same\n",
            ctl="ORIGINAL_VERSION=v2.3.2\nPASSWORD=clear\n",
        )
    )
    found = panel.ctl_problems(config, state, panel.entrance_digest("secret_path_1"))
    assert found == [
        "the entrance kept by gpubox is not the inventory's panel_entrance",
        "/usr/local/bin/1pctl holds the password in clear (not masked)",
    ]
    assert not any("secret_path_1" in f for f in found)


def test_the_state_command_reads_1pctl_and_user_info_and_keeps_the_password(tmp_path):
    """The state fact run in a shell against a 1pctl of the installer's shape (variables at
    the start of lines, commands that print user-info's lines): the password is only ever
    reported as masked or clear, the entrance only as the same as gpubox's file or not."""
    import subprocess

    from gpubox.base import layout

    config = load_host_config("box", PANEL)
    entrance = tmp_path / "entrance"
    entrance.write_text("Entr4nce\n")
    ctl = tmp_path / "1pctl"

    def run(password: str, address_path: str) -> panel.PanelState:
        ctl.write_text(
            "#!/bin/sh\nBASE_DIR=/opt\nORIGINAL_PORT=10100\nORIGINAL_VERSION=v2.3.2\n"
            f"ORIGINAL_USERNAME=gpubox\nORIGINAL_PASSWORD={password}\nLANGUAGE=en\n"
            "PANEL_EDITION=intl\n"
            'case "$1" in\n'
            f"user-info) printf 'Panel address: http://$LOCAL_IP:10100/{address_path} \\n"
            f"Panel user: gpubox\\nPanel password: {password}\\n' ;;\n"
            "version) printf 'version: v2.3.2\\nmode: stable\\n' ;;\nesac\n"
        )
        ctl.chmod(0o755)
        command = (
            panel.state_command(config)
            .replace(layout.PANEL_CTL, str(ctl))
            .replace(layout.PANEL_ENTRANCE, str(entrance))
        )
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
        assert password not in out.stdout or password == panel.MASKED
        assert "Entr4nce" not in out.stdout
        return panel.parse_state(out.stdout)

    masked = run(panel.MASKED, "Entr4nce")
    assert masked.ctl["PASSWORD"] == "masked" and masked.ctl["ORIGINAL_PORT"] == "10100"
    assert (masked.port, masked.user, masked.entrance, masked.version) == (
        10100,
        "gpubox",
        "same",
        "v2.3.2",
    )
    clear = run("Clear1234567", "other_path")
    assert clear.ctl["PASSWORD"] == "clear" and clear.entrance == "differs"
    assert run(panel.MASKED, "").entrance == "none"
    # 1pctl's template after an upgrade from 1Panel's own page: its placeholder, not a password
    assert run("password", "Entr4nce").ctl["PASSWORD"] == "placeholder"


def test_a_newer_panel_is_never_downgraded():
    """An owner's upgrade from 1Panel's own page (core/app/service/upgrade.go) has migrated
    the panel's databases: panel_version_policy converge refuses, naming both versions; warn
    keeps it with a note, and the settings check does not fail on it."""
    newer = panel.parse_state(state_text(version="v2.4.0\n"))
    converge = load_host_config("box", {**PANEL, "panel_version_policy": "converge"})
    refused = panel.plan(converge, newer, EMPTY_DIR)
    assert refused.action != "upgrade"
    assert len(refused.refused) == 1
    assert refused.refused[0].startswith("panel_version_policy: 1Panel v2.4.0 is installed")
    assert "newer than the catalog's v2.3.2" in refused.refused[0]
    warn = load_host_config("box", PANEL)
    kept = panel.plan(warn, newer, EMPTY_DIR)
    assert (kept.action, kept.warnings, kept.refused) == ("keep", [], [])
    assert kept.notes == [
        "1Panel v2.4.0 is installed, newer than the catalog's v2.3.2: kept (gpubox never "
        "downgrades a panel)"
    ]
    assert panel.ctl_problems(warn, newer, None) == []
    assert panel.ctl_problems(converge, newer, None) == [
        "1Panel v2.4.0 is installed, the catalog pins v2.3.2"
    ]
    # an older one still warns, and converges with converge
    assert panel.newer_than("v2.10.0", "v2.3.2") and not panel.newer_than("v2.2.5", "v2.3.2")
    assert not panel.newer_than("unknown", "v2.3.2")


# 1pctl after an upgrade from 1Panel's own page: the package's 1pctl (1Panel-dev/installer
# branch v2 1pctl), only BASE_DIR set by upgrade.go, no PANEL_EDITION line
TEMPLATE_CTL = (
    "BASE_DIR=/opt\nORIGINAL_PORT=port\nORIGINAL_VERSION=version\n"
    "ORIGINAL_USERNAME=username\nLANGUAGE=en\nPASSWORD=placeholder\n"
)


def test_1pctls_template_placeholders_are_no_settings():
    config = load_host_config("box", PANEL)
    state = panel.parse_state(state_text(ctl=TEMPLATE_CTL))
    assert state.from_template and state.edition is None
    kept = panel.plan(config, state, EMPTY_DIR)
    assert (kept.action, kept.differs, kept.refused) == ("keep", [], [])
    assert kept.mask  # the keep path masks the placeholder as Check_Ready would
    assert panel.ctl_problems(config, state, None) == []
    unknown = panel.parse_state(state_text(ctl=TEMPLATE_CTL, version=""))
    assert unknown.installed_version is None
    at_pin = panel.parse_state(state_text())
    assert not panel.plan(config, at_pin, EMPTY_DIR).mask
    clear = panel.parse_state(state_text(ctl="BASE_DIR=/opt\nPANEL_EDITION=intl\nPASSWORD=clear\n"))
    assert panel.plan(config, clear, EMPTY_DIR).mask


def test_an_edition_change_on_an_installed_panel_is_refused():
    """The core reads its edition from its database; CHANGE_USER_INFO=use_existing (1Panel-dev/
    1Panel core/init/hook/hook.go) does not copy PANEL_EDITION: refused, never converged."""
    config = load_host_config("box", PANEL)
    cn = panel.parse_state(
        state_text(
            ctl="BASE_DIR=/opt\nORIGINAL_PORT=10100\nORIGINAL_VERSION=v2.3.2\n"
            "ORIGINAL_USERNAME=gpubox\nLANGUAGE=en\nPANEL_EDITION=cn\nPASSWORD=masked\n"
        )
    )
    result = panel.plan(config, cn, EMPTY_DIR)
    assert result.differs == []
    assert result.refused == [
        "panel_edition: the installed panel is the 'cn' edition, the inventory says 'intl'; "
        "1Panel keeps its edition in its database and gpubox cannot change it on an installed "
        'panel: set "panel_edition": "cn" (or uninstall the panel and deploy again)'
    ]
    same = load_host_config("box", {**PANEL, "panel_edition": "cn"})
    assert panel.plan(same, cn, EMPTY_DIR).refused == []
    # no PANEL_EDITION line: the edition is not known, nothing refused nor converged
    none = panel.parse_state(
        state_text(ctl="BASE_DIR=/opt\nORIGINAL_PORT=10100\nPASSWORD=masked\n")
    )
    assert (panel.plan(config, none, EMPTY_DIR).refused, none.edition) == ([], None)
