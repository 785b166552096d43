"""Secure Boot: the DKMS signing key, its enrollment, and the signed NVIDIA modules (pure).

With Secure Boot on, the kernel loads a module only if it is signed by a key it trusts. The
driver's module is built on the box by DKMS, which signs it with a Machine Owner Key (MOK):

- its paths come from ``mok_signing_key`` / ``mok_certificate`` in dkms's
  ``/etc/dkms/framework.conf`` and ``framework.conf.d/*.conf`` (shell assignments dkms sources,
  ``$kernelver`` allowed: the state command sources them the same way), resolved as dkms's
  ``prepare_signing`` does (``signing_paths_shell``):
- Ubuntu with ``mok_signing_key`` unset: both forced to ``/var/lib/shim-signed/mok/MOK.priv`` +
  ``MOK.der`` (whatever ``mok_certificate`` says), created by ``update-secureboot-policy
  --new-key`` (shim-signed) when missing;
- otherwise (Debian 12; Ubuntu with ``mok_signing_key`` set) each one unset defaults to
  ``/var/lib/dkms/mok.key`` / ``mok.pub``, created by dkms itself with ``openssl req ... -subj
  "/CN=DKMS module signing key"`` when missing.

(github.com/dell/dkms ``dkms.in`` ``prepare_signing`` at tags v3.0.10, Debian 12's, and
v3.0.11, Ubuntu 24.04's: the same resolution in both; Ubuntu's shim-signed
``update-secureboot-policy``.) The key is trusted once the owner enrolled it: ``mokutil
--import CERT`` queues it, and the next boot's MokManager screen (shim) asks for the same
one-time password at the console; unanswered for about 10 seconds, the request is dropped.
Nothing can do that step for the owner, so the driver stage (``gate``):

- Secure Boot off or absent: nothing to do;
- key trusted (``mokutil --test-key``: enrolled, in the firmware's db, or built in): go on;
  but an NVIDIA module of the pinned version already signed by another key is refused;
- key missing: create it as the distribution's dkms would (and change nothing else), then stop
  before the driver with the enrollment steps;
- key not enrolled, or waiting in the enrollment request: stop before the driver with the steps
  (the import already done, in the second case);
- key blocked (dbx, MokListX; or its CA), not a certificate, or unreadable (mokutil's "Failed
  to open/read FILE"): refused, saying which file and what to do;
- only its CA enrolled ("CA of FILE is already enrolled"): not trusted, the steps as for a key
  not enrolled.

The host check ``driver.secure-boot`` reads the same state on a converged box: every loaded
NVIDIA module verified by the kernel (no ``E`` taint) and signed by the enrolled key.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from gpubox.parsers.secure_boot import MokState

# Where each distribution's dkms keeps its signing key when framework.conf sets neither path
# (for "debian", also each path's default wherever dkms does not force Ubuntu's pair).
DEFAULT_KEYS = {
    "ubuntu": ("/var/lib/shim-signed/mok/MOK.priv", "/var/lib/shim-signed/mok/MOK.der"),
    "debian": ("/var/lib/dkms/mok.key", "/var/lib/dkms/mok.pub"),
}
FRAMEWORK_CONF = ("/etc/dkms/framework.conf", "/etc/dkms/framework.conf.d/*.conf")
# `mokutil --sb-state`, or its answer read from the SecureBoot EFI variable (byte 5: after 4
# attribute bytes, the value; as Ubuntu's update-secureboot-policy reads it) without mokutil.
_SB_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
SB_STATE_COMMAND = (
    "if command -v mokutil >/dev/null 2>&1; then mokutil --sb-state 2>&1; "
    f"elif [ -r {_SB_VAR} ]; then "
    f"if [ \"$(od -An -t u1 -j4 -N1 {_SB_VAR} | tr -d ' ')\" = 1 ]; "
    "then echo 'SecureBoot enabled'; else echo 'SecureBoot disabled'; fi; "
    "else echo 'EFI variables are not supported on this system'; fi || true"
)
UBUNTU_OPENSSL_CNF = "/usr/lib/shim/mok/openssl.cnf"
DEBIAN_SUBJECT = "/CN=DKMS module signing key"


_MODINFO_AWK = (
    r'{ k = $0; sub(/:.*/, "", k); v = $0; sub(/^[^:]*:[ \t]*/, "", v); '
    "if (!(k in seen)) { seen[k] = 1; f[k] = v } } "
    r'END { printf "MOD %s\tname=%s\tversion=%s\tsigner=%s\tsig_key=%s\n", '
    'm, f["name"], f["version"], f["signer"], f["sig_key"] }'
)


def signing_paths_shell(family: str) -> str:
    """Shell that sets ``key`` and ``cert`` to the paths dkms signs with, resolved exactly as
    dkms's own ``prepare_signing`` does. Source: github.com/dell/dkms, ``dkms.in`` at tags
    v3.0.10 (Debian 12) and v3.0.11 (Ubuntu 24.04), functions ``read_framework_conf`` (each of
    /etc/dkms/framework.conf, framework.conf.d/*.conf that exists, sourced in turn, with
    ``$kernelver`` set) and ``prepare_signing``:

        if [[ -z "${mok_signing_key}" ]]; then case "$running_distribution" in ubuntu* )
            mok_signing_key=/var/lib/shim-signed/mok/MOK.priv
            mok_certificate=/var/lib/shim-signed/mok/MOK.der ;; esac; fi
        [ ! "${mok_signing_key}" ] && mok_signing_key=/var/lib/dkms/mok.key
        [ ! "${mok_certificate}" ] && mok_certificate=/var/lib/dkms/mok.pub

    ``running_distribution`` is ``distro_version``'s: os-release's ID ``ubuntu``, else the
    first ID_LIKE, else the ID; gpubox's ``family`` (ubuntu, debian) is that value here."""
    ubuntu_key, ubuntu_cert = DEFAULT_KEYS["ubuntu"]
    dkms_key, dkms_cert = DEFAULT_KEYS["debian"]
    confs = " ".join(FRAMEWORK_CONF)
    forced = (
        f'[ -z "$mok_signing_key" ] && mok_signing_key={ubuntu_key} '
        f"&& mok_certificate={ubuntu_cert}; "
        if family == "ubuntu"
        else ""
    )
    return (
        "kernelver=$(cat /proc/sys/kernel/osrelease); mok_signing_key=; mok_certificate=; "
        f'for f in {confs}; do [ -e "$f" ] && . "$f"; done >/dev/null 2>&1; '
        f"{forced}"
        f'key="${{mok_signing_key:-{dkms_key}}}"; cert="${{mok_certificate:-{dkms_cert}}}"; '
    )


def state_command(family: str) -> str:
    """One read-only shell command (exits 0) whose output parsers.secure_boot.parse_mok_state
    reads: the key's paths (framework.conf sourced and resolved as dkms's prepare_signing
    does: signing_paths_shell), whether they exist,
    whether shim's validation is off (/proc/sys/kernel/moksbstate_disabled, which Ubuntu's
    update-secureboot-policy reads), mokutil --test-key, the certificate's serial and subject,
    every NVIDIA module DKMS installed for the running kernel (modinfo), and the loaded ones'
    taint."""
    return (
        f"( {signing_paths_shell(family)}"
        'echo "KEY $key"; echo "CERT $cert"; '
        '{ [ -e "$key" ] || case "$key" in pkcs11:*) true;; *) false;; esac; } '
        "&& echo KEY-EXISTS; "
        '[ -e "$cert" ] && echo CERT-EXISTS; '
        '[ "$(cat /proc/sys/kernel/moksbstate_disabled 2>/dev/null)" = 1 ] && '
        "echo SHIM-VALIDATION-DISABLED; "
        "command -v update-secureboot-policy >/dev/null 2>&1 && echo USP; "
        "if command -v mokutil >/dev/null 2>&1; then echo MOKUTIL; "
        '[ -e "$cert" ] && mokutil --test-key "$cert" 2>&1 | sed \'s/^/TEST /\'; '
        "else echo 'TEST mokutil: not found'; fi; "
        '[ -e "$cert" ] && openssl x509 -inform DER -in "$cert" -noout -serial -subject 2>&1 '
        "| sed 's/^/X509 /'; "
        'for m in /lib/modules/"$kernelver"/updates/dkms/nvidia*.ko*; do [ -e "$m" ] || continue; '
        # one modinfo per module (each field's first line, as modinfo -F gives it)
        f'modinfo "$m" 2>/dev/null | awk -v m="$m" {shlex.quote(_MODINFO_AWK)}; done; '
        'for d in /sys/module/nvidia*; do [ -r "$d/taint" ] && '
        'echo "LOADED ${d##*/} $(cat "$d/taint")"; done ) 2>/dev/null; true'
    )


