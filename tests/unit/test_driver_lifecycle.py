"""Issue 30 A: each driver branch's lifecycle in the catalog (designation, end of life, source),
the note a host gets past or near its branch's end of life with the branch to move to for its
GPUs, `gpubox check` printing it (exit 0), and docs/deploy.md's "Which branch" table."""

from __future__ import annotations

import copy
import datetime
import re
from pathlib import Path
from typing import Any

import pytest

from gpubox import catalog, cli
from gpubox.config import load_host_config, validate
from gpubox.knowledge import driver_lifecycle as lifecycle
from gpubox.rules import driver_lifecycle as host_lifecycle

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "NVIDIA, Supported Drivers and CUDA Toolkit Versions, 615 and 620 editions"
DEC_2026 = datetime.date(2026, 12, 4)
JAN_2028 = datetime.date(2028, 1, 10)
DEC_2027 = datetime.date(2027, 12, 31)


def branches() -> dict[str, Any]:
    return copy.deepcopy(catalog.load()["driver"]["branches"])


def with_newer(eol: str = "2029-09") -> dict[str, Any]:
    """The catalog's branches and an R620 (long-term support, 620 edition), as a catalog that
    knew a newer branch would hold it."""
    found = branches()
    found["620"] = {
        "version": "620.0.0",
        "lifecycle": {
            "designation": "long-term support",
            "eol": eol,
            "status": None,
            "source": "NVIDIA, Supported Drivers and CUDA Toolkit Versions, 620 edition",
        },
    }
    return found


# ------------------------------------------------------------------------------ the data


def test_the_catalog_records_each_branch_lifecycle_with_its_source():
    found = branches()
    assert lifecycle.problems(found) == []
    assert [life.branch for life in lifecycle.table(found)] == sorted(found, key=int)
    r570 = lifecycle.lifecycle("570", found)
    assert (r570.eol, r570.status, r570.designation) == (
        None,
        "unlisted since the 615 edition",
        None,
    )
    assert r570.past(DEC_2026) and r570.past(datetime.date(2025, 1, 1))  # no month: past
    r580 = lifecycle.lifecycle("580", found)
    assert (r580.designation, r580.eol, r580.source) == ("long-term support", "2028-06", SOURCE)


def test_the_last_branch_per_generation_is_compats_not_the_catalogs():
    """The catalog names no GPU generation: which branch is whose last is compat's alone."""
    text = (ROOT / "src" / "gpubox" / "catalog.yml").read_text(encoding="utf-8")
    driver = text.split("\ndriver:\n", 1)[1].split("\n  packages:", 1)[0]
    data = [line for line in driver.splitlines() if not line.lstrip().startswith("#")]
    assert not any(re.search(r"Volta|Pascal|Maxwell|last_driver_branch", ln) for ln in data)


BAD_ENTRIES = [
    ({"eol": "2027-13"}, "eol must be a month, YYYY-MM"),
    ({"eol": "June 2028"}, "eol must be a month, YYYY-MM"),
    ({"eol": 202806}, "eol must be a month, YYYY-MM"),
    ({"designation": "LTSB"}, "designation must be one of"),
    ({"eol": None, "status": None}, "eol is null, so status must say"),
    ({"status": ""}, "status must be text or null"),
    ({"source": ""}, "source must name where the data comes from"),
    ({"until": "2028-06"}, "until is not a lifecycle field"),
]


@pytest.mark.parametrize(("change", "why"), BAD_ENTRIES)
def test_a_malformed_lifecycle_entry_is_refused(change: dict[str, Any], why: str):
    found = branches()
    found["580"]["lifecycle"].update(change)
    problems = lifecycle.problems(found)
    assert len(problems) == 1 and why in problems[0], problems
    assert problems[0].startswith("driver.branches.580.lifecycle")
    with pytest.raises(ValueError, match=re.escape(why)):
        lifecycle.lifecycle("580", found)


