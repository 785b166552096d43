"""What a check is, what it reads, and what it says.

A **fact** is one read-only command on the host and the parser that reads its output. A
**check** names the facts it reads and a small pure function (``judge``) that turns their
parsed values and the host's configuration into findings; the check's **verdict** says pass,
fail, skip (the check does not apply to this configuration) or error (a fact could not be
read: the tool is missing or fails), with a message naming the host and the part, and the
command that fixes it.

The same check objects drive ``pytest tests/host`` (one test per check and host), ``gpubox
doctor`` (the same verdicts, rendered with their fixes) and the end of ``deploy/full.py``
(the quick checks). Nothing here touches a host: a ``Runner`` (one command in, an ``Output``
out) is handed in by whoever calls."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpubox import parsers
from gpubox.config import HostConfig, Target, target_for
from gpubox.knowledge import reads

NOT_FOUND = 127  # the shell's "command not found"
NOT_READ = -1  # a fact deliberately not read (Facts.not_read): its stderr says why


@dataclass(frozen=True)
class Output:
    """One command's result on the host."""

    rc: int
    stdout: str
    stderr: str = ""
    command: str = ""

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    @property
    def missing(self) -> bool:
        return self.rc == NOT_FOUND

    def first_error_line(self) -> str:
        lines = [ln.strip() for ln in (self.stderr or self.stdout).splitlines() if ln.strip()]
        return lines[0] if lines else f"exit status {self.rc}"


Runner = Callable[[str], Output]
CommandFor = Callable[[HostConfig, "Target | None"], "str | None"]


@dataclass(frozen=True)
class Fact:
    """A read-only command and the parser of its standard output.

    ``command`` is a string, or a function of the host's config and OS target that returns
    the command (None: the fact does not exist for this configuration). ``ok`` lists the exit
    statuses whose output is still a reading (``grep`` finding nothing exits 1). ``active``
    facts act on the host for a moment (run a container, load the GPUs, reload systemd) or
    take many seconds: the host checks read them, doctor and the deploy do not. ``in_turn``
    facts (the API's requests, the process listing) run one after the other once the others,
    which run side by side, have ended: a request would show in the listing, and the server
    has few slots."""

    name: str
    command: str | CommandFor
    parse: Callable[[str], Any] | None = None
    ok: tuple[int, ...] = (0,)
    active: bool = False
    in_turn: bool = False
    parser_name: str = ""

    @classmethod
    def of(
        cls,
        name: str,
        read: reads.Read[Any],
        args: Callable[[HostConfig, Target | None], tuple[Any, ...] | None] | None = None,
        **options: Any,
    ) -> Fact:
        """The fact of one of gpubox.knowledge.reads' reads (the command and parser the deploy's
        pyinfra
        fact runs too): ``args`` gives the read's arguments for a host, None where it is not
        read there (no arguments, every host, without ``args``)."""

        def command(config: HostConfig, target: Target | None) -> str | None:
            given = args(config, target) if args else ()
            return None if given is None else read.command_for(*given)

        fixed = read.command_for() if args is None else command
        return cls(name, fixed, read.parse, parser_name=read.parser_name, **options)

    def command_for(self, config: HostConfig, target: Target | None) -> str | None:
        return self.command if isinstance(self.command, str) else self.command(config, target)

    @property
    def reads_with(self) -> str:
        """The parser's name as a reader finds it: ``parsers.parse_apt_policy``,
        ``checks.facts.parse_http``, ``json.loads``; "raw output" without one."""
        if self.parser_name:
            return self.parser_name
        if self.parse is None:
            return "raw output"
        module = getattr(self.parse, "__module__", None) or ""
        name = getattr(self.parse, "__qualname__", repr(self.parse))
        if module.startswith("gpubox.parsers"):
            return f"parsers.{name}"
        if module.startswith("gpubox."):
            return f"{module.removeprefix('gpubox.')}.{name}"
        return f"{module}.{name}" if module and module != "builtins" else name


