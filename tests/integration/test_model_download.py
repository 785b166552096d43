"""The default model path for real (issue 9 G, and the download part of E), on the sandbox
box: the real `hf` client, installed on the box with pip from the sandbox's PyPI mirror,
downloads the model through `hf_endpoint` from the sandbox's Hugging Face Hub mirror
(gpubox.sandbox.hub), as a user behind mirrors would. A download slowed down shows progress
lines; one whose connection breaks is resumed with a Range request; altered bytes are refused
with both sha256s and leave nothing behind. The tests run in order on one box: one first full
deploy, then deploys of the model stage alone (deploy/model.py) and two full ones. Last, the
same model through ``model_source: "modelscope"``: the real `modelscope` client from the
sandbox's ModelScope mirror (gpubox.sandbox.modelscope_mirror), over HTTPS."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from pathlib import Path

import pytest
from conftest import box_sh

from gpubox.base import layout
from gpubox.commands import demo
from gpubox.config import HostConfig, load_host_config
from gpubox.plans import model as plan_model
from gpubox.remote import inventory
from gpubox.sandbox import hub, modelscope_mirror
from gpubox.stages import model as model_stage

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sandbox_box")]


def config(*extra: tuple[str, str]) -> HostConfig:
    ((name, data),) = inventory.load(str(demo.ROOT / demo.INVENTORY))
    return load_host_config(name, {**data, **dict(extra)})


def requests(info: dict) -> list[dict]:
    return hub.read_log(Path(info["hub_request_log"]))


def set_control(info: dict, **controls: object) -> None:
    Path(info["hub_control"]).write_text(json.dumps(controls))


# The host checks that show the model verified and served (checksum, health, a chat answer).
SERVED = ("model.", "backend.health", "backend.service", "backend.models", "backend.chat")


def served_checks() -> demo.CheckRun:
    run = demo.checks(extra=("-k", " or ".join(SERVED)))
    assert run.passed + run.failed >= len(SERVED), run.output[-2000:]
    return run


def large_file(info: dict) -> tuple[tuple[str, str], ...]:
    """Host data for the large test file beside the model (hub.LARGE_FILE): hf writes and
    resumes in 10 MiB steps, so progress and a resumed Range show only on a larger file."""
    name = info["hub_large_file"]
    return (("model_file", name), ("model_sha256", info["hub_files"][name]["sha256"]))


def deploy_model(data: tuple[tuple[str, str], ...]) -> demo.DeployRun:
    """The model stage alone, with host data overrides (pyinfra --data)."""
    extra = [arg for key, value in data for arg in ("--data", f"{key}={value}")]
    return demo.deploy("deploy/model.py", extra=tuple(extra))


def test_the_default_deploy_fetches_the_model_with_hf_through_the_mirror():
    info = demo.box_info()
    cfg = config()
    assert cfg.model_source == "hf" and cfg.hf_endpoint == info["hub_url"]
    assert cfg.catalog["pypi"]["index_url"] == info["pypi_index_url"]
    p = plan_model.plan(cfg)
    assert p.repo == info["hub_repo"]

    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    assert f"Download and verify {p.file} (hf): done in" in run.output

    log = requests(info)
    # the sandbox inventory pins the mirror's commit (model_revision): hf asks for it by name
    assert p.revision == info["hub_commit"]
    resolve = f"/{p.repo}/resolve/{info['hub_commit']}/{p.file}"
    heads = [e for e in log if e["method"] == "HEAD" and e["path"] == resolve]
    gets = [e for e in log if e["method"] == "GET" and e["path"] == resolve]
    assert heads and all(e["status"] == 200 for e in heads), log
    assert [(e["status"], e["bytes"]) for e in gets] == [(200, info["model_size"])], log
    # the download ran in its own unit, now disabled (nothing starts it at the next boot)
    unit = f"{model_stage.UNIT}.service"
    assert box_sh(f"systemctl is-enabled {unit} || true").strip() == "disabled"

    assert box_sh(f"sha256sum {p.path}").split()[0] == info["model_sha256"]
    assert box_sh(f"test -e {p.staging} || echo gone") == "gone\n"
    checks = served_checks()
    assert checks.failures == {}, checks.output[-3000:]

    # a re-run with the good file in place starts nothing: no unit start, no download
    again = deploy_model(())
    assert again.rc == 0 and not again.failed_hosts, again.output[-3000:]
    assert not [n for n in again.changed_names if "download" in n.lower()], again.changed_names
    assert "Start gpubox-model-download" not in again.output


def test_a_slowed_down_download_shows_progress_lines():
    info = demo.box_info()
    data = large_file(info)
    p = plan_model.plan(config(*data))
    size = info["hub_files"][p.file]["size"]
    # 32 MiB at 1 MB/s: about 34 s, three or more progress lines at 10 s intervals
    set_control(info, rate=1_000_000)
    try:
        run = deploy_model(data)
    finally:
        set_control(info)
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    assert run.seconds >= 25
    label = re.escape(f"Download and verify {p.file} (hf)")
    # the total comes from the size the hub announces (X-Linked-Size): percent and ETA
    lines = re.findall(
        label + r" \[[^\]]+\]: downloaded ([\d.]+) (B|KiB|MiB) of 32\.0 MiB \(\d+%\), ([^\n]*)",
        run.output,
    )
    assert len(lines) >= 2, run.output[-3000:]
    unit = {"B": 1, "KiB": 2**10, "MiB": 2**20}
    got = [float(n) * unit[u] for n, u, _ in lines]
    assert max(got[1:]) > got[0], lines  # bytes on disk grow from line to line
    assert any("ETA" in rest for _, _, rest in lines), lines
    assert box_sh(f"stat -c %s {p.path}").strip() == str(size)


def test_an_interrupted_download_is_resumed_with_a_range_request():
    info = demo.box_info()
    data = large_file(info)
    p = plan_model.plan(config(*data))
    size = info["hub_files"][p.file]["size"]
    box_sh(f"rm -f {p.path} {p.marker}")
    before = len(requests(info))
    set_control(info, drop_after=15_000_000)  # once, past hf's first 10 MiB write
    try:
        run = deploy_model(data)
    finally:
        set_control(info)
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    resolve = f"/{p.repo}/resolve/{info['hub_commit']}/{p.file}"
    gets = [e for e in requests(info)[before:] if e["method"] == "GET" and e["path"] == resolve]
    assert gets[0]["dropped"] is True and gets[0]["bytes"] == 15_000_000, gets
    resumed = [e for e in gets[1:] if e["status"] == 206 and e["range"]]
    assert resumed, gets
    start = int(re.fullmatch(r"bytes=(\d+)-", resumed[0]["range"])[1])  # type: ignore[index]
    assert 0 < start <= 15_000_000 and resumed[0]["bytes"] == size - start
    assert sum(e["bytes"] for e in gets) < 2 * size
    assert box_sh(f"sha256sum {p.path}").split()[0] == p.sha256
    box_sh(f"rm -f {p.path} {p.marker}")  # 32 MiB the box does not need


def test_a_wrong_checksum_is_refused_and_leaves_nothing_then_good_bytes_converge():
    info = demo.box_info()
    p = plan_model.plan(config())
    good = info["model_sha256"]
    data = bytearray(Path(info["hub_files"][p.file]["path"]).read_bytes())
    data[len(data) // 2] ^= 0xFF  # the byte the hub alters
    bad = hashlib.sha256(data).hexdigest()
    box_sh(f"rm -f {p.path} {p.marker}")
    set_control(info, corrupt=True)
    try:
        run = demo.deploy()
    finally:
        set_control(info)
    assert run.rc != 0 or run.failed_hosts, run.output[-3000:]
    # the download unit failed; the deploy shows its journal lines, the refusal among them
    assert f"the model download ({model_stage.UNIT}.service: failed" in run.output
    assert "its last journal lines" in run.output
    assert f"{p.file} has sha256 {bad}, expected {good}; removed it" in run.output
    # nothing stays: not in model_dir, not in hf's local-dir cache (the staging directory)
    assert box_sh(f"test -e {p.path} || test -e {p.staging} || echo none") == "none\n"
    found = box_sh(f"find {p.directory} -type f -exec sha256sum {{}} + | cut -d' ' -f1")
    assert bad not in found.split()
    # and nothing was served from it: the deploy stopped before the backend's restart
    assert not [n for n in run.changed_names if "(Re)start llama-server" in n]

    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    assert box_sh(f"sha256sum {p.path}").split()[0] == good
    assert [n for n in run.changed_names if "(Re)start llama-server" in n]
    checks = served_checks()
    assert checks.failures == {}, checks.output[-3000:]

    # a re-run with the good file in place starts nothing: no unit start, no download
    again = deploy_model(())
    assert again.rc == 0 and not again.failed_hosts, again.output[-3000:]
    assert not [n for n in again.changed_names if "download" in n.lower()], again.changed_names
    assert "Start gpubox-model-download" not in again.output


def test_an_interrupted_download_resumes_and_fetches_only_the_rest():
    """The download is its own unit: stopping it mid-way (as a reboot would) fails the
    deploy that waited for it; the next deploy starts it again and hf resumes the partial file
    it left (curl -C -), so the mirror serves the file about once in all (< 1.2x its size)."""
    info = demo.box_info()
    data = large_file(info)
    p = plan_model.plan(config(*data))
    size = info["hub_files"][p.file]["size"]
    box_sh(f"rm -rf {p.path} {p.marker} {p.path}.part")
    before = len(requests(info))
    result: dict[str, demo.DeployRun] = {}
    set_control(info, rate=2_000_000)  # 32 MiB in about 17 s
    try:
        worker = threading.Thread(target=lambda: result.update(first=deploy_model(data)))
        worker.start()
        # stop the unit once a third of the file is on disk (curl's <file>.part)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = box_sh(f"stat -c %s {p.path}.part 2>/dev/null || true").strip()
            if got.isdigit() and int(got) >= 10 * 2**20:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the download never reached 10 MiB")
        assert box_sh(f"systemctl is-active {model_stage.UNIT}.service || true").strip() == "active"
        box_sh(f"systemctl stop {model_stage.UNIT}.service")
        worker.join(timeout=120)
    finally:
        set_control(info)
    first = result["first"]
    assert first.rc != 0 or first.failed_hosts, first.output[-3000:]
    assert "ended without a verified" in first.output, first.output[-3000:]
    kept = int(box_sh(f"stat -c %s {p.path}.part").strip())
    assert kept >= 10 * 2**20  # the partial download survived the stop

    second = deploy_model(data)
    assert second.rc == 0 and not second.failed_hosts, second.output[-3000:]
    assert box_sh(f"sha256sum {p.path}").split()[0] == p.sha256
    resolve = f"/{p.repo}/resolve/{info['hub_commit']}/{p.file}"
    gets = [e for e in requests(info)[before:] if e["method"] == "GET" and e["path"] == resolve]
    assert len(gets) >= 2, gets
    assert gets[-1]["status"] == 206 and gets[-1]["range"], gets  # the rest, by a Range
    assert int(re.fullmatch(r"bytes=(\d+)-", gets[-1]["range"])[1]) >= kept  # type: ignore[index]
    served = sum(e["bytes"] for e in gets)
    print(f"resumed download: {served} bytes served for a {size}-byte file ({served / size:.2f}x)")
    assert served < 1.2 * size, (served, size, gets)
    box_sh(f"rm -f {p.path} {p.marker}")  # 32 MiB the box does not need


def unpinned_inventory(tmp_path: Path) -> str:
    """inventories/sandbox.py's hosts without model_revision (it pins the mirror's first
    commit): the catalog's case, a file known by its sha256 alone."""
    path = tmp_path / "unpinned.py"
    path.write_text(
        "import runpy\n\n"
        f"_sandbox = runpy.run_path({str(demo.ROOT / demo.INVENTORY)!r})\n"
        "hosts = [\n"
        "    (name, {k: v for k, v in data.items() if k != 'model_revision'})\n"
        "    for name, data in _sandbox['hosts']\n"
        "]\n"
    )
    return str(path)