def test_a_branch_without_lifecycle_or_a_field_missing_is_refused():
    found = branches()
    del found["580"]["lifecycle"]["source"]
    del found["570"]["lifecycle"]
    assert lifecycle.problems(found) == [
        "driver.branches.570.lifecycle is missing",
        "driver.branches.580.lifecycle.source is missing",
    ]


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        ("driver.branches.580.lifecycle.eol", "2028-6", "eol must be a month"),
        ("driver.branches.580.lifecycle.eol", None, "eol is null, so status must say"),
        ("driver.branches.570.lifecycle.status", None, "eol is null, so status must say"),
        ("driver.branches.580.lifecycle.designation", "lts", "designation must be one of"),
    ],
)
def test_validation_refuses_a_malformed_lifecycle_override(path: str, value: Any, why: str):
    config, problems = validate("box", {"catalog_overrides": {path: value}})
    assert config is None
    assert [(p.key, p.severity) for p in problems] == [("catalog_overrides", "error")]
    assert why in problems[0].message


def test_validation_takes_a_well_formed_lifecycle_override():
    path = "driver.branches.580.lifecycle.eol"
    config = load_host_config("box", {"catalog_overrides": {path: "2027-03"}})
    assert config.catalog["driver"]["branches"]["580"]["lifecycle"]["eol"] == "2027-03"


def test_validation_refuses_a_malformed_catalog_yml(monkeypatch: pytest.MonkeyPatch):
    bad = catalog.load()
    bad["driver"]["branches"]["580"]["lifecycle"]["eol"] = "2028/06"
    monkeypatch.setattr(catalog, "load", lambda overrides=None: copy.deepcopy(bad))
    config, problems = validate("box", {})
    assert config is None
    assert [p.key for p in problems] == ["catalog"]
    assert "catalog.yml: driver.branches.580.lifecycle.eol must be a month" in problems[0].message


# ------------------------------------------------------------------------------ the note


def test_570_on_v100_is_past_its_end_of_life_and_moves_to_580():
    note = lifecycle.note("570", DEC_2026, ["Volta"], branches())
    assert note is not None and note.past and note.move_to == "580"
    assert note.text.startswith(
        "driver branch R570 is past its end of life (unlisted since the 615 edition; source: "
        f"{SOURCE}): move to R580"
    )
    assert '"driver_branch": "580"' in note.text


def test_580_on_v100_within_six_months_has_no_newer_branch_the_hardwares_last():
    note = lifecycle.note("580", JAN_2028, ["Volta"], with_newer())
    assert note is not None and not note.past and note.move_to is None
    assert "reaches its end of life in 2028-06" in note.text
    assert "no newer branch for these GPUs: R580 is the last branch for Volta" in note.text
    assert "the hardware's last" in note.text


def test_no_note_more_than_six_months_before_the_end_of_life():
    assert lifecycle.note("580", DEC_2027, ["Volta"], branches()) is None
    assert lifecycle.note("580", DEC_2026, ["Turing"], branches()) is None
    after = lifecycle.note("580", datetime.date(2028, 7, 1), ["Volta"], branches())
    assert after is not None and after.past and "past its end of life (2028-06;" in after.text
    last_month = lifecycle.note("580", datetime.date(2028, 6, 30), ["Volta"], branches())
    assert last_month is not None and not last_month.past


def test_580_on_a_newer_gpu_names_a_newer_branch_only_when_the_catalog_knows_one():
    alone = lifecycle.note("580", JAN_2028, ["Turing"], branches())
    assert alone is not None and alone.move_to is None
    assert "the catalog has no newer branch than R580 to move to" in alone.text
    newer = lifecycle.note("580", JAN_2028, ["Turing"], with_newer())
    assert newer is not None and newer.move_to == "620"
    assert 'move to R620: set "driver_branch": "620" and deploy' in newer.text
    # a box with a Volta among its GPUs stays on R580 even so
    mixed = lifecycle.note("580", JAN_2028, ["Turing", "Volta"], with_newer())
    assert mixed is not None and mixed.move_to is None
    # and a newer branch past its own end of life is no target
    stale = lifecycle.note("580", JAN_2028, ["Ampere"], with_newer(eol="2027-12"))
    assert stale is not None and stale.move_to is None
    assert "(R620) are past theirs too" in stale.text


