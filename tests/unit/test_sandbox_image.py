"""`gpubox sandbox image` serves every box that is up (box 1 first), or box K alone with
--box K; a box that fails is named and does not keep the others from their image. The boxes
are box.json records here; tests/integration/test_sandbox_box.py loads the image for real."""

from __future__ import annotations

import pytest

from gpubox.sandbox import cli, identity, images


@pytest.fixture(autouse=True)
def back_to_box_one():
    yield
    identity.use_box(1)


def boxes(*ks: int) -> list[dict[str, object]]:
    return [{"name": identity.box_name(k), "box": k, "check_image": images.CHECK_IMAGE} for k in ks]


@pytest.fixture
def loaded(monkeypatch):
    """The boxes load_check_image was asked to serve (by name); box 'gpubox-sandbox-3' has no
    Docker when the test says so."""
    served: list[str] = []
    broken: set[str] = set()

    def load(info=None):
        info = info or images.box_info()
        if info["name"] in broken:
            raise images.SandboxError(f"could not build the check image {info['check_image']}")
        served.append(str(info["name"]))
        return str(info["check_image"])

    monkeypatch.setattr(images, "load_check_image", load)
    return served, broken


def test_every_box_that_is_up_gets_the_image(monkeypatch, capsys, loaded):
    served, _ = loaded
    monkeypatch.setattr(images, "box_infos", lambda: boxes(1, 2, 3))
    assert cli.main(["image"]) == 0
    assert served == ["gpubox-sandbox", "gpubox-sandbox-2", "gpubox-sandbox-3"]
    captured = capsys.readouterr()
    assert captured.out == f"{images.CHECK_IMAGE}\n"  # its name, once, as with one box
    assert f"gpubox-sandbox-3: check image {images.CHECK_IMAGE} loaded" in captured.err


def test_a_box_that_fails_is_named_and_the_others_are_served(monkeypatch, capsys, loaded):
    served, broken = loaded
    broken.add("gpubox-sandbox-2")
    monkeypatch.setattr(images, "box_infos", lambda: boxes(1, 2, 3))
    assert cli.main(["image"]) == 1
    assert served == ["gpubox-sandbox", "gpubox-sandbox-3"]
    err = capsys.readouterr().err
    assert "gpubox sandbox: error: gpubox-sandbox-2: could not build the check image" in err


def test_box_k_alone(monkeypatch, capsys, loaded):
    served, _ = loaded
    monkeypatch.setattr(images, "box_infos", lambda: pytest.fail("every box was asked"))
    monkeypatch.setattr(images, "box_info", lambda sdir=None: boxes(identity.current().number)[0])
    assert cli.main(["image", "--box", "2"]) == 0
    assert served == ["gpubox-sandbox-2"]


def test_no_box_up_is_one_line(monkeypatch, capsys, loaded):
    monkeypatch.setattr(images, "box_infos", lambda: [])
    assert cli.main(["image"]) == 1
    assert capsys.readouterr().err == (
        "gpubox sandbox: error: sandbox is not up: run gpubox sandbox up\n"
    )