def create_key_command(family: str, state: MokState) -> str:
    """Create the signing key where dkms will look for it, the way the distribution's dkms
    does: Ubuntu's default paths through update-secureboot-policy --new-key when it is there
    (dkms removes MOK.der first); otherwise dkms's own openssl command (Debian's subject; for
    Ubuntu's default pair without update-secureboot-policy, the subject shim-signed uses: dkms
    itself would not sign then). Private key readable by root only."""
    key, cert = shlex.quote(state.key), shlex.quote(state.certificate)
    folders = sorted(
        {state.key.rsplit("/", 1)[0] or "/", state.certificate.rsplit("/", 1)[0] or "/"}
    )
    mkdir = "mkdir -p " + " ".join(shlex.quote(f) for f in folders)
    ubuntu_defaults = (state.key, state.certificate) == DEFAULT_KEYS["ubuntu"]
    if family == "ubuntu" and ubuntu_defaults and state.has_update_secureboot_policy:
        return f"rm -f {cert} && SHIM_NOTRIGGER=y update-secureboot-policy --new-key"
    if family == "ubuntu" and ubuntu_defaults:
        subject = '"/CN=$(hostname -s | cut -b1-31) Secure Boot Module Signature key"'
        config = f"$( [ -f {UBUNTU_OPENSSL_CNF} ] && echo '-config {UBUNTU_OPENSSL_CNF}' )"
        return (
            f"umask 077 && {mkdir} && openssl req {config} -subj {subject} -new -x509 "
            f"-newkey rsa:2048 -nodes -days 36500 -outform DER -keyout {key} -out {cert}"
        )
    return (
        f"umask 077 && {mkdir} && openssl req -new -x509 -nodes -days 36500 "
        f"-subj {shlex.quote(DEBIAN_SUBJECT)} -newkey rsa:2048 -keyout {key} "
        f"-outform DER -out {cert}"
    )