def test_the_move_target_from_570_is_the_newest_branch_the_gpus_allow():
    assert lifecycle.move_target("570", DEC_2026, ["Volta"], with_newer()) == "580"
    assert lifecycle.move_target("570", DEC_2026, ["Ampere"], with_newer()) == "620"
    assert lifecycle.move_target("570", DEC_2026, ["Ampere"], branches()) == "580"


def test_the_host_note_reads_the_pinned_branch_and_gpu_model():
    v100 = load_host_config("box", {})
    assert host_lifecycle.host_note(v100, DEC_2026) is not None
    r580 = load_host_config("box", {"driver_branch": "580"})
    assert host_lifecycle.host_note(r580, DEC_2026) is None
    a100 = load_host_config("box", {"driver_branch": "580", "gpu_model": "NVIDIA A100-SXM4-80GB"})
    note = host_lifecycle.host_note(a100, JAN_2028)
    assert note is not None and "the catalog has no newer branch" in note.text


def test_the_note_reads_no_clock():
    source = (ROOT / "src/gpubox/knowledge/driver_lifecycle.py").read_text(encoding="utf-8")
    source += (ROOT / "src/gpubox/rules/driver_lifecycle.py").read_text(encoding="utf-8")
    assert "today()" not in source and "now(" not in source


# ------------------------------------------------------------------------------ gpubox check


class _Date(datetime.date):
    @classmethod
    def today(cls) -> _Date:
        return cls(2028, 1, 10)


def test_check_prints_the_note_and_exits_0(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setattr(cli.datetime, "date", _Date)
    inventory = tmp_path / "fleet.py"
    inventory.write_text(
        "hosts = [\n"
        "  ('old', {'ssh_hostname': '192.0.2.1'}),\n"
        "  ('v100', {'ssh_hostname': '192.0.2.2', 'driver_branch': '580'}),\n"
        "  ('a100', {'ssh_hostname': '192.0.2.3', 'driver_branch': '580',\n"
        "            'gpu_model': 'NVIDIA A100-SXM4-80GB'}),\n"
        "]\n"
    )
    assert cli.main(["check", str(inventory)]) == 0
    out = capsys.readouterr().out
    assert "note: old: driver branch R570 is past its end of life" in out
    assert "move to R580" in out
    assert "note: v100: driver branch R580 reaches its end of life in 2028-06" in out
    assert "R580 is the last branch for Volta" in out
    assert "note: a100: driver branch R580 reaches its end of life in 2028-06" in out
    assert "the catalog has no newer branch than R580 to move to" in out
    assert out.splitlines()[-4:] == [
        "old   valid, 1 note",
        "v100  valid, 1 note",
        "a100  valid, 1 note",
        f"{inventory}: 3 host(s) valid",
    ]


def test_check_prints_no_note_for_a_branch_with_time_left(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setattr(cli.datetime, "date", _Date)
    monkeypatch.setattr(_Date, "today", classmethod(lambda cls: cls(2027, 12, 1)))
    inventory = tmp_path / "one.py"
    inventory.write_text(
        "hosts = [('v100', {'ssh_hostname': '192.0.2.2', 'driver_branch': 580})]\n"
    )
    assert cli.main(["check", str(inventory)]) == 0
    out = capsys.readouterr().out
    assert "note:" not in out and out.splitlines()[-2] == "v100  valid"


# ------------------------------------------------------------------------------ the docs


def test_deploy_md_which_branch_table_is_the_catalogs():
    """docs/deploy.md's "Which branch" table is driver_lifecycle.markdown_table of the catalog
    (regenerate: PYTHONPATH=src python -c 'from gpubox import catalog; from gpubox.knowledge
    import driver_lifecycle as d; print(d.markdown_table(catalog.load()["driver"]["branches"]),
    end="")')."""
    page = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    section = page.split("\n## Which branch\n", 1)[1].split("\n## ", 1)[0]
    table = lifecycle.markdown_table(branches())
    assert table in section
    assert "| R570 | not listed | past (unlisted since the 615 edition) | - |" in table
    assert "| R580 | long-term support | 2028-06 | Maxwell, Pascal, Volta |" in table
