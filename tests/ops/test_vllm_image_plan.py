"""The vLLM image's pull in the background (gpubox.stages.vllm_image): the stage after the
container toolkit's writes and starts gpubox-vllm-pull when Docker lacks the image; the vLLM
stage only waits for it (once per run); nothing when the image is there or the backend is not
vLLM; deploy/full.py runs the stage after the toolkit's (whose Docker restart would abort a
pull) and before the backend."""

from __future__ import annotations

import re

import pytest
from conftest import REFERENCE, fresh_box
from test_model_download_plan import uploads

from gpubox.commands import deploying
from gpubox.stages import backend as backend_stage
from gpubox.stages import vllm_image

VLLM = {**REFERENCE, "backend": "vllm"}
IMAGE = "vllm/vllm-openai:v0.19.1"
START = f"Start gpubox-vllm-pull (pull {IMAGE} in the background)"
CHECKPOINT_COMPLETE = {
    ".gpubox-complete": ["marker=yes", "commit=" + "a" * 40, "files=3", "present=45097156608"]
}


def short(names) -> list[str]:
    return [n.rsplit(" | ", 1)[-1] for n in names]


def test_the_early_stage_starts_the_pull_and_the_vllm_stage_only_waits(plan_of):
    def both() -> None:
        vllm_image.vllm_image_pull()
        backend_stage.backend()

    plan = plan_of(both, VLLM, fresh_box("ubuntu2404", **CHECKPOINT_COMPLETE))
    names = short(plan.names)
    assert names.count(START) == 1 and names.count("Unit gpubox-vllm-pull") == 1
    # not enabled: a reboot comes before Docker is there, a later deploy starts it again
    assert plan.op(re.escape(START)) == ["systemctl start gpubox-vllm-pull.service"]
    wait = next(n for n in names if n.startswith(f"Pull {IMAGE}"))
    assert names.index(START) < names.index(wait) < names.index("(Re)start vLLM")
    (step,) = plan.op(re.escape(wait))
    assert step.startswith("# gpubox long step") and vllm_image.wait_command(IMAGE) in step
    # the early stage alone: started, not waited for
    early = short(plan_of(vllm_image.vllm_image_pull, VLLM, fresh_box("ubuntu2404")).names)
    assert START in early and not [n for n in early if n.startswith("Pull ")]


def test_the_unit_pulls_with_retries_after_docker_at_low_priority(plan_of):
    unit = uploads(vllm_image.vllm_image_pull, VLLM, fresh_box("ubuntu2404"))[vllm_image.UNIT_FILE]
    lines = unit.splitlines()
    for line in (
        "Requires=docker.service",
        "After=docker.service network-online.target",
        "Type=exec",
        'ExecStart=/bin/sh -c "for i in 1 2 3; do docker pull vllm/vllm-openai:v0.19.1 && '
        "exit 0; echo gpubox: the pull of vllm/vllm-openai:v0.19.1 failed, again in 10 s; "
        'sleep 10; done; exit 1"',
        "Nice=19",
        "IOSchedulingClass=best-effort",
        "IOSchedulingPriority=7",
        "Restart=no",
    ):
        assert line in lines, (line, unit)
    assert "[Install]" not in unit  # never enabled


@pytest.mark.parametrize(
    ("data", "answers"),
    [
        (VLLM, {"docker image inspect": "sha256:0123456789abcdef"}),  # the image is there
        (REFERENCE, {}),  # llama.cpp
    ],
)
def test_nothing_is_pulled_when_the_image_is_there_or_vllm_is_not_the_backend(
    plan_of, data, answers
):
    plan = plan_of(vllm_image.vllm_image_pull, data, fresh_box("ubuntu2404", **answers))
    assert not [c for c in plan.commands if "gpubox-vllm-pull" in c]
    assert short(plan.names) == ["apt-get waits up to 900 s for dpkg's lock"]


def test_full_runs_it_after_the_toolkit_and_before_the_backend():
    stages = deploying.FULL_STAGES
    assert (
        stages.index("docker")
        < stages.index("container_toolkit")
        < stages.index("vllm_image_pull")
        < stages.index("backend")
    )


def test_an_image_reference_systemd_or_the_shell_would_read_otherwise_is_refused():
    with pytest.raises(ValueError, match="vllm.image"):
        vllm_image.unit_text('vllm/x:1"; rm -rf /')
