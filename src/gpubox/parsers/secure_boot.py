"""Secure Boot and module signing: mokutil --test-key, `openssl x509 -serial -subject`,
`modinfo -F signer/sig_key`, /sys/module/*/taint and the Secure Boot section of the
`MokKey` fact (gpubox.knowledge.secure_boot.state_command).

Sources of the texts (tests/fixtures/secureboot, tests/fixtures/SOURCES.md):

- mokutil 0.6.0 (the version Ubuntu 24.04 and Debian 12 ship), src/mokutil.c: --test-key
  prints "FILE is not enrolled", "FILE is already enrolled", "FILE is already in the enrollment
  request", "FILE is already in db", "FILE is blocked in dbx" / "in MokListXRT", "FILE is
  already in the built-in trusted keyring", "Not a valid x509 certificate", "Failed to open
  FILE", "Failed to read FILE" (opened, but read(2) failed: a directory, an I/O error), and
  with --ca-check (or a mokutil that forces it) "CA of FILE is already enrolled" / "CA of
  FILE is blocked": the issuer's state, not the key's (test_key in mokutil.c at tags 0.6.0
  and 0.7.2, the same strings). Its exit status is 0 for "not enrolled" and 1 for
  "enrolled" in 0.6.0 and inverted in later upstream commits: only the text is read here.
- kmod (libkmod-signature.c): ``signer`` is the signing certificate's issuer CN (the subject
  CN of a self-signed MOK), ``sig_key`` its serial number as upper-case colon hex without
  leading zero bytes.
- The kernel's Documentation/admin-guide/tainted-kernels.rst: a module's taint letters, ``P``
  proprietary, ``O`` out-of-tree, ``E`` unsigned or signed by an untrusted key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpubox.parsers._common import ParseError, _quote

# mokutil --test-key's answers, in mokutil 0.6.0's words.
TEST_KEY_ANSWERS = (
    # first: "CA of FILE is already enrolled" also ends in " is already enrolled"; the key
    # itself is not enrolled then (the kernel checks a module's signature against the key)
    ("ca-enrolled", re.compile(r"^CA of .* is already enrolled\s*$", re.M)),
    ("blocked", re.compile(r"^CA of .* is blocked\s*$", re.M)),
    ("not-enrolled", re.compile(r" is not enrolled\s*$", re.M)),
    ("enrolled", re.compile(r" is already enrolled\s*$", re.M)),
    ("pending", re.compile(r" is already in the enrollment request\s*$", re.M)),
    ("in-db", re.compile(r" is already in db\s*$", re.M)),
    ("blocked", re.compile(r" is blocked in (dbx|MokListXRT)\s*$", re.M)),
    ("builtin", re.compile(r" is already in the built-in trusted keyring\s*$", re.M)),
    ("invalid", re.compile(r"^Not a valid x509 certificate", re.M)),
    ("unreadable", re.compile(r"^Failed to (open|read) ", re.M)),
    ("no-efi", re.compile(r"EFI variables are not supported|doesn't support Secure Boot")),
)
# The answers under which the kernel trusts the key (MokListRT, the firmware's db, the
# kernel's own keyring).
TRUSTED = ("enrolled", "in-db", "builtin")


def parse_test_key(text: str) -> str:
    """`mokutil --test-key FILE` (stdout and stderr): one of TEST_KEY_ANSWERS' names."""
    for name, pattern in TEST_KEY_ANSWERS:
        if pattern.search(text):
            return name
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    raise ParseError(
        "want mokutil --test-key's 'is not enrolled', 'is already enrolled', 'is already in "
        f"the enrollment request', ...: {_quote(first)}"
    )


def normal_serial(serial: str) -> str:
    """A certificate serial as one comparable string: hex digits only, upper case, no
    leading zeros (openssl prints ``serial=0A1B...``, modinfo ``0A:1B:...``)."""
    digits = re.sub(r"[^0-9A-Fa-f]", "", serial).upper().lstrip("0")
    return digits or "0"


@dataclass(frozen=True)
class Certificate:
    serial: str  # normal_serial()
    subject_cn: str


