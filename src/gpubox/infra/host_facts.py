"""pyinfra facts about the GPU box. Each fact runs one read-only command and hands the text
to a pure parser (gpubox.parsers). A fact that the checks read too is one of gpubox.knowledge.reads'
reads (``ReadFact``): the deploy, the host checks and doctor read it with the same command
and parser. Every command exits 0: absence is data, not an error."""

from __future__ import annotations

import json
import shlex
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, cast

from pyinfra.api import FactBase

from gpubox.base import kernels
from gpubox.infra import readahead
from gpubox.knowledge import reads
from gpubox.parsers.secure_boot import MokState
from gpubox.rules.desktop import DESKTOP_COMMAND, Desktop, parse_desktop

T = TypeVar("T")


class ReadFact(FactBase[T]):
    """A pyinfra fact that is one of gpubox.knowledge.reads' reads: ``read``'s parser reads its
    output;
    each fact's ``command`` hands the read its arguments (the checks run the same read)."""

    read: ClassVar[reads.Read[Any]]

    def process(self, output: list[str]) -> T:
        return cast(T, self.read.parse("\n".join(output)))


class OsRelease(ReadFact[Mapping[str, str]]):
    """/etc/os-release as a dict (ID, VERSION_ID, VERSION_CODENAME, ...)."""

    read = reads.OS_RELEASE

    def command(self) -> str:
        return self.read.command_for()


class NvidiaPciDevices(ReadFact[list[Any]]):
    """NVIDIA devices on the PCI bus (lspci -Dnn; sysfs in lspci's format when it is absent)."""

    read = reads.NVIDIA_PCI

    def command(self) -> str:
        return self.read.command_for()

    @staticmethod
    def default() -> list[Any]:
        return []


class SecureBoot(ReadFact[bool | None]):
    """True/False when the firmware says, None on a host without EFI variables."""

    read = reads.SECURE_BOOT

    def command(self) -> str:
        return self.read.command_for()


class MokKey(ReadFact[MokState]):
    """On a Secure Boot box: DKMS's signing key (paths from dkms's framework.conf or the
    distribution's default), whether mokutil says it is enrolled, its serial, and the NVIDIA
    modules DKMS installed for the running kernel (signer) and loaded (taint)."""

    read = reads.MOK_STATE

    def command(self, family: str) -> str:  # type: ignore[override]
        return self.read.command_for(family)


class UserId(FactBase[int]):
    """The uid deploy commands run as (0 when root or through sudo)."""

    def command(self) -> str:
        return "id -u"

    def process(self, output: list[str]) -> int:
        return int(output[0].strip())


class UserGroups(ReadFact[dict[str, list[str] | None]]):
    """Each named user's groups, None for a user the box does not have (docker_users)."""

    read = reads.USER_GROUPS

    def command(self, users: tuple[str, ...]) -> str:  # type: ignore[override]
        return self.read.command_for(users)

    @staticmethod
    def default() -> dict[str, list[str] | None]:
        return {}


class HeldPackages(ReadFact[set[str]]):
    read = reads.HELD_PACKAGES

    def command(self) -> str:
        return self.read.command_for()

    @staticmethod
    def default() -> set[str]:
        return set()


class LoadedDriver(ReadFact[str | None]):
    """The NVIDIA kernel module's version, "mismatch" when nvidia-smi cannot tell it from a
    different userspace, or None when no NVIDIA module is loaded."""

    read = reads.LOADED_DRIVER

    def command(self) -> str:
        return self.read.command_for()


class KernelModuleLoaded(ReadFact[bool]):
    read = reads.MODULE_LOADED

    def command(self, module: str) -> str:  # type: ignore[override]
        return self.read.command_for(module)


class KernelModules(FactBase[kernels.KernelState]):
    """The running kernel, the bootable ones, which have headers, and what DKMS has installed
    (gpubox.base.kernels: its command and parser)."""

    def command(self) -> str:
        return kernels.KERNEL_STATE_COMMAND

    def process(self, output: list[str]) -> kernels.KernelState:
        return kernels.parse_kernel_state(output)


class KernelMetas(FactBase[list[kernels.KernelMeta]]):
    """The installed kernel image meta packages (linux-image-generic, -generic-hwe-24.04,
    -amd64, ...) with their versions (gpubox.base.kernels: its command and parser)."""

    def command(self) -> str:
        return kernels.KERNEL_METAS_COMMAND

    @staticmethod
    def default() -> list[kernels.KernelMeta]:
        return []

    def process(self, output: list[str]) -> list[kernels.KernelMeta]:
        return kernels.parse_kernel_metas("\n".join(output))