@dataclass
class Gate:
    """What the driver stage does about Secure Boot on one host."""

    action: str  # "go", "stop" (after the operations in `create`), "refuse"
    lines: list[str] = field(default_factory=list)  # what the owner reads
    create_key: str | None = None  # the command that creates the key, when it is missing
    install_mokutil: bool = False
    warnings: list[str] = field(default_factory=list)


def enrollment_steps(certificate: str, pending: bool) -> list[str]:
    """The owner's steps. A request queued earlier (by dkms, or by Ubuntu's
    update-secureboot-policy) may hold a password the owner never chose, and a second
    ``--import`` of a key already in it changes nothing ("SKIP: ... is already in the
    enrollment request"). ``mokutil --revoke-import`` deletes the whole request (MokNew and
    MokAuth), and a fresh ``--import`` then queues the key with a password the owner types
    (mokutil 0.6.0 src/mokutil.c revoke_request, issue_mok_request). A key not in the request
    needs no revoke: its ``--import`` sets a new password for the whole request."""
    import_cmd = f"sudo mokutil --import {certificate}"
    first = (
        f"1. The import is already done: {certificate} is in the enrollment request "
        "(mokutil --test-key says so); nothing to type now if you know its password. If you "
        "do not (dkms or update-secureboot-policy may have queued it): sudo mokutil "
        f"--revoke-import, then {import_cmd}  (a new one-time password, twice)"
        if pending
        else f"1. On the box: {import_cmd}  (it asks for a one-time password twice; you type "
        "it again at the next boot)"
    )
    return [
        first,
        "2. Reboot with someone at the console or a remote KVM: the blue 'Shim UEFI key "
        "management' screen waits about 10 seconds for a key press; then Enroll MOK, Continue, "
        "Yes, the password, Reboot. Left unanswered, the request is dropped and the next "
        "deploy says 'not enrolled' again.",
        "3. Run the deploy again: it continues from here.",
    ]


