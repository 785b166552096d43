"""The vLLM checkpoint's plan (gpubox.plans.checkpoint, run by the model stage): the whole
repository downloaded on the box before vLLM starts, as a long step whose progress total is the
sum of the file sizes the Hub lists; skipped when the marker matches the files on the box;
downloaded again (only the missing file) when one is missing or resized; the disk checked
first; vLLM then serves the local directory with the Hub off."""

from __future__ import annotations

import json
import shlex

import pytest
from conftest import REFERENCE, fresh_box
from test_model_download_plan import uploads

from gpubox.base.errors import DeployRefused
from gpubox.config import load_host_config
from gpubox.infra import progress
from gpubox.plans import checkpoint, model_script
from gpubox.plans import vllm as plan_vllm
from gpubox.stages import backend as backend_stage
from gpubox.stages import model as model_stage

VLLM = {**REFERENCE, "backend": "vllm"}
REPO = "jart25/Qwen3-Next-80B-A3B-Thinking-Int4-GPTQ"
DIRECTORY = "/srv/models/jart25--Qwen3-Next-80B-A3B-Thinking-Int4-GPTQ"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHARDS = {
    "config.json": 2_345,
    "model-00001-of-00002.safetensors": 21 * 2**30,
    "model-00002-of-00002.safetensors": 20 * 2**30,
    "tokenizer.json": 11_422_654,
}
TOTAL = sum(SHARDS.values())
HUB_INFO = json.dumps(
    {
        "id": REPO,
        "sha": COMMIT,
        "siblings": [{"rfilename": n, "size": s} for n, s in SHARDS.items()],
    }
)
# The facts' commands, as the fake connector matches them (substrings)
STATE = ".gpubox-complete"
LISTING = f"https://huggingface.co/api/models/{REPO}/revision/main?blobs=true"
FREE = "df -B1 --output=avail"


def state(*bad: str, present: int = 0, marker: bool = True) -> list[str]:
    lines = ["marker=yes", f"commit={COMMIT}"] if marker else []
    lines += [f"bad={name}" for name in bad]
    lines += [f"files={len(SHARDS)}"] if marker else []
    return lines + [f"present={present}"]


def download_step(plan) -> str:
    (step,) = plan.op(f"Download the vLLM checkpoint {REPO}")
    return step


def script_and_unit(data: dict, answers: dict) -> tuple[str, str]:
    written = uploads(model_stage.model_download, data, answers)
    return written[model_stage.SCRIPT], written[model_stage.UNIT_FILE]


def test_the_first_deploy_downloads_in_the_unit_and_waits_before_vllm_starts(plan_of):
    answers = fresh_box("ubuntu2404", **{STATE: state(marker=False), LISTING: HUB_INFO})
    plan = plan_of(backend_stage.backend, VLLM, answers)
    step = download_step(plan)
    # progress.long_step: a line every 10 s from the download probe, whose total is the sum of
    # the sizes the Hub listed, counted over the whole directory (hf's partial files included),
    # while it waits for the unit
    assert step.startswith("# gpubox long step") and "_gb_every=10" in step
    assert progress.download_probe(DIRECTORY, TOTAL) in step
    c = checkpoint.plan(load_host_config("b", VLLM))
    assert checkpoint.wait_command(c) in step
    assert "hf download" not in step  # the unit downloads
    # the tool from the catalog's index, as for the GGUF file
    (_, pip) = plan.op("Download tool in /opt/gpubox/hf-venv")
    assert "--index-url https://pypi.org/simple " in pip
    # the unit started before the wait, the wait before vLLM starts
    names = [n.rsplit(" | ", 1)[-1] for n in plan.names]
    download = names.index(f"Download the vLLM checkpoint {REPO}")
    start = next(i for i, n in enumerate(names) if n.startswith("Start gpubox-model-download"))
    assert start < download < names.index("(Re)start vLLM")
    assert download < names.index("Wait for vLLM's /health")
    assert plan.op("Start gpubox-model-download") == [
        "systemctl start gpubox-model-download.service",
        "systemctl enable gpubox-model-download.service",
    ]
    script, _ = script_and_unit(VLLM, answers)
    assert script == checkpoint.download_script(
        c, checkpoint.parse_listing(HUB_INFO), "https://huggingface.co", 120, False
    )
    assert f"hf download {REPO} --revision {COMMIT} --local-dir {DIRECTORY}" in script
    assert "HF_ENDPOINT=https://huggingface.co HF_TOKEN=$( [ -s /nonexistent ]" in script
    assert "no new bytes for 120 s (download_stall_s)" in script
    assert script.endswith(
        "systemctl disable -q gpubox-model-download.service 2>/dev/null || true\n"
    )