class HeadersOffered(FactBase[dict[str, str] | None]):
    """Whether the box's apt repositories offer a kernel headers package: its candidate
    version by name, {} when apt has lists and no candidate, None when apt has no lists
    (gpubox.base.kernels: its command and parser)."""

    def command(self, package: str) -> str:  # type: ignore[override]
        return kernels.headers_query_command(package)

    @staticmethod
    def default() -> dict[str, str] | None:
        return None

    def process(self, output: list[str]) -> dict[str, str] | None:
        return kernels.parse_headers_query("\n".join(output))


class KeyringFingerprints(FactBase[list[str]]):
    """Fingerprints of the keys in an apt keyring file (binary or armored); [] if absent."""

    def command(self, path: str) -> str:
        return (
            f"if [ -s {path} ]; then t=$(mktemp -d); "
            f"gpg --homedir $t --batch --show-keys --with-colons {path} 2>/dev/null "
            "| awk -F: '$1==\"fpr\"{print $10}'; rm -rf $t; fi; true"
        )

    @staticmethod
    def default() -> list[str]:
        return []

    def process(self, output: list[str]) -> list[str]:
        return [line.strip().upper() for line in output if line.strip()]


class AptComponentEnabled(FactBase[bool]):
    """Whether an archive component (e.g. contrib) is enabled in any apt source."""

    def command(self, component: str) -> str:
        return (
            "cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list "
            "/etc/apt/sources.list.d/*.sources 2>/dev/null "
            f"| grep -E '^[[:space:]]*(deb |Components:)' | grep -qw {component} "
            "&& echo yes || echo no"
        )

    def process(self, output: list[str]) -> bool:
        return output[-1].strip() == "yes"


class RealPath(FactBase[str | None]):
    def command(self, path: str) -> str:
        return f"readlink -e {path} || true"

    def process(self, output: list[str]) -> str | None:
        return output[0].strip() if output and output[0].strip() else None


class BootId(FactBase[str]):
    def command(self) -> str:
        return "cat /proc/sys/kernel/random/boot_id"

    def process(self, output: list[str]) -> str:
        return output[0].strip()


class FileDigests(FactBase[dict[str, tuple[str, str] | None]]):
    """(octal mode, sha256) of each regular file, None when absent: one command for a stage's
    managed files, so that a converged host costs one round trip, not three per file."""

    def command(self, paths: tuple[str, ...]) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        return (
            f'for p in {quoted}; do if [ -f "$p" ] && [ ! -L "$p" ]; then '
            'printf \'%s %s %s\\n\' "$p" "$(stat -c %a "$p")" '
            '"$(sha256sum < "$p" | cut -d\' \' -f1)"; fi; done; true'
        )

    @staticmethod
    def default() -> dict[str, tuple[str, str] | None]:
        return {}

    def process(self, output: list[str]) -> dict[str, tuple[str, str] | None]:
        found: dict[str, tuple[str, str] | None] = {}
        for line in output:
            path, mode, digest = line.rsplit(" ", 2)
            found[path] = (mode, digest)
        return found


class JsonFile(FactBase[dict[str, Any]]):
    """A JSON file: {"exists": bool, "data": parsed or None, "error": why it is not valid}."""

    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return f"if [ -e {q} ]; then echo exists; cat {q}; else echo absent; fi"

    @staticmethod
    def default() -> dict[str, Any]:
        return {"exists": False, "data": None, "error": None}

    def process(self, output: list[str]) -> dict[str, Any]:
        if not output or output[0].strip() != "exists":
            return {"exists": False, "data": None, "error": None}
        text = "\n".join(output[1:])
        try:
            data = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            return {"exists": True, "data": None, "error": str(exc)}
        if not isinstance(data, dict):
            return {"exists": True, "data": None, "error": "not a JSON object"}
        return {"exists": True, "data": data, "error": None}


class CommandOutput(FactBase[str]):
    """The stdout of a read-only command (exit status ignored)."""

    def command(self, command: str) -> str:
        return f"{command} 2>/dev/null || true"

    @staticmethod
    def default() -> str:
        return ""

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


class NetworkOutput(CommandOutput):
    """CommandOutput of a command that asks a server (the Hub's sizes and listings): read
    when the stage reads it, never ahead (gpubox.infra.readahead)."""

    readahead = False


