"""The sandbox's firmware stand-ins (issue 16): mokutil, the MOK screen, the kernel's module
signature check and taint, the display card's nouveau and lspci -k. Each text and exit status
is held to mokutil 0.6.0's source (lcp/mokutil tag 0.6.0, src/mokutil.c), the kernel's
(kernel/module/signing.c, Documentation/admin-guide/tainted-kernels.rst) and pciutils 3.9.0's
(ls-kernel.c); certificates are made by the real openssl exactly as Debian's dkms 3.0.10 makes
its MOK."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import test_standin

from gpubox.sandbox import faults, repo_debs, standin
from gpubox.sandbox.standin import state as st

pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl tool")


def make_cert(directory: Path, name: str = "mok") -> tuple[Path, bytes]:
    """A key pair as Debian's dkms 3.0.10 makes /var/lib/dkms/mok.key + mok.pub."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        faults.DKMS_KEYGEN.replace(faults.DKMS_KEY, str(directory / f"{name}.key")).replace(
            faults.DKMS_CERT, str(directory / f"{name}.pub")
        ),
        shell=True,
        check=True,
        capture_output=True,
    )
    path = directory / f"{name}.pub"
    return path, path.read_bytes()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, bytes]]:
    base = tmp_path_factory.mktemp("certs")
    return {"a": make_cert(base, "a"), "b": make_cert(base, "b")}


class Firmware:
    def __init__(self, root: Path, state: dict[str, Any]) -> None:
        self.state_file = root / "state.json"
        st.save_state(state, self.state_file)

    @property
    def state(self) -> dict[str, Any]:
        return st.load_state(self.state_file)

    def save(self, state: dict[str, Any]) -> None:
        st.save_state(state, self.state_file)

    def mokutil(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(standin.MOKUTIL), *args],
            env={**os.environ, st.STATE_ENV: str(self.state_file)},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
        )


@pytest.fixture
def fw(tmp_path: Path) -> Firmware:
    return Firmware(tmp_path, st.set_secure_boot(st.default_state(), True))


def test_scripts_are_stdlib_stand_ins():
    for path in (standin.MOKUTIL, standin.BOOT_MODULES):
        test_standin.test_scripts_are_standalone_python3_stdlib_stand_ins(path)


# --------------------------------------------------------------------------- mokutil


def test_no_efi_is_the_real_error_for_every_command(tmp_path: Path, certs):
    box = Firmware(tmp_path, st.default_state())  # the box's default: no EFI variables
    for args in (["--sb-state"], ["--test-key", str(certs["a"][0])], ["--list-enrolled"]):
        result = box.mokutil(*args)
        # main(): efi_variables_supported() fails -> stderr, exit(1)
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr == "EFI variables are not supported on this system\n"


def test_sb_state(fw: Firmware):
    result = fw.mokutil("--sb-state")
    assert (result.returncode, result.stdout, result.stderr) == (0, "SecureBoot enabled\n", "")
    fw.save(st.set_secure_boot(fw.state, False))
    result = fw.mokutil("--sb-state")
    assert (result.returncode, result.stdout) == (0, "SecureBoot disabled\n")


def test_test_key_three_answers_and_their_inverted_exit_codes(fw: Firmware, certs):
    path, der = certs["a"]
    result = fw.mokutil("--test-key", str(path))
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{path} is not enrolled\n", "")
    fw.save(st.enroll_certificate(fw.state, der))
    result = fw.mokutil("--test-key", str(path))
    assert (result.returncode, result.stdout) == (1, f"{path} is already enrolled\n")
    other, _ = certs["b"]
    imported = fw.mokutil("--import", str(other), stdin="pw\npw\n")
    assert imported.returncode == 0, imported.stderr
    result = fw.mokutil("--test-key", str(other))
    assert (result.returncode, result.stdout) == (
        1,
        f"{other} is already in the enrollment request\n",
    )


