"""An inventory of one's own that moves the sandbox's boxes (issue 30 F): it reads
inventories/sandbox.py's hosts and sets driver_branch on top, as docs/sandbox.md shows. Loaded
by pyinfra itself (gpubox.remote.inventory.load), with the running boxes' box.json faked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gpubox.sandbox
from gpubox.remote import inventory

SANDBOX_INVENTORY = Path(__file__).resolve().parents[2] / "inventories" / "sandbox.py"

# The user's file, as docs/sandbox.md ("An inventory of your own") writes it.
OWN_INVENTORY = """\
import runpy

_sandbox = runpy.run_path(SANDBOX_INVENTORY)
hosts = [
    (name, {**data, "driver_branch": "580", "driver_version": "580.900.01"})
    for name, data in _sandbox["hosts"]
]
"""


def fake_info(k: int) -> dict[str, Any]:
    """box.json of sandbox box k: its own SSH port, the same loopback servers."""
    info: dict[str, Any] = {"name": f"gpubox-sandbox{'' if k == 1 else k}", "box": k}
    for key in (
        "ssh_hostname",
        "ssh_user",
        "ssh_key",
        "ssh_known_hosts_file",
        "check_image",
        "ccache_dir",
        "hub_url",
        "hub_repo",
        "model_file",
        "model_sha256",
        "hub_commit",
        "modelscope_ca_bundle",
        "pypi_index_url",
        "modelscope_url",
        "repo_url",
        "key_url",
        "key_fingerprint",
        "toolkit_repo_url",
        "toolkit_key_url",
        "toolkit_key_fingerprint",
        "gpu_burn_url",
        "gpu_burn_sha256",
        "gpu_burn_commit",
        "llamacpp_url",
        "panel_url",
        "panel_sha256",
    ):
        info[key] = f"{key} of the sandbox"
    info["ssh_port"] = 2221 + k
    return info


@pytest.fixture
def boxes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    infos = [fake_info(1), fake_info(2)]
    monkeypatch.setattr(gpubox.sandbox, "box_info", lambda: infos[0])
    monkeypatch.setattr(gpubox.sandbox, "box_infos", lambda: infos)
    return infos


def test_an_own_inventory_moves_the_sandbox_boxes_to_580(tmp_path: Path, boxes):
    own = tmp_path / "sandbox580.py"
    own.write_text(OWN_INVENTORY.replace("SANDBOX_INVENTORY", repr(str(SANDBOX_INVENTORY))))
    loaded = dict(inventory.load(str(own)))
    plain = dict(inventory.load(str(SANDBOX_INVENTORY)))
    assert list(loaded) == list(plain) == ["gpubox-sandbox", "gpubox-sandbox2"]
    for name, data in loaded.items():
        assert data["driver_branch"] == "580" and data["driver_version"] == "580.900.01"
        assert plain[name]["driver_branch"] == "570" and "driver_version" not in plain[name]
        rest = {k: v for k, v in data.items() if k not in ("driver_branch", "driver_version")}
        assert rest == {k: v for k, v in plain[name].items() if k != "driver_branch"}
    assert loaded["gpubox-sandbox"]["ssh_port"] == 2222  # each box's own data, kept
    assert loaded["gpubox-sandbox2"]["gpu_model"] == "Tesla T4"
    overrides = loaded["gpubox-sandbox"]["catalog_overrides"]
    assert overrides["repos.nvidia_cuda.url"] == "repo_url of the sandbox"