class DockerEngine(FactBase[dict[str, Any]]):
    """Whether a Docker engine is installed and running, and which package carries it."""

    def command(self) -> str:
        return (
            "echo binary=$(command -v dockerd || true); "
            "echo active=$(systemctl is-active docker 2>/dev/null || true); "
            'echo package=$(dpkg -S "$(command -v dockerd 2>/dev/null || echo /nonexistent)" '
            "2>/dev/null | cut -d: -f1 || true)"
        )

    @staticmethod
    def default() -> dict[str, Any]:
        return {"binary": None, "active": False, "package": None}

    def process(self, output: list[str]) -> dict[str, Any]:
        values = dict(line.split("=", 1) for line in output if "=" in line)
        return {
            "binary": values.get("binary") or None,
            "active": values.get("active") == "active",
            "package": values.get("package") or None,
        }


# Repair (issue 8 item H): what the host checks rely on is checked cheaply at every deploy, so a
# deleted or truncated file is put back by the next deploy, not only reported by the checks.


class MissingPackageFiles(FactBase[list[tuple[str, str, str]]]):
    """(package, installed version, path) for each file an installed package ships that is
    not on disk: every file of ``packages`` (`dpkg-query -L`) and each of ``paths`` (its owner
    from `dpkg-query -S`, through symlinked directories too). Existence only, nothing is read:
    a converged host costs one quick command. Packages that are not installed, and paths that
    no installed package owns, are left out: installing them is the stage's business. Files
    dpkg was told not to unpack (`path-exclude` in ``dpkg_config``/dpkg.cfg.d, as minimized
    Ubuntu images have for /usr/share/doc) are not missing."""

    def command(
        self,
        packages: tuple[str, ...] = (),
        paths: tuple[str, ...] = (),
        dpkg_config: str = "/etc/dpkg",
    ) -> str:
        q = shlex.quote
        c = q(dpkg_config)
        return (
            # the version of an installed (ii) or held (hi) package, else nothing
            "ver() { dpkg-query -W -f='${db:Status-Abbrev} ${Version}\\n' \"$1\" 2>/dev/null "
            "| awk '$1 ~ /^[ih]i$/ {print $2; exit}'; }; "
            "own() { dpkg-query -S \"$1\" 2>/dev/null | grep -v '^diversion ' "
            "| sed -n 's/: \\/.*//p' | head -n 1 | cut -d, -f1 | tr -d ' '; }; "
            # dpkg's path-exclude/path-include filters, in order, the last match winning
            f"rules=$(cat {c}/dpkg.cfg {c}/dpkg.cfg.d/* 2>/dev/null | sed -n -E "
            "'s/^[[:space:]]*path-(exclude|include)[[:space:]=]+([^[:space:]]+).*/\\1 \\2/p'); "
            'excluded() { [ -n "$rules" ] && printf \'%s\\n\' "$rules" | { s=1; '
            'while read -r k g; do case "$1" in $g) if [ "$k" = exclude ]; then s=0; '
            "else s=1; fi;; esac; done; exit $s; }; }; "
            # the converged case first, in one pass: every file of every installed package
            # there (no shell loop over thousands of files); else the loop names the missing
            f"pkgs={q(' '.join(packages))}; "
            "inst=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' $pkgs 2>/dev/null "
            "| awk '$1 ~ /^[ih]i$/ {print $2}'); "
            "if [ -n \"$inst\" ] && ! dpkg-query -L $inst 2>/dev/null | grep '^/' "
            "| tr '\\n' '\\0' | xargs -0 -r ls -d -- >/dev/null 2>&1; then "
            "for pkg in $pkgs; do "
            'v=$(ver "$pkg"); [ -n "$v" ] || continue; '
            'dpkg-query -L "$pkg" 2>/dev/null | while IFS= read -r f; do case "$f" in /*) '
            '[ -e "$f" ] || [ -L "$f" ] || excluded "$f" || '
            'printf \'%s\\t%s\\t%s\\n\' "$pkg" "$v" "$f";; '
            "esac; done; done; fi; "
            f"for f in {' '.join(q(p) for p in paths)}; do "
            '[ -e "$f" ] || [ -L "$f" ] && continue; '
            'pkg=$(own "$f"); [ -n "$pkg" ] || pkg=$(own "$(readlink -f "$f")"); '
            '[ -n "$pkg" ] || continue; v=$(ver "$pkg"); [ -n "$v" ] || continue; '
            'printf \'%s\\t%s\\t%s\\n\' "$pkg" "$v" "$f"; done; true'
        )

    @staticmethod
    def default() -> list[tuple[str, str, str]]:
        return []

    def process(self, output: list[str]) -> list[tuple[str, str, str]]:
        found: list[tuple[str, str, str]] = []
        for line in output:
            parts = line.split("\t", 2)
            if len(parts) == 3 and all(parts):
                found.append((parts[0], parts[1], parts[2]))
        return found