def test_test_key_not_a_certificate_and_missing_file(fw: Firmware, tmp_path: Path, certs):
    pem = tmp_path / "mok.pem"  # PEM, not DER: d2i_X509 fails
    subprocess.run(
        ["openssl", "x509", "-inform", "DER", "-in", str(certs["a"][0]), "-out", str(pem)],
        check=True,
    )
    result = fw.mokutil("--test-key", str(pem))
    assert (result.returncode, result.stdout, result.stderr) == (
        255,
        "",
        "Not a valid x509 certificate\n",
    )
    result = fw.mokutil("--test-key", str(tmp_path / "absent.der"))
    assert (result.returncode, result.stderr) == (255, f"Failed to open {tmp_path}/absent.der\n")


def test_import_prompts_and_queues(fw: Firmware, certs):
    path, der = certs["a"]
    result = fw.mokutil("--import", str(path), stdin="secret\nsecret\n")
    assert result.returncode == 0, result.stderr
    # get_password: each prompt, then the newline printed after the line read
    assert result.stdout == "input password: \ninput password again: \n"
    assert result.stderr == ""
    sb = fw.state["secure_boot"]
    assert sb["pending"] == [base64.b64encode(der).decode()]
    assert st.password_matches(sb["pending_password_hash"], "secret")
    assert not st.password_matches(sb["pending_password_hash"], "other")
    assert "secret" not in fw.state_file.read_text()


def test_import_password_rules(fw: Firmware, certs):
    path, _ = certs["a"]
    mismatch = fw.mokutil("--import", str(path), stdin="one\ntwo\nthree\nfour\n")
    assert mismatch.returncode == 255
    assert mismatch.stderr == "password doesn't match\n" * 3 + "Abort\n"
    assert mismatch.stdout == "input password: \n" + "input password again: \n" * 3
    empty = fw.mokutil("--import", str(path), stdin="\n\n\n")
    assert empty.returncode == 255
    assert empty.stderr == "password should be 1~256 characters\n" * 3 + "Abort\n"
    too_long = fw.mokutil("--import", str(path), stdin=("x" * 257 + "\n") * 3)
    assert too_long.returncode == 255
    assert fw.state["secure_boot"]["pending"] == []
    retry = fw.mokutil("--import", str(path), stdin="\nok\nbad\nok\n")
    assert retry.returncode == 0
    assert retry.stderr == "password should be 1~256 characters\npassword doesn't match\n"


def test_import_skips_enrolled_and_pending_without_prompting(fw: Firmware, certs):
    path, der = certs["a"]
    fw.save(st.enroll_certificate(fw.state, der))
    result = fw.mokutil("--import", str(path))
    assert (result.returncode, result.stdout) == (0, f"SKIP: {path} is already enrolled\n")
    other, other_der = certs["b"]
    assert fw.mokutil("--import", str(other), stdin="a\na\n").returncode == 0
    again = fw.mokutil("--import", str(other))
    assert (again.returncode, again.stdout) == (
        0,
        f"SKIP: {other} is already in the enrollment request\n",
    )
    assert fw.state["secure_boot"]["pending"] == [base64.b64encode(other_der).decode()]


def test_import_appends_and_replaces_the_password(fw: Firmware, certs):
    (a, der_a), (b, der_b) = certs["a"], certs["b"]
    assert fw.mokutil("--import", str(a), stdin="first\nfirst\n").returncode == 0
    assert fw.mokutil("--import", str(b), stdin="second\nsecond\n").returncode == 0
    sb = fw.state["secure_boot"]
    # issue_mok_request: the new keys first, the earlier request after them
    assert sb["pending"] == [base64.b64encode(d).decode() for d in (der_b, der_a)]
    assert st.password_matches(sb["pending_password_hash"], "second")


def test_import_not_der(fw: Firmware, tmp_path: Path):
    bad = tmp_path / "bad.der"
    bad.write_bytes(b"not a certificate")
    result = fw.mokutil("--import", str(bad), stdin="a\na\n")
    assert result.returncode == 255
    assert result.stderr == f"Abort!!! {bad} is not a valid x509 certificate in DER format\n"


