"""gpubox.preflight.answers' pure parts: the kept file's reading and writing, and a question's
key."""

from __future__ import annotations

import json

from gpubox.base import layout
from gpubox.preflight import answers
from gpubox.rules.offers import RepoIndex

Q = answers.Question(
    "nvidia_container_toolkit",
    "deb [signed-by=/k.gpg] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n",
    ("libnvidia-container1", "nvidia-container-toolkit"),
    "",
)


def test_a_question_is_another_when_its_url_packages_or_version_change():
    same = answers.Question(Q.repo, Q.source_line.replace("/k.gpg", "/other.gpg"), Q.packages, "")
    assert same.key == Q.key  # the keyring is not part of what the repository offers
    for other in (
        answers.Question(
            Q.repo, Q.source_line.replace("nvidia.github.io", "mirror"), Q.packages, ""
        ),
        answers.Question(Q.repo, Q.source_line, Q.packages[:1], ""),
        answers.Question(Q.repo, Q.source_line, Q.packages, "1.0-1"),
        answers.Question("docker", Q.source_line, Q.packages, ""),
    ):
        assert other.key != Q.key, other


def test_what_is_kept_reads_back_as_it_was_written():
    index = RepoIndex(offers={"libnvidia-container1": ["1.17.8-1", "1.17.7-1"]})
    text = answers.to_keep(answers.Kept(), [Q], {Q.repo: index})
    assert text is not None
    kept = answers.parse_kept([f"D {layout.DRIVER_PIN} abc", "K", text])
    assert kept.problem is None
    assert kept.answers[Q.repo] == {"key": Q.key, "offers": index.offers}
    assert kept.digests == {layout.DRIVER_PIN: "abc", layout.UNATTENDED_BLACKLIST: None}
    # the same answer again: nothing to write
    assert answers.to_keep(kept, [Q], {Q.repo: index}) is None


def test_an_answer_with_an_error_or_a_warning_is_not_kept():
    for index in (
        RepoIndex(error="cannot read"),
        RepoIndex(offers={"x": ["1"]}, warnings=["apt update failed, using the answer cached"]),
    ):
        text = answers.to_keep(answers.Kept(), [Q], {Q.repo: index})
        assert text is not None and json.loads(text)["repos"] == {}


def test_an_unreadable_kept_file_is_a_problem_not_an_answer():
    for body in ("{", "[]", json.dumps({"format": 2, "repos": {}}), '{"format": 1}'):
        kept = answers.parse_kept(["K", body])
        assert kept.problem and kept.answers == {}, body
    assert answers.parse_kept([]).problem is None  # no file: nothing kept, no problem