def manifest_command(directory: str, manifest: str, paths: str) -> str:
    """Shell that records, in ``directory``/``manifest``, the size of each of ``paths`` (shell
    words relative to ``directory``, globs allowed): a build's outputs, written after a
    complete build. Fails (exit status) when one of them is missing."""
    d = shlex.quote(directory)
    m = shlex.quote(f"{directory}/{manifest}")
    return f"(cd {d} && stat -c '%s %n' -- {paths}) > {m}.new && mv {m}.new {m}"


class ManifestProblems(FactBase[list[str]]):
    """What differs from a manifest `manifest_command` wrote: each file it lists that is
    missing or of another size, or the manifest itself when it is absent or empty; [] when
    every file it lists is there at its recorded size."""

    def command(self, manifest: str) -> str:
        m = shlex.quote(manifest)
        return (
            f'if [ ! -s {m} ]; then echo {m}; else cd "$(dirname {m})" && '
            "while read -r size path; do "
            '[ "$(stat -c %s -- "$path" 2>/dev/null)" = "$size" ] || echo "$path"; '
            f"done < {m}; fi; true"
        )

    @staticmethod
    def default() -> list[str]:
        return []

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line.strip()]


class DesktopState(FactBase[Desktop]):
    """What the box shows on its display: the default target, display-manager.service, the
    logind sessions, and the NVIDIA devices with the driver bound to each (gpubox.rules.desktop)."""

    def command(self) -> str:
        return DESKTOP_COMMAND

    @staticmethod
    def default() -> Desktop:
        return Desktop()

    def process(self, output: list[str]) -> Desktop:
        return parse_desktop(output)


# Per run and host: facts the stages read more than once while they plan (see read_once).
_planned: weakref.WeakKeyDictionary[Any, dict[tuple[str, str, str], Any]] = (
    weakref.WeakKeyDictionary()
)


def read_once(cls: type[FactBase[Any]], **kwargs: Any) -> Any:
    """The current host's fact, its command run once per run while the stages plan (pyinfra 3
    runs it again on every get_fact). Only for stage code, which runs before any operation:
    every read then sees the box as it was before the run."""
    from pyinfra import host

    key = (host.name, cls.__name__, repr(sorted(kwargs.items())))
    seen = _planned.setdefault(host.state, {})
    if key not in seen:
        seen[key] = host.get_fact(cls, **kwargs)
    return seen[key]


def prefetch(*specs: tuple[type[FactBase[Any]], dict[str, Any]]) -> None:
    """Read these facts of the current host in one round trip, for read_once to answer (each
    command in its own subshell, one after the other, its output carried back in base64). A
    fact whose command fails, or that names a command it requires, is left to read_once's
    own get_fact; so is everything when the round trip fails."""
    from pyinfra import host
    from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
    from pyinfra.api.facts import _handle_fact_kwargs

    seen = _planned.setdefault(host.state, {})
    todo: list[tuple[tuple[str, str, str], FactBase[Any], str]] = []
    executor: dict[str, Any] = {}
    for cls, kwargs in specs:
        key = (host.name, cls.__name__, repr(sorted(kwargs.items())))
        fact = cls()
        if key in seen or fact.requires_command(**kwargs):
            continue
        # how pyinfra would run it (sudo and the like, from the host's data)
        _, global_kwargs = _handle_fact_kwargs(host.state, host, cls, (), {})
        executor = {k: v for k, v in global_kwargs.items() if k in CONNECTOR_ARGUMENT_KEYS}
        if readahead.has(host, str(fact.command(**kwargs)), executor):
            continue  # read_once's get_fact is answered by the read-ahead
        todo.append((key, fact, str(fact.command(**kwargs))))
    if not todo:
        return
    try:
        with readahead.quiet(host):
            ok, out = host.run_shell_command(
                readahead.script([command for _, _, command in todo]),
                print_output=False,
                **executor,
            )
    except Exception:  # noqa: BLE001 - each fact is then read alone
        return
    if not ok:
        return
    for index, lines in readahead.parse(out.stdout_lines, len(todo)).items():
        key, fact, _ = todo[index]
        try:
            seen[key] = fact.process(lines) if lines else fact.default()
        except Exception:  # noqa: BLE001 - read alone, where pyinfra reports the error
            continue