class Unreadable(Exception):
    """A fact the check needs could not be read (tool missing, command failed, bad output)."""


class Unreachable(Exception):
    """The host could not be reached at all."""


class Skip(Exception):
    """The check does not apply to this host's configuration."""


@dataclass(frozen=True)
class Finding:
    """One thing wrong a judge found on the box, with a fix when it differs from the check's
    own (not config.Problem, which names a key: the configuration's and the preflight's
    refusals)."""

    message: str
    fix: str | None = None


Judged = str | Finding | Iterable[str | Finding] | None


class Reading:
    """What a judge sees: the host's config and its facts, parsed on demand."""

    def __init__(self, config: HostConfig, facts: Facts | Recorded) -> None:
        self.config = config
        self.facts = facts

    @property
    def target(self) -> Target | None:
        return self.facts.target

    def out(self, name: str) -> Output:
        return self.facts[name]

    def get(self, name: str) -> Any:
        """The fact's parsed value; Unreadable when its command failed or its output does
        not parse."""
        fact = FACTS[name]
        out = self.facts[name]
        if out.rc == NOT_READ:
            raise Unreadable(out.stderr)
        if out.missing:
            raise Unreadable(f"`{out.command}`: {out.first_error_line() or 'command not found'}")
        if out.rc not in fact.ok:
            raise Unreadable(f"`{out.command}` failed ({out.rc}): {out.first_error_line()}")
        if fact.parse is None:
            return out.stdout
        try:
            return fact.parse(out.stdout)
        except (parsers.ParseError, ValueError, KeyError, IndexError) as exc:
            raise Unreadable(f"`{out.command}`: unreadable output ({exc})") from exc


Judge = Callable[[HostConfig, Reading], Judged]
Applies = Callable[[HostConfig], "str | None"]


def always(config: HostConfig) -> str | None:
    return None


@dataclass(frozen=True)
class Check:
    """One verdict on a box: id ("stage.what"), title, marker (quick, gpu, slow, burn, or
    "" for the full run only), the facts it reads and its judge, when it applies, and the
    command that fixes what it finds (``{deploy}`` is the stage's deploy file run on the
    inventory, ``{inv}`` the inventory)."""

    id: str
    title: str
    marker: str
    reads: tuple[str, ...]
    judge: Judge
    fix: str = "{deploy}"
    applies: Applies = always
    stage: str = ""

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def deploy_stage(self) -> str:
        return self.stage or self.area

    @property
    def active(self) -> bool:
        return any(FACTS[name].active for name in self.reads)

    def fix_for(self, inventory: str, template: str | None = None) -> str:
        """The fix (``template``, else the check's own) for a host of ``inventory``."""
        inv = shlex.quote(inventory)
        deploy = f"pyinfra {inv} deploy/{self.deploy_stage}.py"
        return (template or self.fix).format(deploy=deploy, inv=inv)


Status = Literal["pass", "fail", "skip", "error"]


@dataclass(frozen=True)
class Verdict:
    """A check's verdict on one host."""

    check: str
    host: str
    status: Status
    message: str = ""
    fix: str = ""
    title: str = ""
    marker: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "error")

    def __str__(self) -> str:
        return f"{self.message} -> {self.fix}" if self.fix else self.message


def judge(
    check: Check, host: str, config: HostConfig, facts: Facts | Recorded, inventory: str
) -> Verdict:
    """Run one check against a host's facts (read on demand through ``facts``)."""
    base = {"check": check.id, "host": host, "title": check.title, "marker": check.marker}
    reason = check.applies(config)
    if reason is not None:
        return Verdict(status="skip", message=reason, **base)
    try:
        judged = check.judge(config, Reading(config, facts))
    except Skip as exc:
        return Verdict(status="skip", message=str(exc), **base)
    except (Unreadable, ValueError) as exc:
        # ValueError (ParseError, JSONDecodeError): output a judge reads itself, unreadable
        why = exc if isinstance(exc, Unreadable) else f"unreadable output ({exc})"
        return Verdict(
            status="error",
            message=f"{host}: {check.title}: cannot tell: {why}",
            fix=check.fix_for(inventory),
            **base,
        )
    problems = _findings(judged)
    if not problems:
        return Verdict(status="pass", **base)
    fixes = [check.fix_for(inventory, p.fix) for p in problems]
    return Verdict(
        status="fail",
        message=f"{host}: " + "; ".join(p.message for p in problems),
        fix="; ".join(dict.fromkeys(fixes)),
        **base,
    )


