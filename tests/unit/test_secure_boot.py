"""Secure Boot: mokutil's, openssl's and modinfo's recorded outputs read, the driver stage's
decision for every enrollment state, the key made as dkms makes it, and the host check's
judgement of signed, unsigned, foreign-key and tainted modules (tests/fixtures/secureboot,
sources in tests/fixtures/SOURCES.md)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from gpubox.knowledge import secure_boot
from gpubox.parsers import ParseError
from gpubox.parsers.secure_boot import (
    LoadedModule,
    parse_mok_state,
    parse_test_key,
    parse_x509,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "secureboot"
SERIAL = "15E2AF9399D6C5FDA3323EA0DFCC0885B3877345"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    "name, answer",
    [
        ("not-enrolled", "not-enrolled"),
        ("enrolled", "enrolled"),
        ("pending", "pending"),
        ("blocked", "blocked"),
        ("invalid", "invalid"),
        ("unreadable", "unreadable"),
        ("read-failed", "unreadable"),
        ("ca-enrolled", "ca-enrolled"),
        ("ca-blocked", "blocked"),
    ],
)
def test_mokutil_test_key_is_read_from_its_text(name: str, answer: str) -> None:
    assert parse_test_key(fixture(f"mokutil-test-key_{name}.txt")) == answer


def test_an_unknown_test_key_answer_is_an_error_quoting_it() -> None:
    with pytest.raises(ParseError, match="mokutil: command not found"):
        parse_test_key("mokutil: command not found\n")


def test_openssl_serial_and_subject() -> None:
    cert = parse_x509(fixture("openssl-x509-serial-subject_local.txt"))
    assert cert.serial == SERIAL and cert.subject_cn == "DKMS module signing key"
    assert parse_x509("serial=00AB\nsubject= /CN=old style\n").subject_cn == "old style"


def test_the_recorded_state_of_a_box_without_mokutil() -> None:
    state = parse_mok_state(fixture("mok-state_debian12_no-mokutil_local.txt"))
    assert (state.key, state.certificate) == secure_boot.DEFAULT_KEYS["debian"]
    assert state.key_exists and state.certificate_exists
    assert not state.has_mokutil and state.test_key is None
    assert state.certificate_info is not None and state.certificate_info.serial == SERIAL
    # modinfo's colon hex and openssl's plain hex name the same serial
    assert {m.name for m in state.modules} == {"nvidia", "nvidia_uvm"}
    assert all(m.sig_key == SERIAL and m.version == "570.211.01" for m in state.modules)
    assert state.loaded == []


def enrolled() -> secure_boot.MokState:
    return parse_mok_state(fixture("mok-state_debian12_enrolled.txt"))


def test_an_enrolled_key_and_verified_modules_pass() -> None:
    state = enrolled()
    assert state.trusted and [m.taint for m in state.loaded] == ["PO", "PO"]
    assert secure_boot.module_problems(state) == []
    assert secure_boot.gate("box", "debian", True, state, "570.211.01").action == "go"


def test_a_module_the_kernel_did_not_verify_is_named() -> None:
    state = enrolled()
    state.loaded = [LoadedModule("nvidia", "POE")]
    assert secure_boot.module_problems(state) == [
        "/sys/module/nvidia/taint is 'POE': the kernel did not verify its signature"
    ]


def test_an_unsigned_module_and_one_signed_by_another_key_are_named() -> None:
    state = enrolled()
    unsigned, other = state.modules
    state.modules = [
        dataclasses.replace(unsigned, signer="", sig_key=""),
        dataclasses.replace(other, signer="box Secure Boot Module Signature key", sig_key="61E0"),
    ]
    problems = secure_boot.module_problems(state)
    assert problems[0].endswith("nvidia-current-uvm.ko is not signed")
    assert (
        "signed by 'box Secure Boot Module Signature key' (61E0), not by the enrolled key "
        in (problems[1])
    )


def test_a_key_not_enrolled_and_no_module_loaded_fail_the_check() -> None:
    text = fixture("mok-state_debian12_enrolled.txt").replace(
        "is already enrolled", "is not enrolled"
    )
    state = parse_mok_state(text.replace("LOADED nvidia PO\nLOADED nvidia_uvm PO\n", ""))
    problems = secure_boot.module_problems(state)
    assert "is not trusted by the firmware" in problems[0]
    assert "no NVIDIA module is loaded" in problems[1]


def test_secure_boot_off_or_absent_needs_nothing() -> None:
    for sb in (False, None):
        assert secure_boot.gate("box", "ubuntu", sb, enrolled(), "570.211.01").action == "go"


def test_not_enrolled_stops_before_the_driver_with_the_import_command() -> None:
    text = fixture("mok-state_debian12_enrolled.txt").replace(
        "is already enrolled", "is not enrolled"
    )
    gate = secure_boot.gate("box", "debian", True, parse_mok_state(text), "570.211.01")
    assert gate.action == "stop" and gate.create_key is None and not gate.install_mokutil
    joined = "\n".join(gate.lines)
    assert "sudo mokutil --import /var/lib/dkms/mok.pub" in joined
    assert "console or a remote KVM" in joined and "Run the deploy again" in joined
    assert "nothing was changed" in gate.lines[0]


def test_a_pending_request_says_the_import_is_done() -> None:
    text = fixture("mok-state_debian12_enrolled.txt").replace(
        "is already enrolled", "is already in the enrollment request"
    )
    gate = secure_boot.gate("box", "debian", True, parse_mok_state(text), "570.211.01")
    assert gate.action == "stop"
    assert "waits in the enrollment request" in gate.lines[0]
    assert "The import is already done" in gate.lines[1]
    # its password may be one the owner never chose (dkms or update-secureboot-policy queued
    # it): the way out is to revoke the request and import again (mokutil 0.6.0 --revoke-import)
    joined = "\n".join(gate.lines)
    assert "sudo mokutil --revoke-import, then sudo mokutil --import /var/lib/dkms/mok.pub" in (
        joined
    )
    assert joined.index("--revoke-import") < joined.index("Reboot with someone")


def test_a_missing_key_is_created_then_the_deploy_stops() -> None:
    state = secure_boot.MokState(
        key="/var/lib/dkms/mok.key", certificate="/var/lib/dkms/mok.pub", has_mokutil=True
    )
    gate = secure_boot.gate("box", "debian", True, state, "570.211.01")
    assert gate.action == "stop" and gate.create_key and not gate.install_mokutil
    assert "the deploy created it" in gate.lines[0]
    assert "sudo mokutil --import /var/lib/dkms/mok.pub" in gate.lines[1]


def test_no_mokutil_installs_it_and_stops() -> None:
    state = parse_mok_state(fixture("mok-state_debian12_no-mokutil_local.txt"))
    gate = secure_boot.gate("box", "debian", True, state, "570.211.01")
    assert gate.action == "stop" and gate.install_mokutil and gate.create_key is None


@pytest.mark.parametrize("answer", ["blocked in dbx", "invalid"])
def test_a_blocked_or_unreadable_key_is_refused(answer: str) -> None:
    line = (
        "TEST /var/lib/dkms/mok.pub is blocked in dbx"
        if answer == "blocked in dbx"
        else "TEST Not a valid x509 certificate"
    )
    text = fixture("mok-state_debian12_enrolled.txt").replace(
        "TEST /var/lib/dkms/mok.pub is already enrolled", line
    )
    gate = secure_boot.gate("box", "debian", True, parse_mok_state(text), "570.211.01")
    assert gate.action == "refuse" and gate.lines[0].startswith("secure_boot: ")


def mok_state_saying(answer_fixture: str) -> secure_boot.MokState:
    """The recorded enrolled box, mokutil --test-key answering as the fixture does."""
    line = fixture(f"mokutil-test-key_{answer_fixture}.txt").strip()
    text = fixture("mok-state_debian12_enrolled.txt").replace(
        "TEST /var/lib/dkms/mok.pub is already enrolled", f"TEST {line}"
    )
    return parse_mok_state(text)


def test_a_certificate_mokutil_cannot_read_is_a_refusal_that_says_what_to_do() -> None:
    """mokutil's "Failed to read FILE" (open worked, read failed: a directory, an I/O error)
    refuses the deploy with the file and the way out, instead of a parse error."""
    for answer in ("read-failed", "unreadable"):
        state = mok_state_saying(answer)
        gate = secure_boot.gate("box", "debian", True, state, "570.211.01")
        assert gate.action == "refuse", answer
        (line,) = gate.lines
        assert line.startswith("secure_boot: ") and "/var/lib/dkms/mok.pub" in line
        assert "mok_certificate" in line and "/etc/dkms/framework.conf" in line
        assert "/var/lib/dkms/mok.key" in line and "run the deploy again" in line
        assert "not trusted" in secure_boot.module_problems(state)[0]


def test_an_enrolled_ca_is_not_the_key_enrolled() -> None:
    """mokutil's "CA of FILE is already enrolled" (--ca-check) says the issuer is enrolled,
    not the key: dkms's signature names the key itself, so the deploy stops with the steps."""
    state = mok_state_saying("ca-enrolled")
    assert not state.trusted
    gate = secure_boot.gate("box", "debian", True, state, "570.211.01")
    assert gate.action == "stop"
    joined = "\n".join(gate.lines)
    assert "its CA is" in gate.lines[0]
    assert "sudo mokutil --import /var/lib/dkms/mok.pub" in joined
    assert "is not trusted by the firmware" in secure_boot.module_problems(state)[0]
    blocked = secure_boot.gate("box", "debian", True, mok_state_saying("ca-blocked"), "570")
    assert blocked.action == "refuse"