def test_the_early_stage_starts_the_checkpoint_and_the_backend_only_waits(plan_of):
    answers = fresh_box("ubuntu2404", **{STATE: state(marker=False), LISTING: HUB_INFO})

    def both() -> None:
        model_stage.model_download()
        model_stage.model()

    plan = plan_of(both, VLLM, answers)
    names = [n.rsplit(" | ", 1)[-1] for n in plan.names]
    assert len([n for n in names if n.startswith("Start gpubox-model-download")]) == 1
    assert names.count("Model download script") == 1
    assert names[-1] == f"Download the vLLM checkpoint {REPO}"
    # the early stage alone: the unit started, no wait
    early = plan_of(model_stage.model_download, VLLM, answers)
    assert [n for n in early.names if "Start gpubox-model-download" in n]
    assert not [n for n in early.names if "Download the vLLM checkpoint" in n]


def test_the_unit_caps_xet_and_turns_it_off_after_two_stalls(plan_of):
    """The sandbox cannot serve Xet: the cap (the unit's MemoryMax, which holds hf_xet with
    hf) and the fallback (HF_HUB_DISABLE_XET=1 from the second stall) are proven here and by
    the script's unit tests."""
    data = {**VLLM, "download_memory_max": "3G", "download_stall_s": 45}
    answers = fresh_box("ubuntu2404", **{STATE: state(marker=False), LISTING: HUB_INFO})
    script, unit = script_and_unit(data, answers)
    for line in (
        f"Description=gpubox: download {REPO}",
        f"ExecStart=/bin/sh {model_stage.SCRIPT}",
        "Nice=19",
        "CPUSchedulingPolicy=batch",
        "IOSchedulingClass=best-effort",
        "IOSchedulingPriority=7",
        "MemoryMax=3G",
        "OOMPolicy=continue",  # an OOM kill ends the transfer, the script retries it
        "Restart=no",
        "WantedBy=multi-user.target",
        f"RequiresMountsFor={DIRECTORY}",
    ):
        assert line in unit.splitlines(), (line, unit)
    assert "no new bytes for 45 s (download_stall_s)" in script
    assert model_script.XET_OFF_AFTER == 2
    assert 'elif [ "${GPUBOX_STALLS:-0}" -ge 2 ]; then export HF_HUB_DISABLE_XET=1; ' in script
    assert 'GPUBOX_STALLS=$_gw_all_stalls GPUBOX_OOMS=$_gw_ooms setsid sh -c "$1"' in script
    # hf's partial files of an earlier run go first: hf 1.x never resumes them
    transfer = shlex.split(script.split("_gw_run ")[-1])[0]  # the quoted transfer, read back
    assert (
        f"find {DIRECTORY}/.cache/huggingface/download -name '*.incomplete' -type f -exec rm -f"
        in transfer
    )
    assert transfer.index("find") < transfer.index("hf download")
    # Xet's parallelism bounded from the start; Xet off after an OOM kill (exit 137)
    assert f"{checkpoint.XET_BOUNDS} " in transfer and "--max-workers 2" in transfer
    assert 'if [ "${GPUBOX_OOMS:-0}" -gt 0 ]; then export HF_HUB_DISABLE_XET=1; ' in transfer