def test_after_a_reupload_on_main_an_unpinned_box_deploys_and_serves_the_sha256s_commit(tmp_path):
    """Issue 29 B5: the mirror's model re-uploaded on main with other bytes (as Unsloth
    re-uploaded its GGUFs); a box whose data names no revision finds, on the box, the commit
    whose file has its sha256 (the file's history: paths-info, the commits), downloads that
    commit, records it in the marker, and serves it. A sha256 that no commit has is refused
    before any transfer, naming main's."""
    info = demo.box_info()
    p = plan_model.plan(config())
    first = info["hub_commit"]
    done = json.loads(demo.sandbox("hub", "reupload", "--json", quiet=True).stdout)
    try:
        assert done["parent"] == first and done["sha256"] != info["model_sha256"]
        status = json.loads(demo.sandbox("status", "--json", quiet=True).stdout)
        assert (status["model_sha256"], status["hub_commit"]) == (info["model_sha256"], first)
        inventory = unpinned_inventory(tmp_path)
        box_sh(f"rm -f {p.path} {p.marker}")
        before = len(requests(info))

        other = "e" * 64  # (all digits: pyinfra --data would read a number)
        refused = demo.deploy("deploy/model.py", inventory, ("--data", f"model_sha256={other}"))
        assert refused.rc != 0, refused.output[-3000:]
        assert f"main has sha256 {done['sha256']}; nothing was downloaded" in refused.output
        assert "Starting operation" not in refused.output
        assert not [
            e for e in requests(info)[before:] if e["method"] == "GET" and "/resolve/" in e["path"]
        ]
        assert box_sh(f"ls {p.directory}/{p.file}* 2>/dev/null || echo none") == "none\n"

        run = demo.deploy("deploy/backend.py", inventory)
        assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
        log = requests(info)[before:]
        gets = [e["path"] for e in log if e["method"] == "GET" and "/resolve/" in e["path"]]
        assert gets == [f"/{p.repo}/resolve/{first}/{p.file}"], log
        assert [e for e in log if e["method"] == "POST" and "/paths-info/" in e["path"]]
        assert box_sh(f"sha256sum {p.path}").split()[0] == info["model_sha256"]
        assert box_sh(f"sed -n 2p {p.marker}").strip() == f"commit={first}"
        assert [n for n in run.changed_names if "(Re)start llama-server" in n]
        checks = served_checks()
        assert checks.failures == {}, checks.output[-3000:]
    finally:
        Path(info["hub_reuploads"]).unlink(missing_ok=True)  # main is the first upload again


