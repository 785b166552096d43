"""The one deb822 stanza parser and writer (gpubox.parsers.apt: Stanza, parse_stanzas,
format_stanza(s)) on the texts gpubox reads: Packages indexes (the recorded ones of
tests/fixtures/apt), a dpkg status stanza, a package's control file, an apt preferences file
and a ``.sources`` file; and the sandbox's reading of the host's apt sources through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubox.parsers import ParseError, Stanza, format_stanza, format_stanzas, parse_stanzas
from gpubox.sandbox import common

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "apt"

# A dpkg status stanza (Debian 12's nvidia-kernel-dkms, shortened): a folded relation, a long
# Description with its " ." paragraph line, and Conffiles, whose value starts on the next line.
STATUS = """\
Package: nvidia-kernel-dkms
Status: install ok installed
Priority: optional
Version: 535.309.01-0+deb12u1
Depends: dkms, nvidia-kernel-support (= 535.309.01-0+deb12u1),
 nvidia-modprobe (>= 535)
Conffiles:
 /etc/modprobe.d/nvidia-kernel-dkms.conf 0123456789abcdef0123456789abcdef
 /etc/nvidia/nvidia-kernel-dkms.ok 00000000000000000000000000000000
Description: NVIDIA binary kernel module DKMS source
 This package builds the NVIDIA binary kernel modules
 needed by nvidia-driver, using DKMS.
 .
 Provided that you have the kernel header packages installed.
"""


def test_a_stanza_keeps_its_fields_in_order_with_their_continuation_lines():
    (stanza,) = parse_stanzas(STATUS)
    assert [name for name, _ in stanza] == [
        "Package",
        "Status",
        "Priority",
        "Version",
        "Depends",
        "Conffiles",
        "Description",
    ]
    assert len(stanza) == 7
    assert stanza["Depends"] == (
        "dkms, nvidia-kernel-support (= 535.309.01-0+deb12u1),\n nvidia-modprobe (>= 535)"
    )
    # a value that starts on the next line: the first line is empty
    assert stanza["Conffiles"] == (
        "\n /etc/modprobe.d/nvidia-kernel-dkms.conf 0123456789abcdef0123456789abcdef"
        "\n /etc/nvidia/nvidia-kernel-dkms.ok 00000000000000000000000000000000"
    )
    synopsis, _, long = stanza["Description"].partition("\n")
    assert synopsis == "NVIDIA binary kernel module DKMS source"
    assert long.splitlines()[2] == " ."


def test_continuation_lines_keep_their_own_whitespace_and_the_first_line_is_stripped():
    (stanza,) = parse_stanzas("Package:   a  \nDescription:\tsynopsis \n\tindented by a tab  \n")
    assert stanza.fields == (("Package", "a"), ("Description", "synopsis\n\tindented by a tab  "))


def test_the_mapping_view_looks_a_field_up_by_name_in_any_case():
    (stanza,) = parse_stanzas(STATUS)
    assert stanza["Version"] == stanza["version"] == stanza["VERSION"] == "535.309.01-0+deb12u1"
    assert stanza.get("Source") is None
    assert stanza.get("Source", "nvidia-kernel-dkms") == "nvidia-kernel-dkms"
    assert "status" in stanza and "Source" not in stanza
    with pytest.raises(KeyError, match="Source"):
        stanza["Source"]
    assert dict(stanza)["Priority"] == "optional"


def test_blank_lines_separate_stanzas_however_many_and_whatever_whitespace_they_hold():
    text = "\n\nPackage: a\nVersion: 1\n \t\n\n   \nPackage: b\r\nVersion: 2\r\n\r\nPackage: c"
    stanzas = parse_stanzas(text)
    assert [s.fields for s in stanzas] == [
        (("Package", "a"), ("Version", "1")),
        (("Package", "b"), ("Version", "2")),
        (("Package", "c"),),
    ]
    assert parse_stanzas("") == [] and parse_stanzas("\n \n# only a comment\n") == []


def test_comment_lines_are_dropped_wherever_they_stand():
    # a .sources file as Debian's cloud images write it: a comment inside the stanza
    sources = """\
# the header
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
# between stanzas, then no blank line
Types: deb-src
URIs: http://deb.debian.org/debian
"""
    # a comment line does not end a stanza (only a blank line does): Types twice in one
    with pytest.raises(ParseError, match="'Types' twice"):
        parse_stanzas(sources)
    (first, second) = parse_stanzas(sources.replace("# between stanzas", "\n# between stanzas"))
    assert first.fields[0] == ("Types", "deb") and len(first) == 4
    assert first["URIs"] == "http://deb.debian.org/debian" and first["Suites"].split() == [
        "bookworm",
        "bookworm-updates",
    ]
    assert second["Types"] == "deb-src"
    # an indented '#' is a continuation line, not a comment
    (stanza,) = parse_stanzas("Description: x\n # kept\n")
    assert stanza["Description"] == "x\n # kept"


def test_the_apt_preferences_the_driver_stage_writes_read_as_stanzas():
    pin = """\