def test_the_token_reaches_the_checkpoint_unit_as_a_credential(plan_of, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    answers = fresh_box("ubuntu2404", **{STATE: state(marker=False), LISTING: HUB_INFO})
    plan = plan_of(model_stage.model, VLLM, answers)
    script, unit = script_and_unit(VLLM, answers)
    assert "LoadCredential=hf-token:/root/.cache/gpubox/hf-token" in unit.splitlines()
    assert "hf_secret_value" not in unit + script + "".join(plan.commands)
    assert 'HF_TOKEN=$( [ -s "${CREDENTIALS_DIRECTORY:-/nonexistent}/hf-token" ]' in script
    # removed when the script ends by itself, kept when the unit is stopped (for the resume)
    assert "trap 'rm -f /root/.cache/gpubox/hf-token' EXIT; trap 'trap - EXIT; exit 143'" in script


def test_the_catalog_leaves_the_checkpoint_unpinned_and_vllm_revision_pins_it(plan_of, caplog):
    config = load_host_config("b", VLLM)
    assert config.catalog["models"][config.model]["vllm_revision"] is None
    answers = fresh_box("ubuntu2404", **{STATE: state(marker=False), LISTING: HUB_INFO})
    plan_of(model_stage.model, VLLM, answers)
    assert f"{REPO} is not pinned to a revision" in caplog.text
    caplog.clear()
    pinned_commit = "89abcdef" * 5
    for data in (
        {"vllm_revision": pinned_commit},
        {"catalog_overrides": {"models.qwen3-next-80b-a3b-thinking.vllm_revision": pinned_commit}},
    ):
        data = {**VLLM, **data}
        listing = LISTING.replace("/revision/main?", f"/revision/{pinned_commit}?")
        info = HUB_INFO.replace(COMMIT, pinned_commit)
        answers = fresh_box("ubuntu2404", **{STATE: state(marker=False), listing: info})
        script, _ = script_and_unit(data, answers)
        assert f"hf download {REPO} --revision {pinned_commit} --local-dir" in script
        # no listing: the pinned revision still
        script, _ = script_and_unit(data, fresh_box("ubuntu2404", **{STATE: state(marker=False)}))
        assert f"hf download {REPO} --revision {pinned_commit} --local-dir" in script
        assert "is not pinned" not in caplog.text
        # a complete checkpoint at another commit is downloaded again
        complete = fresh_box("ubuntu2404", **{STATE: state(present=TOTAL), listing: info})
        plan = plan_of(model_stage.model, data, complete)
        assert download_step(plan)


def test_a_bad_vllm_revision_names_its_key():
    from gpubox.config import validate

    _, found = validate("b", {**VLLM, "vllm_revision": "main; rm -rf /"})
    assert [p.key for p in found if p.severity == "error"] == ["vllm_revision"]
    _, found = validate("b", {**VLLM, "vllm_revision": "v1.0"})
    assert not [p for p in found if p.severity == "error"]


def test_vllm_serves_the_local_directory_with_the_hub_off():
    config = load_host_config("b", VLLM)
    argv = plan_vllm.docker_argv(config)
    image = config.catalog["vllm"]["image"]
    args = argv[argv.index(image) + 1 :]
    assert args[0] == "/models/jart25--Qwen3-Next-80B-A3B-Thinking-Int4-GPTQ"
    assert args[args.index("--served-model-name") + 1] == "qwen3-next"
    assert "HF_HUB_OFFLINE=1" in argv[: argv.index(image)]
    assert "/srv/models:/models" in argv  # the container's /models is model_dir
    # the directory the model stage downloads into is the one the container sees
    c = checkpoint.plan(config)
    assert c.directory == DIRECTORY and c.container_path == args[0]


def test_a_complete_checkpoint_is_not_downloaded_again(plan_of):
    answers = fresh_box("ubuntu2404", **{STATE: state(present=TOTAL), LISTING: HUB_INFO})
    for stage in (model_stage.model_download, model_stage.model):
        plan = plan_of(stage, VLLM, answers)
        assert not [c for c in plan.commands if "gpubox-model-download" in c]
        assert not [n for n in plan.names if "Download" in n]
        # a token file left by a download cut short goes
        assert [n for n in plan.names if n.endswith("No HF_TOKEN file left on the box")]


def test_a_missing_or_resized_file_starts_the_unit_again(plan_of):
    shard = "model-00002-of-00002.safetensors"
    answers = fresh_box(
        "ubuntu2404", **{STATE: state(shard, present=TOTAL - SHARDS[shard]), LISTING: HUB_INFO}
    )
    plan = plan_of(model_stage.model, VLLM, answers)
    assert progress.download_probe(DIRECTORY, TOTAL) in download_step(plan)
    script, _ = script_and_unit(VLLM, answers)
    # the script removes, when it runs, the files at another size than the old marker's and
    # the listing's (not the files the plan saw missing: by then they may be complete)
    assert f"rm -f -- {DIRECTORY}/{shard}" not in script
    assert f'[ -z "$got" ] || rm -f -- {DIRECTORY}/"$name"' in script
    assert f"rm -f {DIRECTORY}.gpubox-complete" in script  # no marker while it is incomplete


def test_without_the_hubs_listing_it_downloads_main_with_no_total(plan_of):
    answers = fresh_box("ubuntu2404", **{STATE: state(marker=False)})
    plan = plan_of(model_stage.model, VLLM, answers)
    assert progress.download_probe(DIRECTORY, None) in download_step(plan)
    script, _ = script_and_unit(VLLM, answers)
    assert f"hf download {REPO} --local-dir {DIRECTORY}" in script


def test_the_disk_check_counts_the_listed_size_less_what_is_there(plan_of):
    answers = fresh_box(
        "ubuntu2404",
        **{STATE: state(marker=False, present=10 * 2**30), LISTING: HUB_INFO, FREE: str(2**30)},
    )
    need = (TOTAL - 10 * 2**30) / 2**30
    with pytest.raises(DeployRefused, match=rf"has 1\.0 GiB free; {REPO} needs {need:.1f} GiB"):
        plan_of(model_stage.model, VLLM, answers)
    # enough room for what is left: planned
    answers[FREE] = str(TOTAL - 10 * 2**30 + 1)
    assert download_step(plan_of(model_stage.model, VLLM, answers))


def test_without_the_listing_the_disk_check_uses_the_catalogs_weights(plan_of):
    answers = fresh_box("ubuntu2404", **{STATE: state(marker=False), FREE: str(40 * 2**30)})
    with pytest.raises(DeployRefused, match=rf"has 40\.0 GiB free; {REPO} needs 45\.0 GiB"):
        plan_of(model_stage.model, VLLM, answers)
