"""`gpubox nvlink INVENTORY|--host NAME [--count N] [--interval S]`: NVLink traffic per GPU,
labelled, the way its owner watches `dcgmi dmon -e 449,1011,1012`.

On the host, `dcgmi dmon -e 449,1011,1012 -c N -d MS` streams one row per GPU and sample
over SSH; each row is read with parsers.parse_dcgmi_dmon as it arrives, and each complete
sample is shown as a table: TX and RX bytes per second (fields 1011/1012), their sum, and
DCGM's own NVLink total (449, MB/s), with a line summing all GPUs. The profiling fields read
N/A in the first samples after dmon starts: those show "warming up". Ctrl-C ends it (exit 0).

Exit status (gpubox.remote.reach's codes): 0 samples shown, 1 dcgmi failed or showed nothing, 2 an
unusable inventory or host choice, 3 the host cannot be reached (one line: NAME: unreachable:
WHY).

Everything between the raw lines and the printed table is pure (``Samples``, ``format_rate``,
``render``) and tested on real dmon outputs."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import testinfra

from gpubox import parsers
from gpubox.remote import inventory, reach

FIELDS = "449,1011,1012"
TX, RX, TOTAL = "NVLTX", "NVLRX", "NBWLT"
WARMING_UP = "warming up"


def format_rate(bytes_per_s: float | None) -> str:
    """Bytes per second in decimal units: "0 B/s", "512 B/s", "1.5 kB/s", "12.3 MB/s",
    "25.8 GB/s"; None (dmon's N/A) is "warming up"."""
    if bytes_per_s is None:
        return WARMING_UP
    value = float(bytes_per_s)
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(value) < 999.5 or unit == "GB/s":
            if unit == "B/s":
                return f"{value:.0f} {unit}"
            return f"{value:.1f} {unit}" if abs(value) < 99.95 else f"{value:.0f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Sample:
    """One refresh: every entity's row of one dmon sample, in dmon's order."""

    number: int  # 1, 2, ...
    columns: list[str]
    rows: list[parsers.DmonRow]


class Samples:
    """Feed dmon's output line by line; complete samples come out. A sample ends when an
    entity repeats (the next sample began) or, once the number of entities is known, when
    that many rows have arrived, so a live sample shows without waiting for the next."""

    def __init__(self) -> None:
        self.header: str | None = None
        self.columns: list[str] = []
        self.entities: int | None = None
        self.current: list[parsers.DmonRow] = []
        self.count = 0

    def feed(self, line: str) -> list[Sample]:
        stripped = line.strip()
        if not stripped or stripped.startswith("ID") or "dmon was stopped" in stripped:
            return []
        if parsers.parse_dcgmi_error(stripped) is not None or stripped.startswith("Error"):
            raise parsers.ParseError(stripped)
        if stripped.startswith("#Entity"):
            parsed = parsers.parse_dcgmi_dmon(stripped)
            self.header, self.columns = stripped, parsed.columns
            return []
        if self.header is None:
            raise parsers.ParseError(f"a dmon row before the '#Entity' header: {stripped!r}")
        row = parsers.parse_dcgmi_dmon(f"{self.header}\n{stripped}").rows[0]
        done: list[Sample] = []
        if any(r.entity == row.entity for r in self.current):
            self.entities = self.entities or len(self.current)
            done.append(self._emit())
        self.current.append(row)
        if self.entities is not None and len(self.current) == self.entities:
            done.append(self._emit())
        return done

    def close(self) -> list[Sample]:
        """The last sample, when the stream ends."""
        return [self._emit()] if self.current else []

    def _emit(self) -> Sample:
        self.count += 1
        sample = Sample(self.count, self.columns, self.current)
        self.current = []
        return sample


def samples(lines: Iterable[str]) -> Iterator[Sample]:
    reader = Samples()
    for line in lines:
        yield from reader.feed(line)
    yield from reader.close()


def _sum(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def render(sample: Sample, host: str = "") -> str:
    """The sample as a table: per GPU TX, RX, TX+RX (and DCGM's 449 total when shown), then
    the sum over all GPUs."""
    has_total = TOTAL in sample.columns
    header = ["", "TX", "RX", "TX+RX"] + (["NVLink total (449)"] if has_total else [])
    table = [header]
    txs, rxs, totals = [], [], []
    for row in sample.rows:
        tx, rx = row.values.get(TX), row.values.get(RX)
        both = _sum([tx, rx])
        total = row.values.get(TOTAL)
        txs.append(tx)
        rxs.append(rx)
        totals.append(None if total is None else total * 1e6)
        cells = [row.entity, format_rate(tx), format_rate(rx), format_rate(both)]
        if has_total:
            cells.append(format_rate(totals[-1]))
        table.append(cells)
    if len(sample.rows) > 1:
        cells = ["all", format_rate(_sum(txs)), format_rate(_sum(rxs))]
        cells.append(format_rate(_sum([_sum(txs), _sum(rxs)])))
        if has_total:
            cells.append(format_rate(_sum(totals)))
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    title = f"NVLink traffic{f' on {host}' if host else ''}, sample {sample.number}"
    lines = [title]
    for cells in table:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        lines.append("  ".join([first, *rest]).rstrip())
    return "\n".join(lines) + "\n"


def dmon_command(count: int | None, interval: float) -> str:
    """The command run on the host: -c 0 streams until stopped."""
    return f"dcgmi dmon -e {FIELDS} -c {count or 0} -d {max(1, round(interval * 1000))}"


ERROR_FIXES = {
    "no_hostengine": "the DCGM host engine is not running: sudo systemctl start nvidia-dcgm",
    "module_not_loaded": (
        "fields 1011/1012 need DCGM's profiling module (datacenter-gpu-manager-4-proprietary): "
        "pyinfra INVENTORY deploy/dcgm.py"
    ),
    "requires_root": "dcgmi needs the host engine running as root: sudo systemctl restart "
    "nvidia-dcgm",
}


def explain(error: str) -> str:
    """A dcgmi error line with what to do about it."""
    kind = parsers.parse_dcgmi_error(error)
    fix = ERROR_FIXES.get(kind or "")
    return f"{error}\n  -> {fix}" if fix else error


# --------------------------------------------------------------------------- remote


def stream(host: Any, command: str) -> Iterator[str]:
    """The command's output lines as they arrive, over testinfra's paramiko connection (with
    its sudo wrapping). A pseudo-terminal makes the remote dcgmi stop with the channel."""
    channel = host.backend.client.get_transport().open_session()
    try:
        channel.get_pty()
        channel.exec_command(host.backend.get_command(command))
        pending = ""
        while True:
            data = channel.recv(4096)
            if not data:
                break
            pending += data.decode("utf-8", "replace")
            *lines, pending = pending.replace("\r\n", "\n").split("\n")
            yield from lines
        if pending:
            yield pending
    finally:
        channel.close()


class HostUnreachable(Exception):
    """The host cannot be reached; args: (name, why)."""


def _connect(args: argparse.Namespace, tmp: str) -> tuple[str, Any]:
    """(name, testinfra host) of the host to watch; raises HostUnreachable (with why) when
    its SSH cannot be reached, SystemExit(2) for an unusable inventory or choice."""
    if args.inventory is None:
        user_config = Path.home() / ".ssh" / "config"  # an alias there, as ssh would read it
        data = {"ssh_config_file": str(user_config)} if user_config.is_file() else {}
        why = reach.probe(args.host, data)
        if why is not None:
            raise HostUnreachable(args.host, why)
        return args.host, testinfra.get_host(f"paramiko://{args.host}")
    try:
        hosts = inventory.load(args.inventory)
    except inventory.InventoryError as exc:
        print(f"gpubox nvlink: cannot read {args.inventory}: {exc}", file=sys.stderr)
        raise SystemExit(reach.BAD_INPUT) from None
    if args.host is not None:
        hosts = [(n, d) for n, d in hosts if n == args.host]
        if not hosts:
            print(f"gpubox nvlink: no host {args.host} in {args.inventory}", file=sys.stderr)
            raise SystemExit(reach.BAD_INPUT)
    if len(hosts) != 1:
        names = ", ".join(n for n, _ in hosts) or "none"
        print(
            f"gpubox nvlink: {args.inventory} has {len(hosts)} hosts ({names}): pick one "
            "with --host NAME",
            file=sys.stderr,
        )
        raise SystemExit(reach.BAD_INPUT)
    name, data = hosts[0]
    why = reach.probe(name, data)
    if why is not None:
        raise HostUnreachable(name, why)
    ssh_config = Path(tmp) / "ssh_config"
    ssh_config.write_text(inventory.ssh_config_entry(name, data))
    return name, testinfra.get_host(
        f"paramiko://{name}", ssh_config=str(ssh_config), sudo=inventory.uses_sudo(data)
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpubox nvlink",
        description="Watch NVLink traffic per GPU (TX, RX, total), from dcgmi dmon on the host.",
    )
    parser.add_argument("inventory", nargs="?", help="pyinfra inventory (one host, or --host)")
    parser.add_argument("--host", help="the inventory's host to watch, or an SSH host name")
    parser.add_argument("--count", type=int, help="stop after N samples (default: until Ctrl-C)")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between samples (default 1)"
    )
    args = parser.parse_args(argv)
    if args.inventory is None and args.host is None:
        parser.error("give an INVENTORY or --host NAME")
    if args.count is not None and args.count < 1:
        parser.error("--count must be 1 or more")
    if args.interval <= 0:
        parser.error("--interval must be positive")
    live = sys.stdout.isatty() and args.count is None
    name = args.host or "?"
    try:
        with tempfile.TemporaryDirectory(prefix="gpubox-nvlink-") as tmp:
            name, host = _connect(args, tmp)
            command = dmon_command(args.count, args.interval)
            shown = 0
            previous_lines = 0
            for sample in samples(stream(host, command)):
                text = render(sample, name)
                if live and previous_lines:
                    sys.stdout.write(f"\x1b[{previous_lines}F\x1b[J")
                elif shown:
                    sys.stdout.write("\n")
                sys.stdout.write(text)
                sys.stdout.flush()
                previous_lines = text.count("\n")
                shown += 1
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 0
    except HostUnreachable as exc:
        print(reach.unreachable_line(*exc.args), file=sys.stderr)
        return reach.UNREACHABLE
    except parsers.ParseError as exc:
        print(f"gpubox nvlink: {explain(str(exc))}", file=sys.stderr)
        return 1
    except Exception as exc:  # the connection (paramiko's, or the socket's), lost after the probe
        if not isinstance(exc, OSError | EOFError) and not type(exc).__module__.startswith(
            "paramiko"
        ):
            raise
        print(reach.unreachable_line(name, f"{type(exc).__name__}: {exc}"), file=sys.stderr)
        return reach.UNREACHABLE
    if not shown:
        print(f"gpubox nvlink: `{command}` printed no sample", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