def parse_x509(text: str) -> Certificate:
    """`openssl x509 -inform DER -in CERT -noout -serial -subject`: OpenSSL 3's
    ``serial=HEX`` and ``subject=CN = NAME`` (OpenSSL 1.1 writes the same; 1.0's
    ``subject= /CN=NAME`` is read too)."""
    serial = re.search(r"^serial=([0-9A-Fa-f]+)\s*$", text, re.M)
    subject = re.search(r"^subject=\s*(.*?)\s*$", text, re.M)
    if not serial or not subject:
        first = next((ln for ln in text.splitlines() if ln.strip()), "")
        raise ParseError(f"want openssl's serial= and subject= lines: {_quote(first)}")
    cn = re.search(r"(?:^|[,/])\s*CN\s*=\s*([^,/]+?)\s*(?:$|,|/)", subject.group(1))
    return Certificate(normal_serial(serial.group(1)), cn.group(1) if cn else "")


@dataclass(frozen=True)
class ModuleFile:
    """One NVIDIA module file DKMS installed for the running kernel."""

    path: str
    name: str  # modinfo's name: the name the module loads under (/sys/module/NAME)
    version: str  # modinfo's version: the driver version it was built from
    signer: str  # "" when unsigned
    sig_key: str  # normal_serial(), "" when unsigned


@dataclass(frozen=True)
class LoadedModule:
    name: str
    taint: str  # /sys/module/NAME/taint: "PO", "POE", "O", "OE", ...

    @property
    def verified(self) -> bool:
        """The kernel verified its signature (no E: tainted-kernels.rst)."""
        return "E" not in self.taint


@dataclass
class MokState:
    """What a Secure Boot box says about its DKMS signing key and the NVIDIA modules."""

    key: str = ""  # the private key's path (framework.conf's mok_signing_key or the default)
    certificate: str = ""  # the certificate's path (mok_certificate or the default)
    key_exists: bool = False
    certificate_exists: bool = False
    test_key: str | None = None  # parse_test_key's answer; None: mokutil missing
    test_key_text: str = ""
    certificate_info: Certificate | None = None
    modules: list[ModuleFile] = field(default_factory=list)
    loaded: list[LoadedModule] = field(default_factory=list)
    shim_validation_disabled: bool = False
    has_update_secureboot_policy: bool = False
    has_mokutil: bool = False

    @property
    def trusted(self) -> bool:
        return self.test_key in TRUSTED


def _fields(rest: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in rest.split("\t"):
        name, sep, value = part.partition("=")
        if sep:
            out[name] = value.strip()
    return out


def parse_mok_state(text: str) -> MokState:
    """The MokKey fact's output (gpubox.knowledge.secure_boot.state_command): ``KEY path``, ``CERT
    path``, ``KEY-EXISTS``, ``CERT-EXISTS``, ``USP`` (update-secureboot-policy is there),
    ``MOKUTIL`` (mokutil is there), ``SHIM-VALIDATION-DISABLED``, ``TEST line`` (mokutil
    --test-key CERT), ``X509 line`` (openssl), ``MOD path<TAB>name=..<TAB>signer=..<TAB>
    version=..<TAB>sig_key=..`` (modinfo), ``LOADED name taint``."""
    state = MokState()
    test_lines: list[str] = []
    x509_lines: list[str] = []
    saw_test = False
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "KEY":
            state.key = rest.strip()
        elif kind == "CERT":
            state.certificate = rest.strip()
        elif kind == "KEY-EXISTS":
            state.key_exists = True
        elif kind == "CERT-EXISTS":
            state.certificate_exists = True
        elif kind == "MOKUTIL":
            state.has_mokutil = True
        elif kind == "USP":
            state.has_update_secureboot_policy = True
        elif kind == "SHIM-VALIDATION-DISABLED":
            state.shim_validation_disabled = True
        elif kind == "TEST":
            saw_test = True
            test_lines.append(rest)
        elif kind == "X509":
            x509_lines.append(rest)
        elif kind == "MOD":
            path, _, tail = rest.partition("\t")
            values = _fields(tail)
            state.modules.append(
                ModuleFile(
                    path=path.strip(),
                    name=values.get("name", ""),
                    version=values.get("version", ""),
                    signer=values.get("signer", ""),
                    sig_key=normal_serial(values["sig_key"]) if values.get("sig_key") else "",
                )
            )
        elif kind == "LOADED":
            name, _, taint = rest.partition(" ")
            state.loaded.append(LoadedModule(name.strip(), taint.strip()))
    if saw_test and state.certificate_exists:
        state.test_key_text = "\n".join(test_lines)
        if state.has_mokutil:
            state.test_key = parse_test_key(state.test_key_text)
    if x509_lines and state.certificate_exists:
        try:
            state.certificate_info = parse_x509("\n".join(x509_lines))
        except ParseError:
            state.certificate_info = None
    return state