# Managed by gpubox: the NVIDIA driver stays at 570.211.01.
Package: nvidia-driver-cuda nvidia-smi
Pin: version 570.211.01-1
Pin-Priority: 1001

# The other kernel module flavour never installs.
Package: nvidia-kernel-open-dkms
Pin: version *
Pin-Priority: -1
"""
    assert [(s["Package"].split(), s["Pin"], s["Pin-Priority"]) for s in parse_stanzas(pin)] == [
        (["nvidia-driver-cuda", "nvidia-smi"], "version 570.211.01-1", "1001"),
        (["nvidia-kernel-open-dkms"], "version *", "-1"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (" Depends: a\n", "continuation line with no field above it"),
        ("Package: a\n\n continued\n", "continuation line with no field above it"),
        ("Package: a\nnot a field\n", "'not a field'"),
        ("Package: a\nSome Field: x\n", "'Some Field: x'"),  # no space in a name
        ("Package: a\n-Field: x\n", "'-Field: x'"),  # Debian Policy 5.1: not '-' first
        ("Package: a\n: x\n", "': x'"),
        ("Package: a\nVersion: 1\npackage: b\n", "'package' twice"),
    ],
)
def test_a_line_that_is_no_field_is_refused_and_quoted(text: str, message: str):
    with pytest.raises(ParseError, match=message):
        parse_stanzas(text)


def test_the_writer_writes_each_field_on_its_line_and_reads_back_the_same():
    (stanza,) = parse_stanzas(STATUS)
    assert format_stanza(stanza) == STATUS  # byte for byte: Conffiles as dpkg writes it
    assert parse_stanzas(format_stanza(stanza)) == [stanza]
    two = [Stanza((("Package", "a"), ("Version", "1"))), stanza]
    assert format_stanzas(two) == "Package: a\nVersion: 1\n\n" + STATUS
    assert parse_stanzas(format_stanzas(two)) == two
    assert format_stanza([("Empty", "")]) == "Empty: \n"  # aptsim's status fields do this


@pytest.mark.parametrize(
    "name", ["debian-bookworm-nvidia", "ubuntu-noble-nvidia", "ubuntu-noble-desktop-extra"]
)
def test_recorded_indexes_round_trip_byte_for_byte(name: str):
    text = (FIXTURES / f"{name}.Packages").read_text()
    stanzas = parse_stanzas(text)
    assert len(stanzas) == text.count("\nPackage: ") > 20
    body = "".join(line for line in text.splitlines(True) if not line.startswith("#"))
    assert format_stanzas(stanzas) == body.strip("\n") + "\n"
    assert all(s["X-Recorded-From"] for s in stanzas)


@pytest.mark.parametrize(
    "fields",
    [
        [("Bad Name", "x")],
        [("#Comment", "x")],
        [("Package", " padded")],
        [("Description", "synopsis\nnot indented")],
        [("Description", "synopsis\n \n more")],  # a blank line would end the stanza
        [("Description", "synopsis\n")],
    ],
)
def test_the_writer_refuses_what_would_not_read_back(fields: list[tuple[str, str]]):
    with pytest.raises(ValueError):
        format_stanza(fields)


# --------------------------------------------------------------------------- the sandbox's use


def test_the_sandbox_reads_the_hosts_deb822_and_one_line_apt_sources(tmp_path: Path):
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    (parts / "debian.sources").write_text(
        "types: deb deb-src\n"  # field names in any case
        "# a comment inside the stanza\n"
        "URIs: http://mirror.example/debian\n http://second.example/debian\n"
        "Suites: bookworm\n bookworm-updates\n"
        "\n"
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n"
        "\n"
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n"
    )
    (parts / "broken.sources").write_text("Types: deb\nthis is not deb822\n")
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64] http://security.example/debian-security bookworm-security main\n"
        "# deb http://commented.example/debian bookworm main\n"
    )
    assert common.host_apt_sources(tmp_path) == [
        ("http://mirror.example/debian", "bookworm"),
        ("http://mirror.example/debian", "bookworm-updates"),
        ("http://second.example/debian", "bookworm"),
        ("http://second.example/debian", "bookworm-updates"),
        ("http://security.example/debian-security", "bookworm-security"),
    ]