def test_a_pinned_module_signed_by_another_key_is_refused_other_versions_are_rebuilt() -> None:
    state = enrolled()
    state.modules = [dataclasses.replace(m, sig_key="61E0", signer="old") for m in state.modules]
    gate = secure_boot.gate("box", "debian", True, state, "570.211.01")
    assert gate.action == "refuse"
    assert "signed by 'old' (61E0)" in gate.lines[0] and "dkms remove" in gate.lines[0]
    # a module of another driver version is rebuilt (and signed anew) by the install
    assert secure_boot.gate("box", "debian", True, state, "570.195.03").action == "go"


def test_shim_validation_off_goes_on_with_a_warning() -> None:
    state = enrolled()
    state.shim_validation_disabled = True
    gate = secure_boot.gate("box", "ubuntu", True, state, "570.211.01")
    assert gate.action == "go" and "validation is disabled" in gate.warnings[0]


def test_framework_conf_paths_are_read_as_dkms_sources_them(tmp_path: Path) -> None:
    """The state command sources framework.conf (as dkms does, $kernelver included): run it
    with the conf paths pointed into a temporary tree."""
    conf = tmp_path / "framework.conf"
    conf.write_text(
        '# a comment\nmok_signing_key="/etc/keys/$kernelver/signing.key"\n'
        "mok_certificate=/etc/keys/signing.der\n"
    )
    command = secure_boot.state_command("ubuntu").replace(
        " ".join(secure_boot.FRAMEWORK_CONF), str(conf)
    )
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    state = parse_mok_state(out.stdout)
    release = Path("/proc/sys/kernel/osrelease").read_text().strip()
    assert state.key == f"/etc/keys/{release}/signing.key"
    assert state.certificate == "/etc/keys/signing.der"
    assert not state.key_exists and not state.certificate_exists