def gate(
    host: str, family: str, secure_boot: bool | None, state: MokState | None, driver_version: str
) -> Gate:
    """The decision for one host (pure): see the module's docstring."""
    if not secure_boot or state is None:
        return Gate("go")
    if state.shim_validation_disabled:
        return Gate(
            "go",
            warnings=[
                f"{host}: Secure Boot is on but shim's validation is disabled (shim's "
                "MokSBState): the kernel may load unsigned modules; the deploy goes on without "
                "checking the signing key"
            ],
        )
    cert = state.certificate
    lost = "Secure Boot is on: the kernel loads the NVIDIA module only if it is signed by an "
    lost += "enrolled key (else 'Key was rejected by service')"
    if not (state.key_exists and state.certificate_exists):
        missing = [
            p
            for p, ok in ((state.key, state.key_exists), (cert, state.certificate_exists))
            if not ok
        ]
        return Gate(
            "stop",
            [
                f"{host}: {lost}. DKMS's signing key was missing ({', '.join(missing)}): the "
                f"deploy created it, as dkms would, and stops before the driver; nothing else "
                "was changed. Enroll it:",
                *enrollment_steps(cert, pending=False),
            ],
            create_key=create_key_command(family, state),
            install_mokutil=not state.has_mokutil,
        )
    if not state.has_mokutil or state.test_key is None:
        return Gate(
            "stop",
            [
                f"{host}: {lost}, and mokutil is not installed: the deploy installs it and "
                "stops before the driver. Then: sudo mokutil --test-key "
                f"{cert}; if it says 'is not enrolled':",
                *enrollment_steps(cert, pending=False),
            ],
            install_mokutil=True,
        )
    answer = state.test_key
    if answer in ("not-enrolled", "pending", "ca-enrolled"):
        said = {
            "pending": "waits in the enrollment request",
            "not-enrolled": "is not enrolled",
            # mokutil's "CA of FILE is already enrolled": dkms's signature names the key itself
            "ca-enrolled": "is not enrolled itself (its CA is: mokutil says 'CA of ... is "
            "already enrolled'; the kernel checks the module's signature against the key)",
        }[answer]
        return Gate(
            "stop",
            [
                f"{host}: {lost}. DKMS's signing key {cert} {said}; the deploy stops before "
                "the driver, nothing was changed. Enroll it:",
                *enrollment_steps(cert, pending=answer == "pending"),
            ],
        )
    if answer == "blocked":
        return Gate(
            "refuse",
            [
                f"secure_boot: {cert} is blocked (dbx or MokListX: mokutil --test-key): the "
                "kernel will never trust it. Move the key pair aside so that dkms makes a new "
                "one (or run the deploy, which creates it), then enroll the new certificate"
            ],
        )
    if answer == "unreadable":
        return Gate(
            "refuse",
            [
                f"secure_boot: mokutil --test-key cannot read {cert} "
                f"({state.test_key_text.strip()}): DKMS signs with that certificate, so it "
                "must be a readable file (not a directory, not on a failing disk). If "
                "mok_certificate in /etc/dkms/framework.conf (or framework.conf.d) names the "
                "wrong file, fix it; otherwise move it and its key "
                f"{state.key} aside: the deploy's driver stage then makes a new pair as dkms "
                "would (or dkms does, on its next build). Then run the deploy again"
            ],
        )
    if answer in ("invalid", "no-efi"):
        return Gate(
            "refuse",
            [
                f"secure_boot: mokutil --test-key {cert} cannot read it "
                f"({state.test_key_text.strip()}): it must be the DER certificate of DKMS's "
                "signing key; fix mok_certificate in /etc/dkms/framework.conf, or move the key "
                "pair aside so that a new one is made"
            ],
        )
    # trusted: an NVIDIA module of the pinned version signed by another key would not load
    info = state.certificate_info
    wrong = [
        m
        for m in state.modules
        if m.version == driver_version and info is not None and m.sig_key != info.serial
    ]
    if wrong:
        shown = "; ".join(
            f"{m.path} " + (f"signed by '{m.signer}' ({m.sig_key})" if m.sig_key else "unsigned")
            for m in wrong
        )
        return Gate(
            "refuse",
            [
                f"secure_boot: the enrolled key is '{info.subject_cn if info else '?'}' "
                f"({info.serial if info else '?'}, {cert}), but {shown}: the kernel would "
                "refuse it. Rebuild the module so DKMS signs it with the enrolled key (dkms "
                "status names it: sudo dkms remove MODULE/VERSION --all && sudo dkms install "
                "MODULE/VERSION), then run the deploy again"
            ],
        )
    return Gate("go")


def module_problems(state: MokState) -> list[str]:
    """With Secure Boot on, on a converged box: every loaded NVIDIA module verified by the
    kernel, every NVIDIA module DKMS installed for the running kernel signed by the enrolled
    key, and that key trusted (the host check and doctor)."""
    problems: list[str] = []
    if state.shim_validation_disabled:
        return problems
    if not state.certificate_exists:
        problems.append(f"DKMS's signing certificate {state.certificate} is missing")
    elif state.test_key is None:
        problems.append("mokutil is not installed: cannot tell whether the key is enrolled")
    elif not state.trusted:
        problems.append(
            f"DKMS's signing key {state.certificate} is not trusted by the firmware "
            f"(mokutil --test-key: {state.test_key_text.strip() or state.test_key})"
        )
    if not state.loaded:
        problems.append("no NVIDIA module is loaded (refused by the kernel? journalctl -k)")
    problems += [
        f"/sys/module/{m.name}/taint is '{m.taint}': the kernel did not verify its signature"
        for m in state.loaded
        if not m.verified
    ]
    info = state.certificate_info
    for module in state.modules:
        if not module.sig_key:
            problems.append(f"{module.path} is not signed")
        elif info is not None and module.sig_key != info.serial:
            problems.append(
                f"{module.path} is signed by '{module.signer}' ({module.sig_key}), not by the "
                f"enrolled key '{info.subject_cn}' ({info.serial})"
            )
    return problems
