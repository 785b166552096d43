"""The panel's stage (gpubox.stages.panel, docs/panel.md) against recorded facts, Ubuntu 24.04
and Debian 12: a fresh box gets install.sh's steps (never install.sh itself), the password and
entrance generated on the box and never on a command line; a box with the panel at the pin
plans nothing; another version warns or converges by panel_version_policy; settings that
differ are converged through 1pctl's CHANGE_USER_INFO; a refused box changes nothing; with
panel none the stage plans nothing at all. And the Docker stages repair a daemon.json that
1Panel's installer replaced with its own (only registry-mirrors)."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import REFERENCE, fresh_box
from test_model_download_plan import uploads

from gpubox import parsers
from gpubox.base import layout
from gpubox.base.errors import DeployRefused
from gpubox.commands import deploying
from gpubox.knowledge import panel as rules
from gpubox.stages import container_toolkit, panel
from gpubox.stages.panel import CONF, SCRIPT, conf_text, script_text

PANEL = {**REFERENCE, "panel": "1panel"}
OSES = ("ubuntu2404", "debian12")
TARBALL = "/var/cache/gpubox/panel/1panel-v2.3.2-linux-amd64.tar.gz"


def section(name: str, text: str) -> str:
    return f"{parsers.SECTION}{name}\n{text}"


def installed(version: str = "v2.3.2", port: int = 10100, user: str = "gpubox") -> str:
    """The state fact of a box where the panel is installed and running."""
    unit = "Id={}.service\nLoadState=loaded\nActiveState=active\nUnitFileState=enabled\n"
    return (
        section(
            "ctl",
            f"BASE_DIR=/opt\nORIGINAL_PORT={port}\nORIGINAL_VERSION={version}\n"
            f"ORIGINAL_USERNAME={user}\nLANGUAGE=en\nPANEL_EDITION=intl\nPASSWORD=masked\n",
        )
        + section("units", unit.format("1panel-core") + "\n" + unit.format("1panel-agent"))
        + section("info", f"port={port}\nuser={user}\nentrance=same\n")
        + section("version", f"{version}\n")
        + section("socket", "yes\n")
        + section("entrance_file", "0" * 64 + "\n")
        + section("page", "status=200\nmark=0\nmark=1\nmark=2\n")
    ).splitlines()


def digest_line(path: str, text: str, mode: str) -> str:
    return f"{path} {mode} {hashlib.sha256(text.encode()).hexdigest()}"


def box(os_name: str, *, state: list[str] | None = None, where: str = "", **more: object):
    """Facts of a box: fresh, or with the panel (``state``) installed and converged."""
    answers = fresh_box(os_name)
    answers["@@gpubox ctl"] = state or []
    answers["dpkg --print-architecture"] = (where or "dir=empty\narch=amd64\ncurl=yes").splitlines()
    if state:
        from gpubox.config import load_host_config

        config = load_host_config("box", PANEL)
        package = rules.package(config, "amd64")
        answers["/etc/gpubox/panel-password /etc/gpubox/panel-entrance; do"] = [
            layout.PANEL_PASSWORD,
            layout.PANEL_ENTRANCE,
        ]
        answers[f"for p in {CONF};"] = [digest_line(CONF, conf_text(config, package), "644")]
        answers[f"for p in {SCRIPT};"] = [digest_line(SCRIPT, script_text(), "755")]
        for prop, value in (("SubState", "running"), ("UnitFileState", "enabled")):
            for unit in ("1panel-core", "1panel-agent"):
                answers[f"--property {prop} {unit}.service"] = [
                    f"Id={unit}.service",
                    f"{prop}={value}",
                ]
    answers.update(more)
    return answers


def short(names: list[str]) -> list[str]:
    """The stage's own operations' names: without preflight's wait for dpkg's lock (every
    stage's first, gpubox.preflight.dpkg_ready, tests/ops/test_dpkg_ready_plan.py)."""
    return [n.rsplit(" | ", 1)[-1] for n in names if "for dpkg's lock" not in n]


def own_commands(plan) -> list[str]:
    return [c for name, cmds in plan.ops if "for dpkg's lock" not in name for c in cmds]


@pytest.mark.parametrize("os_name", OSES)
def test_a_fresh_box_gets_install_shs_steps(plan_of, os_name):
    plan = plan_of(panel.panel, PANEL, box(os_name))
    assert short(plan.names) == [
        "Generate the panel's password (/etc/gpubox/panel-password, root only)",
        "Generate the panel's entrance (/etc/gpubox/panel-entrance, root only)",
        "The panel's settings for gpubox-panel (no secret)",
        "gpubox-panel (install.sh's steps)",
        "The panel's download cache (/var/cache/gpubox/panel)",
        "Download and verify 1panel-v2.3.2-linux-amd64.tar.gz",
        "Unpack 1Panel v2.3.2",
        "1Panel's binaries and 1pctl in /usr/local/bin, links in /usr/bin",
        "1Panel's settings in 1pctl (the password read from its file on the box)",
        "1Panel's GeoIP, languages and systemd units",
        "Start 1panel-core, then 1panel-agent",
        "Wait for 1Panel on port 10100",
        "Mask the password in 1pctl (install.sh's Check_Ready)",
        "1panel-core running and enabled",
        "1panel-agent running and enabled",
    ]
    download = " ".join(plan.op("Download and verify"))
    assert "https://resource.1panel.pro/v2/stable/v2.3.2/release/" in download
    assert TARBALL in download
    assert (
        rules.package.__name__
        and "f1265a4fadeaab3d7066dd71e3c6904ac54bb687baab1b205a23c369abb61cac" in (download)
    )
    assert plan.op("Unpack") == [f"{SCRIPT} unpack"]
    assert plan.op("1Panel's settings in 1pctl") == [f"{SCRIPT} settings"]
    assert plan.op("Mask the password") == [f"{SCRIPT} mask"]
    password = " ".join(plan.op("Generate the panel's password"))
    assert "umask 077" in password and "chmod 600 /etc/gpubox/panel-password" in password
    # never the official installer, its Docker, firewall or public-address steps
    text = " ".join(plan.commands)
    for never in ("install.sh", "get.docker.com", "ufw", "firewall-cmd", "ipify", "ipinfo"):
        assert never not in text, never


def test_the_box_script_reproduces_the_steps_and_reads_the_password_from_its_file():
    files = uploads(panel.panel, PANEL, box("debian12"))
    script = files[SCRIPT]
    assert script == script_text()
    for needle in (
        'ln -sf "$BIN/1panel-core" /usr/bin/1panel',
        '[ -e "/usr/bin/$f" ] || ln -s "$BIN/$f" "/usr/bin/$f"',
        'V_ORIGINAL_PASSWORD=$(cat "$PASSWORD_FILE")',
        "V_LANGUAGE=en",
        'V_PANEL_EDITION="$PANEL_EDITION"',
        'cp "$src/GeoIP.mmdb" "$RUN/geo/"',
        'cp -r "$src/lang" "$BIN/lang"',
        'cp -r "$src/initscript" "$RUN/resource/initscript"',
        "systemctl enable 1panel-core.service 1panel-agent.service",
        "MASKED='**********'",
        'print "CHANGE_USER_INFO=use_existing"',
    ):
        assert needle in script, needle
    assert 'rm -rf "$RUN"' not in script and "rm -rf $RUN/*" not in script  # never wipes
    conf = files[CONF]
    assert conf == (
        "PANEL_VERSION=v2.3.2\nPANEL_ARCH=amd64\nPANEL_DIR=/opt\nPANEL_PORT=10100\n"
        "PANEL_USER=gpubox\nPANEL_EDITION=intl\nPANEL_CACHE=/var/cache/gpubox/panel\n"
    )


def test_an_inventory_entrance_goes_to_its_root_only_file():
    data = {**PANEL, "panel_entrance": "my_entrance_1"}
    files = uploads(panel.panel, data, box("ubuntu2404"))
    assert files[layout.PANEL_ENTRANCE] == "my_entrance_1\n"
    assert not any("my_entrance_1" in t for p, t in files.items() if p != layout.PANEL_ENTRANCE)


@pytest.mark.parametrize("os_name", OSES)
def test_a_panel_at_the_pin_plans_nothing(plan_of, os_name):
    plan = plan_of(panel.panel, PANEL, box(os_name, state=installed()))
    assert own_commands(plan) == [], plan.ops


def test_a_stopped_panel_is_started_and_waited_for(plan_of):
    state = "\n".join(installed()).replace("ActiveState=active", "ActiveState=inactive", 1)
    answers = box("debian12", state=state.splitlines())
    answers["--property SubState 1panel-core.service"] = [
        "Id=1panel-core.service",
        "SubState=dead",
    ]
    plan = plan_of(panel.panel, PANEL, answers)
    assert short(plan.names)[-3:] == [
        "1panel-core running and enabled",
        "1panel-agent running and enabled",
        "Wait for 1Panel on port 10100 (1panel-core started)",
    ]
    assert plan.op("1panel-core running") == ["systemctl start 1panel-core.service"]


def test_another_version_warns_and_is_kept(plan_of, caplog):
    plan = plan_of(panel.panel, PANEL, box("debian12", state=installed("v2.2.5")))
    assert own_commands(plan) == []
    assert "1Panel v2.2.5 is installed, the catalog pins v2.3.2: kept" in caplog.text


def test_another_version_is_upgraded_with_panel_version_policy_converge(plan_of):
    data = {**PANEL, "panel_version_policy": "converge"}
    plan = plan_of(panel.panel, data, box("ubuntu2404", state=installed("v2.2.5")))
    names = short(plan.names)
    assert names[: names.index("Mask the password in 1pctl (install.sh's Check_Ready)") + 1] == [
        "The panel's download cache (/var/cache/gpubox/panel)",
        "Download and verify 1panel-v2.3.2-linux-amd64.tar.gz",
        "Unpack 1Panel v2.3.2",
        "Keep 1Panel v2.2.5's files (upgrade backup)",
        "Stop 1Panel for the upgrade",
        "1Panel's binaries and 1pctl in /usr/local/bin, links in /usr/bin",
        "1Panel's settings in 1pctl (the password read from its file on the box)",
        "1Panel's GeoIP, languages and systemd units",
        "Start 1panel-core, then 1panel-agent",
        "Wait for 1Panel on port 10100",
        "Mask the password in 1pctl (install.sh's Check_Ready)",
    ]
    assert plan.op("Keep 1Panel") == [f"{SCRIPT} backup v2.2.5"]
    assert plan.op("1Panel's settings in 1pctl") == [f"{SCRIPT} settings use_existing"]


def test_a_newer_panel_is_never_downgraded(plan_of, caplog):
    """Upgraded from 1Panel's own page (core/app/service/upgrade.go migrated its databases):
    converge refuses, naming both versions; warn keeps it with a note."""
    data = {**PANEL, "panel_version_policy": "converge"}
    with pytest.raises(DeployRefused, match="nothing was changed") as refused:
        plan_of(panel.panel, data, box("debian12", state=installed("v2.4.0")))
    assert "1Panel v2.4.0 is installed, newer than the catalog's v2.3.2" in str(refused.value)
    with caplog.at_level("INFO"):
        plan = plan_of(panel.panel, PANEL, box("debian12", state=installed("v2.4.0")))
    assert own_commands(plan) == []
    assert "1Panel v2.4.0 is installed, newer than the catalog's v2.3.2: kept" in caplog.text
    assert "the catalog pins" not in caplog.text


def test_1pctls_placeholders_after_a_ui_upgrade_are_masked_not_converged(plan_of):
    """1Panel's upgrade leaves the package's 1pctl (1Panel-dev/installer v2 1pctl: ORIGINAL_PORT=
    port, ORIGINAL_PASSWORD=password, no PANEL_EDITION): the panel is kept, the placeholder
    password masked, nothing converged (this deploy nor the next)."""
    state = "\n".join(installed()).replace(
        "ORIGINAL_PORT=10100\nORIGINAL_VERSION=v2.3.2\nORIGINAL_USERNAME=gpubox\n"
        "LANGUAGE=en\nPANEL_EDITION=intl\nPASSWORD=masked",
        "ORIGINAL_PORT=port\nORIGINAL_VERSION=version\nORIGINAL_USERNAME=username\n"
        "LANGUAGE=en\nPASSWORD=placeholder",
    )
    assert "PASSWORD=placeholder" in state
    plan = plan_of(panel.panel, PANEL, box("debian12", state=state.splitlines()))
    assert short(plan.names) == [
        "Mask the password in 1pctl (install.sh's Check_Ready)",
        "1panel-core running and enabled",
        "1panel-agent running and enabled",
    ]
    assert own_commands(plan) == [f"{SCRIPT} mask"]


def test_an_edition_change_on_an_installed_panel_is_refused(plan_of):
    state = "\n".join(installed()).replace("PANEL_EDITION=intl", "PANEL_EDITION=cn")
    with pytest.raises(DeployRefused, match="nothing was changed") as refused:
        plan_of(panel.panel, PANEL, box("debian12", state=state.splitlines()))
    assert "panel_edition: the installed panel is the 'cn' edition" in str(refused.value)


def test_a_port_that_differs_is_converged_through_change_user_info(plan_of):
    plan = plan_of(panel.panel, PANEL, box("debian12", state=installed(port=20000)))
    assert short(plan.names)[:5] == [
        "1Panel's settings in 1pctl, applied at the core's restart (CHANGE_USER_INFO)",
        "Restart 1panel-core (it applies the settings)",
        "Wait for 1Panel on port 10100",
        "Mask the password in 1pctl (install.sh's Check_Ready)",
        "1panel-core running and enabled",
    ]
    assert plan.op("applied at the core's restart") == [f"{SCRIPT} settings use_existing"]


def test_a_lost_password_file_is_made_again_and_set_in_the_panel(plan_of):
    answers = box("debian12", state=installed())
    answers["/etc/gpubox/panel-password /etc/gpubox/panel-entrance; do"] = [layout.PANEL_ENTRANCE]
    plan = plan_of(panel.panel, PANEL, answers)
    assert short(plan.names)[:3] == [
        "Generate the panel's password (/etc/gpubox/panel-password, root only)",
        "1Panel's settings in 1pctl, applied at the core's restart (CHANGE_USER_INFO)",
        "Restart 1panel-core (it applies the settings)",
    ]


@pytest.mark.parametrize(
    "where, message",
    [
        ("dir=full\narch=amd64\ncurl=yes", "panel_dir: /opt/1panel exists and holds files"),
        ("dir=empty\narch=arm64\ncurl=yes", "catalog_overrides panel.onepanel.sha256.arm64"),
        (
            'dir=empty\narch=amd64\ncurl=yes\nlisten=LISTEN 0 511 0.0.0.0:10100 users:(("nginx"))',
            "panel_port: 10100 is taken by another program",
        ),
    ],
)
def test_a_refused_box_changes_nothing(plan_of, where, message):
    with pytest.raises(DeployRefused, match="nothing was changed") as refused:
        plan_of(panel.panel, PANEL, box("debian12", where=where))
    assert message in str(refused.value)


def test_no_panel_plans_nothing_and_reads_nothing_of_it(plan_of, commands):
    plan = plan_of(panel.panel, REFERENCE, box("debian12"))
    assert plan.ops == []
    assert not any("1pctl" in c or "1panel" in c for c in commands)


def test_compose_on_the_distributions_path(plan_of, caplog):
    data = {**PANEL, "docker_source": "distro"}
    ubuntu = plan_of(panel.panel, data, box("ubuntu2404"))
    assert "docker-compose-v2" in ubuntu.installs()
    debian = plan_of(panel.panel, data, box("debian12"))
    assert "docker-compose" in debian.installs()
    assert "only Docker Compose is docker-compose 1.29 (Compose v1)" in caplog.text
    assert 'set "docker_source": "docker"' in caplog.text
    dockers = plan_of(panel.panel, PANEL, box("debian12"))
    assert not [p for p in dockers.installs() if "compose" in p]  # the engine's plugin


def test_the_panel_comes_after_the_server_and_before_the_checks():
    stages = deploying.FULL_STAGES
    assert stages.index("docker") < stages.index("panel") == stages.index("verify") - 1


def test_a_daemon_json_replaced_by_1panel_gets_the_nvidia_runtime_back(plan_of):
    """1Panel's installer, when told to configure mirrors, replaces daemon.json with a file of
    its own holding only registry-mirrors (install.sh configure_accelerator; 1Panel issues
    #11344, #11631): the toolkit's stage merges the NVIDIA runtime back, keeping the mirrors."""
    replaced = {"registry-mirrors": ["https://docker.1panel.live"]}
    text = json.dumps(replaced, indent=4)
    answers = fresh_box(
        "debian12", **{"if [ -e /etc/docker/daemon.json ]": ["exists", *text.splitlines()]}
    )
    files = uploads(container_toolkit.container_toolkit, PANEL, answers)
    merged = json.loads(files[layout.DAEMON_JSON])
    assert merged["registry-mirrors"] == ["https://docker.1panel.live"]
    assert merged["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"


class ProbedHost:
    """A host whose probe of the port and the agent's socket answers ``lines`` (pyinfra's
    run_shell_command: each line of standard output apart)."""

    name = "box"

    def __init__(self, lines: list[str]):
        self.lines = lines
        self.sent: list[str] = []

    def run_shell_command(self, command: str):
        from types import SimpleNamespace

        self.sent.append(command)
        return True, SimpleNamespace(stdout_lines=self.lines if "ss -Htln" in command else [])


def test_the_wait_ends_when_the_port_and_the_socket_are_both_there():
    (command,) = list(panel.wait_for_panel._inner(port=10100, timeout=5))
    host = ProbedHost(["port", "socket"])
    command.function(None, host)
    assert host.sent == [
        "ss -Htln 'sport = :10100' | grep -q . && echo port; "
        "test -S /etc/1panel/agent.sock && echo socket; true"
    ]


def test_a_panel_that_does_not_come_up_is_masked_then_fails():
    from pyinfra.api import OperationError

    (command,) = list(panel.wait_for_panel._inner(port=10100, timeout=1))
    host = ProbedHost(["port"])
    with pytest.raises(OperationError, match=r"within 1s \(socket missing\)"):
        command.function(None, host)
    assert f"{SCRIPT} mask" in host.sent  # the password in 1pctl masked before the failure