def test_modelscope_downloads_with_the_real_client_over_https():
    """``model_source: "modelscope"`` for real (issue 29 A, B1): the real `modelscope` tool,
    installed on the box with pip from the sandbox's PyPI mirror, downloads the model from the
    sandbox's ModelScope mirror over HTTPS (the catalog's modelscope.endpoint pointed at it,
    its CA trusted through modelscope_ca_bundle, as a user sets both), at the revision the
    host names; the file is verified and served."""
    info = demo.box_info()
    data = (("model_source", "modelscope"), ("model_revision", modelscope_mirror.TAG))
    cfg = config(*data)
    assert cfg.catalog["modelscope"]["endpoint"] == info["modelscope_url"]
    assert cfg.modelscope_ca_bundle == info["modelscope_ca_bundle"]
    p = plan_model.plan(cfg)
    assert (p.source, p.repo, p.revision) == ("modelscope", info["modelscope_repo"], "v1.0")
    box_sh(f"rm -f {p.path} {p.marker}")

    run = deploy_model(data)
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    assert f"Download and verify {p.file} (modelscope): done in" in run.output
    log = modelscope_mirror.read_log(Path(info["modelscope_request_log"]))
    asked = f"/api/v1/models/{p.repo}/repo?Revision=v1.0&FilePath={p.file}"
    gets = [e for e in log if e["path"] == asked]
    assert [(e["status"], e["bytes"]) for e in gets] == [(200, info["model_size"])], log
    assert box_sh(f"sha256sum {p.path}").split()[0] == info["model_sha256"]
    assert box_sh(f"test -e {p.staging} || echo gone") == "gone\n"
    # the real client, the catalog's requirement's newest, from the sandbox's PyPI mirror
    version = box_sh(
        f"{layout.MODELSCOPE_VENV}/bin/python -c "
        "'import importlib.metadata as m; print(m.version(\"modelscope\"))'"
    ).strip()
    wheel = Path(info["modelscope_pypi_wheels"]) / f"modelscope-{version}-py3-none-any.whl"
    assert wheel.exists(), version
    checks = served_checks()
    assert checks.failures == {}, checks.output[-3000:]