def _findings(judged: Judged) -> list[Finding]:
    if judged is None:
        return []
    if isinstance(judged, str | Finding):
        judged = [judged]
    return [p if isinstance(p, Finding) else Finding(p) for p in judged if p]


class Facts(Mapping[str, Output]):
    """A host's facts, each command run once, on first use (or all at once by ``read``).
    The OS target (which names the driver packages) comes from the os_release fact."""

    def __init__(self, run: Runner, config: HostConfig) -> None:
        self._run = run
        self._config = config
        self._outputs: dict[str, Output] = {}
        self._target: Target | None | bool = False

    @property
    def target(self) -> Target | None:
        if self._target is False:
            out = self["os_release"]
            try:
                release = reads.OS_RELEASE.parse(out.stdout) if out.rc == 0 else None
            except parsers.ParseError:
                release = None
            self._target = target_for(release, self._config.catalog) if release else None
        return self._target  # type: ignore[return-value]

    def _command(self, name: str) -> tuple[str | None, Target | None]:
        """The fact's command on this host (None: the fact does not exist here), and the OS
        target it was chosen for."""
        target = None if name == "os_release" else self.target
        return FACTS[name].command_for(self._config, target), target

    def __getitem__(self, name: str) -> Output:
        if name not in self._outputs:
            command, target = self._command(name)
            if command is None:
                raise Unreadable(f"{name}: not read on this host ({_why_not(name, target)})")
            try:
                out = self._run(command)
            except Unreachable:
                raise
            except Exception as exc:  # a connection lost mid-way is one more finding
                out = Output(255, "", f"{type(exc).__name__}: {exc}")
            self._outputs[name] = Output(out.rc, out.stdout, out.stderr, command)
        return self._outputs[name]

    def read(self, names: Iterable[str]) -> None:
        """Read these facts now (the ones that exist for this host)."""
        for name in names:
            with contextlib.suppress(Unreadable):
                self[name]

    def not_read(self, name: str, why: str) -> None:
        """Record that this fact is not read, and why (its checks say "cannot tell: WHY"): a
        fact that does not exist for this host stays unknown."""
        command = None if name in self._outputs else self._command(name)[0]
        if command is not None:
            self._outputs[name] = Output(NOT_READ, "", why, command)

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        try:
            return self[name]
        except Unreadable:
            return default

    def __iter__(self) -> Iterator[str]:
        return iter(self._outputs)

    def __len__(self) -> int:
        return len(self._outputs)

    def __contains__(self, name: object) -> bool:
        return name in self._outputs


def _why_not(name: str, target: Target | None) -> str:
    return "the OS is not a supported one" if target is None else "not for this configuration"


@dataclass(frozen=True)
class Recorded(Mapping[str, Output]):
    """Facts already read (recorded outputs, for tests and replays)."""

    outputs: Mapping[str, Output] = field(default_factory=dict)
    target: Target | None = None

    def __getitem__(self, name: str) -> Output:
        if name not in self.outputs:
            raise Unreadable(f"{name}: not read")
        return self.outputs[name]

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return self.outputs.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)


FACTS: dict[str, Fact] = {}


def fact(*facts: Fact) -> None:
    """Register facts (each name once)."""
    for f in facts:
        assert f.name not in FACTS, f"fact {f.name} defined twice"
        FACTS[f.name] = f
