"""The vLLM checkpoint's plan (gpubox.stages.checkpoint, run by the model stage): the whole
repository downloaded on the box before vLLM starts, as a long step whose progress total is the
sum of the file sizes the Hub lists; skipped when the marker matches the files on the box;
downloaded again (only the missing file) when one is missing or resized; the disk checked
first; vLLM then serves the local directory with the Hub off."""

from __future__ import annotations

import json

import pytest
from conftest import REFERENCE, fresh_box

from gpubox import progress
from gpubox.config import load_host_config
from gpubox.stages import DeployRefused, checkpoint
from gpubox.stages import backend as backend_stage
from gpubox.stages import model as model_stage
from gpubox.stages import vllm as vllm_stage

VLLM = {**REFERENCE, "backend": "vllm"}
REPO = "INC4AI/Qwen3-Next-80B-A3B-Thinking-int4-AutoRound"
DIRECTORY = "/srv/models/INC4AI--Qwen3-Next-80B-A3B-Thinking-int4-AutoRound"
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


def test_the_first_deploy_downloads_the_repository_as_a_long_step_before_vllm_starts(plan_of):
    answers = fresh_box("ubuntu2404", **{STATE: state(marker=False), LISTING: HUB_INFO})
    plan = plan_of(backend_stage.backend, VLLM, answers)
    step = download_step(plan)
    # progress.long_step: a line every 10 s from the download probe, whose total is the sum of
    # the sizes the Hub listed, counted over the whole directory (hf's partial files included)
    assert step.startswith("# gpubox long step") and "_gb_every=10" in step
    assert progress.download_probe(DIRECTORY, TOTAL) in step
    assert (
        f"HF_ENDPOINT=https://huggingface.co HF_TOKEN=$( [ -s {model_stage.TOKEN_FILE} ] " in step
    )
    assert f"hf download {REPO} --revision {COMMIT} --local-dir {DIRECTORY}" in step
    assert f"trap 'rm -f {model_stage.TOKEN_FILE}' EXIT" in step
    # the tool from the catalog's index, as for the GGUF file
    (_, pip) = plan.op("Download tool in /opt/gpubox/hf-venv")
    assert "--index-url https://pypi.org/simple " in pip
    # before the unit starts; and a finished download restarts vLLM
    names = [n.rsplit(" | ", 1)[-1] for n in plan.names]
    download = names.index(f"Download the vLLM checkpoint {REPO}")
    assert download < names.index("(Re)start vLLM")
    assert download < names.index("Wait for vLLM's /health")


def test_vllm_serves_the_local_directory_with_the_hub_off():
    config = load_host_config("b", VLLM)
    argv = vllm_stage.docker_argv(config)
    image = config.catalog["vllm"]["image"]
    args = argv[argv.index(image) + 1 :]
    assert args[0] == "/models/INC4AI--Qwen3-Next-80B-A3B-Thinking-int4-AutoRound"
    assert args[args.index("--served-model-name") + 1] == "qwen3-next"
    assert "HF_HUB_OFFLINE=1" in argv[: argv.index(image)]
    assert "/srv/models:/models" in argv  # the container's /models is model_dir
    # the directory the model stage downloads into is the one the container sees
    c = checkpoint.plan(config)
    assert c.directory == DIRECTORY and c.container_path == args[0]


def test_a_complete_checkpoint_is_not_downloaded_again(plan_of):
    answers = fresh_box("ubuntu2404", **{STATE: state(present=TOTAL), LISTING: HUB_INFO})
    plan = plan_of(model_stage.model, VLLM, answers)
    assert not [c for c in plan.commands if "hf download" in c]
    assert not [n for n in plan.names if "Download" in n]
    # a token file left by a download cut short goes
    assert [n for n in plan.names if n.endswith("No HF_TOKEN file left on the box")]


def test_a_missing_or_resized_file_is_removed_and_downloaded_again(plan_of):
    shard = "model-00002-of-00002.safetensors"
    answers = fresh_box(
        "ubuntu2404", **{STATE: state(shard, present=TOTAL - SHARDS[shard]), LISTING: HUB_INFO}
    )
    plan = plan_of(model_stage.model, VLLM, answers)
    step = download_step(plan)
    removal = f"rm -f -- {DIRECTORY}/{shard}; "
    assert removal in step
    # removed before hf download runs: it then fetches that file only (the others match)
    assert step.index(removal) < step.index("hf download")
    assert f"rm -f {DIRECTORY}.gpubox-complete" in step  # no marker while it is incomplete
    assert progress.download_probe(DIRECTORY, TOTAL) in step


def test_without_the_hubs_listing_it_downloads_main_with_no_total(plan_of):
    answers = fresh_box("ubuntu2404", **{STATE: state(marker=False)})
    plan = plan_of(model_stage.model, VLLM, answers)
    step = download_step(plan)
    assert f"hf download {REPO} --local-dir {DIRECTORY}" in step
    assert progress.download_probe(DIRECTORY, None) in step


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
    with pytest.raises(DeployRefused, match=rf"has 40\.0 GiB free; {REPO} needs 42\.0 GiB"):
        plan_of(model_stage.model, VLLM, answers)