def test_the_ubuntu_defaults_without_framework_conf(tmp_path: Path) -> None:
    command = secure_boot.state_command("ubuntu").replace(
        " ".join(secure_boot.FRAMEWORK_CONF), str(tmp_path / "none.conf")
    )
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    state = parse_mok_state(out.stdout)
    assert (state.key, state.certificate) == secure_boot.DEFAULT_KEYS["ubuntu"]


UBUNTU_DEFAULT = ("/var/lib/shim-signed/mok/MOK.priv", "/var/lib/shim-signed/mok/MOK.der")
DKMS_DEFAULT_KEY, DKMS_DEFAULT_CERT = "/var/lib/dkms/mok.key", "/var/lib/dkms/mok.pub"


@pytest.mark.parametrize(
    "family, conf, conf_d, want",
    [
        # mok_signing_key unset: on Ubuntu dkms forces both paths to shim-signed's MOK, even a
        # mok_certificate that framework.conf sets; on Debian each defaults under /var/lib/dkms
        ("ubuntu", "", "", UBUNTU_DEFAULT),
        ("ubuntu", "mok_certificate=/etc/keys/c.der\n", "", UBUNTU_DEFAULT),
        ("ubuntu", 'mok_signing_key=""\nmok_certificate=/etc/keys/c.der\n', "", UBUNTU_DEFAULT),
        ("debian", "", "", (DKMS_DEFAULT_KEY, DKMS_DEFAULT_CERT)),
        ("debian", "mok_certificate=/etc/keys/c.der\n", "", (DKMS_DEFAULT_KEY, "/etc/keys/c.der")),
        # only mok_signing_key: the certificate is dkms's /var/lib/dkms/mok.pub, on both
        ("ubuntu", "mok_signing_key=/etc/keys/k.key\n", "", ("/etc/keys/k.key", DKMS_DEFAULT_CERT)),
        ("debian", "mok_signing_key=/etc/keys/k.key\n", "", ("/etc/keys/k.key", DKMS_DEFAULT_CERT)),
        # both: as written, whichever file sets them (framework.conf.d/*.conf after the main one)
        (
            "ubuntu",
            "mok_certificate=/etc/keys/c.der\n",
            "mok_signing_key=/etc/keys/k.key\n",
            ("/etc/keys/k.key", "/etc/keys/c.der"),
        ),
        (
            "debian",
            "mok_signing_key=/a.key\nmok_certificate=/a.der\n",
            "mok_signing_key=/etc/keys/k.key\n",
            ("/etc/keys/k.key", "/a.der"),
        ),
        (
            "ubuntu",
            "mok_signing_key=pkcs11:token=x\nmok_certificate=/etc/keys/c.der\n",
            "",
            ("pkcs11:token=x", "/etc/keys/c.der"),
        ),
    ],
)
def test_the_key_paths_are_resolved_as_dkms_prepare_signing_does(
    tmp_path: Path, family: str, conf: str, conf_d: str, want: tuple[str, str]
) -> None:
    """dkms v3.0.10 and v3.0.11 (github.com/dell/dkms, dkms.in, prepare_signing): the state
    command, run with framework.conf and framework.conf.d pointed into a temporary tree."""
    (tmp_path / "framework.conf.d").mkdir()
    if conf:
        (tmp_path / "framework.conf").write_text(conf)
    if conf_d:
        (tmp_path / "framework.conf.d" / "10-keys.conf").write_text(conf_d)
    command = secure_boot.state_command(family).replace(
        " ".join(secure_boot.FRAMEWORK_CONF),
        f"{tmp_path}/framework.conf {tmp_path}/framework.conf.d/*.conf",
    )
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    state = parse_mok_state(out.stdout)
    assert (state.key, state.certificate) == want


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_the_debian_key_is_made_as_dkms_makes_it(tmp_path: Path) -> None:
    state = secure_boot.MokState(
        key=str(tmp_path / "d/mok.key"), certificate=str(tmp_path / "d/mok.pub")
    )
    command = secure_boot.create_key_command("debian", state)
    subprocess.run(["sh", "-c", command], check=True, capture_output=True)
    info = subprocess.run(
        [
            "openssl",
            "x509",
            "-inform",
            "DER",
            "-in",
            state.certificate,
            "-noout",
            "-serial",
            "-subject",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert parse_x509(info).subject_cn == "DKMS module signing key"
    assert (tmp_path / "d/mok.key").stat().st_mode & 0o077 == 0  # root only


def test_ubuntu_uses_update_secureboot_policy_when_it_is_there() -> None:
    key, cert = secure_boot.DEFAULT_KEYS["ubuntu"]
    state = secure_boot.MokState(key=key, certificate=cert, has_update_secureboot_policy=True)
    assert secure_boot.create_key_command("ubuntu", state) == (
        "rm -f /var/lib/shim-signed/mok/MOK.der && "
        "SHIM_NOTRIGGER=y update-secureboot-policy --new-key"
    )
    state.has_update_secureboot_policy = False
    command = secure_boot.create_key_command("ubuntu", state)
    assert "Secure Boot Module Signature key" in command and "-outform DER" in command
    # framework.conf names the key: dkms's prepare_signing makes the pair with its own openssl
    # command, on Ubuntu too (dkms v3.0.11)
    state = secure_boot.MokState(
        key="/etc/keys/k.key",
        certificate="/var/lib/dkms/mok.pub",
        has_update_secureboot_policy=True,
    )
    command = secure_boot.create_key_command("ubuntu", state)
    assert secure_boot.DEBIAN_SUBJECT in command and "update-secureboot-policy" not in command


def test_one_modinfo_per_module_gives_what_modinfo_f_gives() -> None:
    """The MOK state reads each module's name, version, signer and sig_key from one modinfo
    (recorded output, its signature continuing over lines); an unsigned module has none."""
    import subprocess

    from gpubox.knowledge.secure_boot import _MODINFO_AWK

    recorded = (FIXTURES / "modinfo_signed_local.txt").read_text()
    unsigned = "filename:       /x/nvidia.ko\nlicense:        NVIDIA\nname:           nvidia\n"
    lines = [
        subprocess.run(
            ["awk", "-v", "m=/x/nvidia.ko", _MODINFO_AWK],
            input=text,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for text in (recorded, unsigned)
    ]
    assert lines == [
        "MOD /x/nvidia.ko\tname=nvidia\tversion=570.211.01\tsigner=DKMS module signing key\t"
        "sig_key=15:E2:AF:93:99:D6:C5:FD:A3:32:3E:A0:DF:CC:08:85:B3:87:73:45\n",
        "MOD /x/nvidia.ko\tname=nvidia\tversion=\tsigner=\tsig_key=\n",
    ]