def test_list_new_and_enrolled(fw: Firmware, certs):
    for option in ("--list-new", "--list-enrolled"):  # nothing: no output at all, exit 0
        assert (fw.mokutil(option).returncode, fw.mokutil(option).stdout) == (0, "")
    (a, der_a), (b, der_b) = certs["a"], certs["b"]
    fw.save(st.enroll_certificate(fw.state, der_a))
    assert fw.mokutil("--import", str(b), stdin="p\np\n").returncode == 0
    enrolled = fw.mokutil("--list-enrolled").stdout
    sha1 = hashlib.sha1(der_a).hexdigest()
    assert enrolled.startswith(
        "[key 1]\nSHA1 Fingerprint: " + ":".join(sha1[i : i + 2] for i in range(0, 40, 2)) + "\n"
    )
    assert "Subject: CN=DKMS module signing key" in enrolled  # X509_print_fp's compat names
    fingerprint = subprocess.run(
        ["openssl", "x509", "-inform", "DER", "-in", str(a), "-noout", "-fingerprint", "-sha1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # upper case; mokutil prints lower case
    assert fingerprint.split("=", 1)[1].strip().lower() in enrolled
    new = fw.mokutil("--list-new").stdout
    assert new.startswith("[key 1]\nSHA1 Fingerprint: ") and hashlib.sha1(der_b).hexdigest()[:2]
    assert "[key 2]" not in new


def test_revoke_import(fw: Firmware, certs):
    path, _ = certs["a"]
    assert fw.mokutil("--import", str(path), stdin="p\np\n").returncode == 0
    result = fw.mokutil("--revoke-import")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert fw.mokutil("--test-key", str(path)).stdout == f"{path} is not enrolled\n"
    assert fw.mokutil("--list-new").stdout == ""


def test_unsupported_options_say_stand_in(fw: Firmware):
    result = fw.mokutil("--delete", "x.der")
    assert result.returncode == 2 and result.stderr.startswith("gpubox sandbox stand-in mokutil:")


# --------------------------------------------------------------------------- the MOK screen


def _queued(fw: Firmware, certs, password: str = "pw") -> bytes:
    path, der = certs["a"]
    assert fw.mokutil("--import", str(path), stdin=f"{password}\n{password}\n").returncode == 0
    return der


def test_mok_screen_enroll_with_the_password(fw: Firmware, certs):
    der = _queued(fw, certs)
    state = st.mok_screen(fw.state, "enroll", "pw")
    assert state["secure_boot"]["pending"]  # nothing changes before the next boot
    assert st.apply_mok_screen(state) == "enrolled 1 key(s)"
    fw.save(state)
    sb = fw.state["secure_boot"]
    assert sb["enrolled"] == [base64.b64encode(der).decode()]
    assert sb["pending"] == [] and sb["pending_password_hash"] is None
    path = certs["a"][0]
    result = fw.mokutil("--test-key", str(path))
    assert (result.returncode, result.stdout) == (1, f"{path} is already enrolled\n")


@pytest.mark.parametrize(
    ("answer", "password", "outcome"),
    [
        ("enroll", "wrong", "wrong password 3 times"),
        ("timeout", None, "no answer"),
        (None, None, "no answer"),  # a reboot nobody prepared for: MokManager times out
    ],
)
def test_mok_screen_without_enrolling_discards_the_request(fw, certs, answer, password, outcome):
    _queued(fw, certs)
    state = fw.state if answer is None else st.mok_screen(fw.state, answer, password)
    assert (st.apply_mok_screen(state) or "").startswith(outcome)
    fw.save(state)
    assert fw.state["secure_boot"]["enrolled"] == []
    path = certs["a"][0]
    assert fw.mokutil("--test-key", str(path)).stdout == f"{path} is not enrolled\n"


def test_mok_screen_rules():
    with pytest.raises(ValueError, match="no EFI"):
        st.mok_screen(st.default_state(), "timeout")
    state = st.set_secure_boot(st.default_state(), True)
    with pytest.raises(ValueError, match="password"):
        st.mok_screen(state, "enroll")
    with pytest.raises(ValueError, match="one of enroll, timeout"):
        st.mok_screen(state, "later")
    assert st.apply_mok_screen(state) is None  # nothing pending: no MOK screen at all
    assert st.apply_mok_screen(st.default_state()) is None


def test_firmware_runs_before_the_next_boot(tmp_path: Path, certs):
    """The supervisor's step between two boots (box._firmware_at_boot) on a root filesystem."""
    root = tmp_path / "rootfs"
    state_file = root / str(standin.STATE_PATH).lstrip("/")
    fw = Firmware(tmp_path, st.set_secure_boot(st.default_state(), True))
    _queued(fw, certs, "pw")
    st.save_state(st.mok_screen(fw.state, "enroll", "pw"), state_file)
    assert faults.firmware_at_boot(root) == "enrolled 1 key(s)"
    assert len(st.load_state(state_file)["secure_boot"]["enrolled"]) == 1
    assert faults.firmware_at_boot(root) is None  # the next boot: no request
    assert faults.firmware_at_boot(tmp_path / "missing") is None


def test_set_secure_boot_keeps_keys_and_efi_off_removes_them(certs):
    state = st.enroll_certificate(st.set_secure_boot(st.default_state(), True), certs["a"][1])
    st.enroll_certificate(state, certs["a"][1])
    assert len(state["secure_boot"]["enrolled"]) == 1
    st.set_secure_boot(state, False)
    assert state["secure_boot"]["enabled"] is False and len(state["secure_boot"]["enrolled"]) == 1
    assert "secure_boot" not in st.set_secure_boot(state, False, efi=False)
    with pytest.raises(ValueError, match="no EFI"):
        st.enroll_certificate(st.default_state(), certs["a"][1])


def test_stand_in_and_state_hash_the_password_alike():
    script = test_standin._load_script(standin.MOKUTIL)
    assert st.password_matches(script.password_hash("abc"), "abc")
    assert not st.password_matches(script.password_hash("abc"), "abd")
    assert not st.password_matches(None, "abc")


# --------------------------------------------------------------------------- the kernel


def load_module_script(tmp_path: Path, dkms_name: str = "nvidia-current") -> Any:
    text = repo_debs._template(
        "nvidia-module-load",
        package="nvidia-kernel-dkms",
        dkms_name=dkms_name,
        loaded_file=str(tmp_path / "loaded-driver"),
    )
    path = tmp_path / "load-module"
    path.write_text(text)
    return test_standin._load_script(path)


def test_taint_letters_follow_tainted_kernels_rst(tmp_path: Path):
    script = load_module_script(tmp_path)
    # NVIDIA's proprietary module: licence "NVIDIA" (P), out of tree (O)
    assert script.taint_letters("NVIDIA", "", True) == "PO"
    assert script.taint_letters("NVIDIA", "", False) == "POE"
    # the open module: "Dual MIT/GPL" is GPL compatible
    assert script.taint_letters("Dual MIT/GPL", "", True) == "O"
    assert script.taint_letters("Dual MIT/GPL", "", False) == "OE"
    assert script.taint_letters("GPL", "Y", True) == ""


def test_signature_check_matches_sig_key_to_enrolled_serials(tmp_path: Path, certs):
    script = load_module_script(tmp_path)
    state = st.enroll_certificate(st.set_secure_boot(st.default_state(), True), certs["a"][1])
    serials = script.enrolled_serials(state["secure_boot"])
    serial = subprocess.run(
        ["openssl", "x509", "-inform", "DER", "-in", str(certs["a"][0]), "-noout", "-serial"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # serial=HEX (no colons); modinfo prints sig_key as colon-hex
    digits = serial.strip().split("=")[1].lstrip("0")
    sig_key = ":".join(digits[i : i + 2] for i in range(0, len(digits), 2))
    assert script.signature_check(sig_key, serials) is None
    assert script.signature_check(sig_key.lower(), serials) is None
    assert script.signature_check("", serials) == "unsigned module"
    assert script.signature_check("01:02:03", serials) == "module with unavailable key"


def test_module_flavours(tmp_path: Path):
    proprietary = load_module_script(tmp_path)
    assert proprietary.ours("nvidia-current") and proprietary.ours("nvidia-current-drm")
    assert not proprietary.ours("nvidia-current-open")
    assert not proprietary.ours("nouveau")
    (tmp_path / "open").mkdir()
    opened = load_module_script(tmp_path / "open", "nvidia-current-open")
    assert opened.ours("nvidia-current-open") and not opened.ours("nvidia-current")


# --------------------------------------------------------------------------- the display card


def test_nouveau_until_blacklisted(tmp_path: Path):
    script = test_standin._load_script(standin.BOOT_MODULES)
    conf = tmp_path / "modprobe.d"
    conf.mkdir()
    assert script.blacklisted("nouveau", [str(conf)]) is None
    (conf / "other.conf").write_text("options nouveau modeset=0\n# blacklist nouveau\n")
    assert script.blacklisted("nouveau", [str(conf)]) is None
    # Debian's nvidia-kernel-support ships nvidia-blacklists-nouveau.conf: "blacklist nouveau"
    (conf / "nvidia-blacklists-nouveau.conf").write_text("blacklist nouveau\n")
    assert "blacklist nouveau" in script.blacklisted("nouveau", [str(conf)])


def _lspci(tmp_path: Path, state: dict[str, Any], *args: str) -> str:
    state_file = tmp_path / "state.json"
    st.save_state(state, state_file)
    env = {**os.environ, st.STATE_ENV: str(state_file), st.SYS_MODULE_ENV: str(tmp_path / "sys")}
    result = subprocess.run(
        [sys.executable, str(standin.LSPCI), *args], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_lspci_k_shows_nouveau_driving_the_display_card(tmp_path: Path):
    desktop = st.set_display_driver(st.default_state(), "nouveau")
    (tmp_path / "sys" / "nouveau").mkdir(parents=True)
    out = _lspci(tmp_path, desktop, "-Dnnk", "-d", "10de:")
    # pciutils 3.9.0 ls-kernel.c show_kernel: "\tKernel driver in use: %s\n", then the
    # modules joined by ", " after "\tKernel modules:"
    assert (
        "0000:09:00.0 VGA compatible controller [0300]: NVIDIA Corporation GK208B "
        "[GeForce GT 710] [10de:128b] (rev a1)\n"
        "\tKernel driver in use: nouveau\n"
        "\tKernel modules: nvidiafb, nouveau\n"
        "0000:09:00.1 Audio device [0403]"
    ) in out
    # the V100s: no driver until the NVIDIA module is loaded
    assert "[10de:1db5] (rev a1)\n\tKernel modules: nvidiafb, nouveau\n" in out
    (tmp_path / "sys" / "nvidia").mkdir()
    assert out.count("Kernel driver in use: nvidia\n") == 0
    out = _lspci(tmp_path, desktop, "-Dnnk", "-d", "10de:")
    assert out.count("Kernel driver in use: nvidia\n") == 2


def test_lspci_k_without_nouveau_loaded(tmp_path: Path):
    desktop = st.set_display_driver(st.default_state(), "nouveau")
    out = _lspci(tmp_path, desktop, "-Dnnk", "-s", "09:00.0")
    assert out.endswith("(rev a1)\n\tKernel modules: nvidiafb, nouveau\n")  # firmware fb
    assert "Kernel driver in use" not in _lspci(tmp_path, st.default_state(), "-nnk")
    assert "Kernel" not in _lspci(tmp_path, desktop, "-Dnn")  # only with -k


# --------------------------------------------------------------------------- the faults


def test_dkms_key_is_made_with_debian_dkms_command():
    # dkms 3.0.10-8+deb12u1 /usr/sbin/dkms prepare_signing (the key and certificate paths are
    # its defaults when framework.conf sets none)
    assert faults.DKMS_KEYGEN == (
        'openssl req -new -x509 -nodes -days 36500 -subj "/CN=DKMS module signing key" '
        "-newkey rsa:2048 -keyout /var/lib/dkms/mok.key -outform DER -out /var/lib/dkms/mok.pub"
    )


def test_secure_boot_faults_set_the_firmware(certs):
    calls: list[str] = []
    der = certs["a"][1]

    def run(command: str, stdin: str | None) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        out = base64.b64encode(der).decode() if command.startswith("base64") else ""
        return subprocess.CompletedProcess(command, 1 if command.startswith("test -f") else 0, out)

    state = faults.plant_secure_boot(st.default_state(), run, enrolled=False)
    assert state["secure_boot"]["enabled"] and state["secure_boot"]["enrolled"] == []
    assert calls == []  # not enrolled: nothing is done in the box
    state = faults.plant_secure_boot(st.default_state(), run, enrolled=True)
    assert state["secure_boot"]["enrolled"] == [base64.b64encode(der).decode()]
    assert any(faults.DKMS_KEYGEN in c for c in calls)  # made, as dkms would, when missing


def test_runfile_fault_calls_the_runfile_stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path):
    seen: list[tuple[Path, str]] = []

    def plant(root: Path, version: str = "580.95.05") -> list[str]:
        seen.append((root, version))
        return ["/usr/bin/nvidia-uninstall"]

    monkeypatch.setattr(faults.runfile_standin, "plant", plant)
    assert faults.plant_runfile(tmp_path) == ["/usr/bin/nvidia-uninstall"]
    faults.plant_runfile(tmp_path, "575.64")
    assert seen == [(tmp_path, "580.95.05"), (tmp_path, "575.64")]


def test_cli_mok_screen_needs_a_password_file():
    from gpubox.sandbox import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["mok-screen"])  # --enroll or --timeout
    assert exc.value.code == 2
    assert "mok-screen" in cli.__doc__ and "secure-boot-enrolled" in faults.FAULTS


def test_modprobe_follows_debians_install_rules(tmp_path: Path):
    script = load_module_script(tmp_path)
    conf = tmp_path / "modprobe.d"
    conf.mkdir()
    # Debian's nvidia-kernel-support 535.309.01 nvidia-modprobe.conf (re-versioned), as
    # /etc/modprobe.d/nvidia.conf has it in the box
    (conf / "nvidia.conf").write_text(
        "install nvidia modprobe -i nvidia-current $CMDLINE_OPTS\n"
        "install nvidia-modeset modprobe nvidia ; modprobe -i nvidia-current-modeset "
        "$CMDLINE_OPTS\n"
        "install nvidia-drm modprobe nvidia-modeset ; modprobe -i nvidia-current-drm "
        "$CMDLINE_OPTS\n"
    )
    script.MODPROBE_DIRS = (str(conf),)
    assert script.install_target("nvidia") == "nvidia-current"
    assert script.modprobe("nvidia-drm") == [
        "nvidia-current",
        "nvidia-current-modeset",
        "nvidia-current-drm",
    ]
    assert script.modprobe("nouveau") == ["nouveau"]


# --------------------------------------------------------------------------- a refused module


def _modinfo_of(path: str, field: str) -> str:
    """modinfo -F FIELD of a stand-in module (the host may have no kmod): its .modinfo."""
    data = Path(path).read_bytes()
    found = [
        entry.split(b"=", 1)[1].decode()
        for entry in data.split(b"\0")
        if entry.startswith(field.encode() + b"=")
    ]
    return found[0] if found else ""


def boot_loader(tmp_path: Path, version: str, state: dict[str, Any]) -> Any:
    """The module unit's load-module at a boot: Debian's install rule for nvidia, a stand-in
    nvidia module of driver ``version`` (gpubox-standin-ko) installed as DKMS installs it
    (nvidia-current.ko) for the running kernel, the box's stand-in state."""
    script = load_module_script(tmp_path)
    kernel = os.uname().release
    moddir = tmp_path / "modules" / kernel
    moddir.mkdir(parents=True)
    subprocess.run(
        [
            sys.executable,
            str(repo_debs.PACKAGES_DIR / "nvidia-dkms" / "gpubox-standin-ko"),
            *("--version", version, "--kernel", kernel, "--flavour", "proprietary"),
            "nvidia",  # Debian's dkms.conf: BUILT_MODULE_NAME nvidia, DEST_MODULE_NAME ...
        ],
        cwd=moddir,
        check=True,
        capture_output=True,
    )
    (moddir / "modules.dep").write_text("updates/dkms/nvidia-current.ko:\n")
    (moddir / "updates" / "dkms").mkdir(parents=True)
    (moddir / "nvidia.ko").rename(moddir / "updates/dkms/nvidia-current.ko")  # nvidia-current
    conf = tmp_path / "modprobe.d"
    conf.mkdir()
    (conf / "nvidia.conf").write_text("install nvidia modprobe -i nvidia-current $CMDLINE_OPTS\n")
    st.save_state(state, tmp_path / "state.json")
    script.MODULES = str(tmp_path / "modules")
    script.MODPROBE_DIRS = (str(conf),)
    script.STATE_FILE = str(tmp_path / "state.json")
    script.SYS_MODULE = str(tmp_path / "sys")
    script.modinfo = _modinfo_of
    return script


@pytest.mark.parametrize("version", ["580.900.01", "570.211.01"])
def test_the_kernel_refuses_the_module_of_a_refused_version(tmp_path: Path, capsys, version: str):
    refusing = st.refuse_module(st.default_state(), "580.900.01")
    script = boot_loader(tmp_path, version, refusing)
    assert script.main() == 0
    out, err = capsys.readouterr()
    loaded = tmp_path / "loaded-driver"
    if version == "580.900.01":
        # Linux 6.1 kernel/module/version.c check_version, then kmod's modprobe for ENOEXEC
        assert err == (
            "kernel: nvidia: disagrees about version of symbol module_layout\n"
            "modprobe: ERROR: could not insert 'nvidia_current': Exec format error\n"
        )
        assert not loaded.exists() and not (tmp_path / "sys" / "nvidia").exists()
    else:  # another version loads as before
        assert loaded.read_text() == "570.211.01 proprietary\n"
        assert (tmp_path / "sys/nvidia/version").read_text() == "570.211.01\n"
        assert "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.211.01" in out


def test_without_the_fault_the_module_loads(tmp_path: Path):
    script = boot_loader(tmp_path, "580.900.01", st.default_state())
    assert script.main() == 0
    assert (tmp_path / "loaded-driver").read_text() == "580.900.01 proprietary\n"


def test_module_refuses_fault_is_per_box_state_and_clear_removes_it(tmp_path: Path):
    info = {"rootfs": str(tmp_path), "box": 1}
    faults.save_hardware_state(st.default_state(), info)
    with pytest.raises(faults.SandboxError, match="--version"):
        faults.plant_fault("module-refuses", info=info)
    faults.plant_fault("module-refuses", version="580.900.01", info=info)
    state = faults.plant_fault("module-refuses", version="580.900.01", info=info)
    assert state["refused_modules"] == ["580.900.01"]
    assert faults.hardware_state(info)["refused_modules"] == ["580.900.01"]
    assert "module-refuses" in faults.FAULTS
    assert "refused_modules" not in faults.clear_faults(info)
    assert "refused_modules" not in faults.hardware_state(info)
