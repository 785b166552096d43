"""The model stage's plan: the download tool installed from catalog ``pypi.index_url`` (a PyPI
mirror is an override of it), the download as a long step with progress lines whose total is
the size the Hub announces, and that size in the disk check."""

from __future__ import annotations

import json

import pytest
from conftest import REFERENCE, fake_host, fresh_box
from pyinfra.api.command import FileUploadCommand

from gpubox.commands import deploying
from gpubox.config import load_host_config, validate
from gpubox.infra import progress
from gpubox.plans import model as plan_model
from gpubox.stages import model as model_stage

ANNOUNCED = "curl -sSI --max-time 20 https://huggingface.co/unsloth/"


def size_answer(size: int) -> str:
    """The size query's answer from a server that gives only a size (no Hub headers)."""
    return f"HTTP/1.1 200 OK\nContent-Length: {size}\n"


def test_the_download_tool_comes_from_the_catalogs_index(plan_of):
    ms = {**REFERENCE, "model_source": "modelscope"}
    plan = plan_of(model_stage.model, ms, fresh_box("ubuntu2404"))
    (_, pip) = plan.op("Download tool in /opt/gpubox/modelscope-venv")
    assert "--index-url https://pypi.org/simple " in pip
    # the GGUF from Hugging Face needs no tool: curl resumes it (the vLLM checkpoint uses hf)
    hf = plan_of(model_stage.model, REFERENCE, fresh_box("ubuntu2404"))
    assert not [n for n in hf.names if "Download tool" in n]


def test_a_pypi_mirror_is_a_catalog_override(plan_of):
    data = {
        **REFERENCE,
        "model_source": "modelscope",
        "catalog_overrides": {"pypi.index_url": "https://mirror.example.org/pypi/simple"},
    }
    plan = plan_of(model_stage.model, data, fresh_box("debian12"))
    (_, pip) = plan.op("Download tool in /opt/gpubox/modelscope-venv")
    assert "--index-url https://mirror.example.org/pypi/simple " in pip


def uploads(stage, data: dict, answers: dict) -> dict[str, str]:
    """What the stage's files.put operations would write (destination -> text)."""
    out = {}
    with fake_host(data, answers) as fake:
        stage()
        for op_hash in fake.state.get_op_order():
            op = fake.state.get_op_data_for_host(fake.host, op_hash)
            for command in op.command_generator():
                if isinstance(command, FileUploadCommand) and hasattr(command.src, "getvalue"):
                    out[command.dest] = command.src.getvalue()
    return out


def test_the_download_is_a_unit_and_the_backend_waits_for_it_with_progress(plan_of):
    data = {**REFERENCE, "hf_endpoint": "https://hf-mirror.example.org", "model_repo": "me/x"}
    answers = fresh_box(
        "ubuntu2404",
        **{"curl -sSI --max-time 20 https://hf-mirror.example.org/me/x/": size_answer(12345678)},
    )
    plan = plan_of(model_stage.model, data, answers)
    names = plan.names
    order = [
        "Model download script",
        "Model download unit gpubox-model-download",
        "Reload systemd units (model download)",
        "Start gpubox-model-download",
        "Download and verify Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf",
    ]
    at = [next(i for i, n in enumerate(names) if want in n) for want in order]
    assert at == sorted(at), names
    assert plan.op("Start gpubox-model-download") == [
        "systemctl start gpubox-model-download.service",
        "systemctl enable gpubox-model-download.service",
    ]
    (step,) = plan.op("Download and verify Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf")
    config = load_host_config("b", data)
    p = plan_model.plan(config)
    assert step.startswith("# gpubox long step")
    assert progress.download_probe(p.path, 12345678) in step
    assert model_stage.wait_command(p) in step
    # the unit's script: the download (no staging removed first), under the stall watchdog
    written = uploads(model_stage.model, data, answers)
    script = written[model_stage.SCRIPT]
    assert script == model_stage.download_script(
        p, "https://hf-mirror.example.org", config.catalog["modelscope"]["endpoint"], 120, False
    )
    url = "https://hf-mirror.example.org/me/x/resolve/main/Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf"
    assert f'-C - -H @"$GPUBOX_AUTH" -o {p.path}.part {url}' in script
    assert f"rm -f {p.path}.part" not in script.split("_gw_run")[0]  # nothing removed first
    assert "no new bytes for 120 s (download_stall_s)" in script
    assert script.endswith(
        "systemctl disable -q gpubox-model-download.service 2>/dev/null || true\n"
    )


def test_the_unit_is_enabled_low_priority_and_memory_capped(plan_of):
    data = {**REFERENCE, "download_memory_max": "2G", "download_stall_s": 30}
    written = uploads(model_stage.model, data, fresh_box("ubuntu2404"))
    unit = written[model_stage.UNIT_FILE]
    for line in (
        "Type=exec",
        f"ExecStart=/bin/sh {model_stage.SCRIPT}",
        "Nice=19",
        "CPUSchedulingPolicy=batch",
        "IOSchedulingClass=best-effort",
        "IOSchedulingPriority=7",
        "MemoryMax=2G",
        "OOMPolicy=continue",  # an OOM kill ends the transfer, the script retries it
        "Restart=no",
        "WantedBy=multi-user.target",
        "After=network-online.target",
        "RequiresMountsFor=/srv/models",
    ):
        assert line in unit.splitlines(), (line, unit)
    assert "LoadCredential" not in unit  # no token in the operator's environment
    script = written[model_stage.SCRIPT]
    assert "no new bytes for 30 s (download_stall_s)" in script
    # no Xet client runs on this path: curl over the resolve URL (see docs/models.md)
    assert "hf download" not in script and "hf_xet" not in script
    # curl retries a connection reset mid-transfer too (issue 29 B3)
    assert "curl -fsSL --retry 10 --retry-delay 5 -C -" in script
    assert "--retry-all-errors" not in script  # a retry inside curl would not resume
    assert load_host_config("b", REFERENCE).download_memory_max == "4G"  # the default cap


def test_the_token_reaches_the_unit_as_a_credential_never_on_a_line(plan_of, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    plan = plan_of(model_stage.model, REFERENCE, fresh_box("ubuntu2404"))
    written = uploads(model_stage.model, REFERENCE, fresh_box("ubuntu2404"))
    unit, script = written[model_stage.UNIT_FILE], written[model_stage.SCRIPT]
    assert "LoadCredential=hf-token:/root/.cache/gpubox/hf-token" in unit.splitlines()
    assert "hf_secret_value" not in unit + script + "".join(plan.commands)
    assert "Environment" not in unit
    assert '"${CREDENTIALS_DIRECTORY:-/nonexistent}/hf-token"' in script
    # curl reads it as a header file written by the shell's own printf
    assert (
        "printf 'Authorization: Bearer %s\\n' \"$(cat \"${CREDENTIALS_DIRECTORY:-/nonexistent}"
        '/hf-token")" > "$GPUBOX_AUTH"' in script
    )
    assert written["/root/.cache/gpubox/hf-token"] == "hf_secret_value\n"
    (chmod,) = [c for c in plan.op("HF_TOKEN for this download") if c.startswith("chmod")]
    assert chmod == "chmod 600 /root/.cache/gpubox/hf-token"
    # removed when the download ends by itself, kept when it is stopped (the resume needs it)
    assert "trap 'rm -f /root/.cache/gpubox/hf-token \"$GPUBOX_AUTH\"' EXIT" in script
    assert "trap 'rm -f \"$GPUBOX_AUTH\"; trap - EXIT; exit 143' HUP INT TERM" in script


def test_the_catalog_says_the_gguf_is_unpinned_and_hf_then_asks_for_main(plan_of, caplog):
    config = load_host_config("b", REFERENCE)
    entry = config.catalog["models"][config.model]
    assert entry["revision"] is None and entry["modelscope_revision"] is None
    p = plan_model.plan(config)
    assert p.revision is None
    size = plan_model.remote_size_command(p, "https://huggingface.co")
    assert size and "/resolve/main/Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf" in size
    written = uploads(model_stage.model, REFERENCE, fresh_box("ubuntu2404"))
    assert (
        "/resolve/main/Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf" in written[model_stage.SCRIPT]
    )
    assert "is not pinned to a revision" in caplog.text


COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    "data",
    [
        {"model_revision": COMMIT},
        {"catalog_overrides": {"models.qwen3-next-80b-a3b-thinking.revision": COMMIT}},
    ],
)
def test_hf_downloads_and_sizes_the_pinned_commit(plan_of, data, caplog):
    data = {**REFERENCE, **data}
    p = plan_model.plan(load_host_config("b", data))
    assert p.revision == COMMIT
    size = plan_model.remote_size_command(p, "https://huggingface.co")
    assert size and f"/resolve/{COMMIT}/Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf" in size
    written = uploads(model_stage.model, data, fresh_box("ubuntu2404"))
    assert (
        f"/resolve/{COMMIT}/Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf"
        in (written[model_stage.SCRIPT])
    )
    assert "is not pinned" not in caplog.text


def test_modelscope_names_its_own_revision_only_where_the_catalog_has_one():
    ms = {**REFERENCE, "model_source": "modelscope"}
    hf_pinned = {"catalog_overrides": {"models.qwen3-next-80b-a3b-thinking.revision": COMMIT}}
    # a Hugging Face commit is no ModelScope revision: not passed to modelscope
    p = plan_model.plan(load_host_config("b", {**ms, **hf_pinned}))
    assert p.revision is None
    commands = "".join(model_stage.download_commands(p, "", "https://www.modelscope.cn"))
    assert "--revision" not in commands
    pinned = {"catalog_overrides": {"models.qwen3-next-80b-a3b-thinking.modelscope_revision": "v2"}}
    p = plan_model.plan(load_host_config("b", {**ms, **pinned}))
    commands = "".join(model_stage.download_commands(p, "", "https://www.modelscope.cn"))
    assert "Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf --revision v2 --local_dir" in commands
    assert plan_model.remote_size_command(p, "") is None


MS_TOOL = "/opt/gpubox/modelscope-venv/bin/modelscope download --model"


@pytest.mark.parametrize(
    ("endpoint", "host"),
    [
        (None, "www.modelscope.cn"),  # the catalog's https://www.modelscope.cn
        ("https://ms-mirror.example.org:8443/", "ms-mirror.example.org:8443"),
        ("ms-mirror.example.org", "ms-mirror.example.org"),
    ],
)
def test_modelscope_is_given_the_endpoints_host_not_its_url(endpoint, host):
    """modelscope 1.20 to 1.37 put https:// in front of MODELSCOPE_DOMAIN whatever it holds
    (modelscope/hub/utils/utils.py get_endpoint): a URL there asked https://https://... (issue
    29 B1). modelscope-hub (1.38 and later) reads MODELSCOPE_ENDPOINT first, a URL."""
    data = {**REFERENCE, "model_source": "modelscope"}
    if endpoint:
        data["catalog_overrides"] = {"modelscope.endpoint": endpoint}
    script = uploads(model_stage.model, data, fresh_box("debian12"))[model_stage.SCRIPT]
    assert f"MODELSCOPE_DOMAIN={host} MODELSCOPE_ENDPOINT=https://{host} {MS_TOOL}" in script
    assert "https://https://" not in script and "MODELSCOPE_DOMAIN=https" not in script
    assert "REQUESTS_CA_BUNDLE" not in script  # the client's own CA bundle (certifi)


def test_a_private_cas_bundle_reaches_modelscope_as_requests_ca_bundle():
    data = {
        **REFERENCE,
        "model_source": "modelscope",
        "catalog_overrides": {"modelscope.endpoint": "https://ms.lab.internal"},
        "modelscope_ca_bundle": "/etc/ssl/certs/lab-ca.pem",
    }
    script = uploads(model_stage.model, data, fresh_box("ubuntu2404"))[model_stage.SCRIPT]
    assert (
        "MODELSCOPE_DOMAIN=ms.lab.internal MODELSCOPE_ENDPOINT=https://ms.lab.internal "
        f"REQUESTS_CA_BUNDLE=/etc/ssl/certs/lab-ca.pem {MS_TOOL}"
    ) in script
    _, problems = validate("b", {**data, "modelscope_ca_bundle": "lab-ca.pem"})
    (problem,) = [x for x in problems if x.severity == "error"]
    assert problem.key == "modelscope_ca_bundle" and "absolute path" in problem.message


@pytest.mark.parametrize("endpoint", ["http://ms-mirror.example.org", "https://ms.example/x"])
def test_a_modelscope_endpoint_that_is_no_https_host_is_refused_naming_the_key(endpoint):
    data = {
        **REFERENCE,
        "model_source": "modelscope",
        "catalog_overrides": {"modelscope.endpoint": endpoint},
    }
    config, problems = validate("b", data)
    (problem,) = [x for x in problems if x.severity == "error"]
    assert config is None and problem.key == "catalog_overrides"
    assert f"'modelscope.endpoint' is {endpoint!r}" in problem.message
    if endpoint.startswith("http://"):
        assert "must serve HTTPS" in problem.message


def test_a_verified_file_starts_nothing(plan_of):
    p = plan_model.plan(load_host_config("b", REFERENCE))
    answers = fresh_box(
        "ubuntu2404",
        **{"gpubox-verified": [f"marker={p.stamp} size=5 mtime=7", "file=size=5 mtime=7"]},
    )
    for stage in (model_stage.model_download, model_stage.model):
        plan = plan_of(stage, REFERENCE, answers)
        ops = [n.split(" | ")[-1] for n in plan.names]
        assert ops in (
            ["apt-get waits up to 900 s for dpkg's lock", "No HF_TOKEN file left on the box"],
        ), ops
        assert not [c for c in plan.commands if "gpubox-model-download" in c]


def test_the_early_stage_starts_it_and_the_backend_only_waits(plan_of):
    """In one run (deploy/full.py: model_download first, the backend last) the unit is
    written and started once, by the early stage; the backend's model stage waits for it."""

    def both() -> None:
        model_stage.model_download()
        model_stage.model()

    plan = plan_of(both, REFERENCE, fresh_box("ubuntu2404"))
    assert len([n for n in plan.names if "Start gpubox-model-download" in n]) == 1
    assert len([n for n in plan.names if "Model download script" in n]) == 1
    assert [n for n in plan.names if "Download and verify" in n]
    assert (
        plan.names.index(next(n for n in plan.names if "Start gpubox" in n)) < len(plan.names) - 1
    )
    stages = deploying.FULL_STAGES
    assert stages.index("model_download") < stages.index("driver") < stages.index("backend")


def test_without_an_announced_size_the_progress_has_no_total(plan_of):
    plan = plan_of(model_stage.model, REFERENCE, fresh_box("ubuntu2404"))
    (step,) = plan.op("Download and verify")
    p = plan_model.plan(load_host_config("b", REFERENCE))
    assert progress.download_probe(p.path, None) in step


def test_the_disk_check_counts_the_announced_size(plan_of):
    import pytest

    from gpubox.base.errors import DeployRefused

    answers = fresh_box(
        "ubuntu2404",
        **{"df -B1 --output=avail": str(60 * 2**30), ANNOUNCED: size_answer(70 * 2**30)},
    )
    with pytest.raises(DeployRefused, match=r"has 60\.0 GiB free; .* needs 70\.0 GiB"):
        plan_of(model_stage.model, REFERENCE, answers)


def test_the_backend_builds_llama_cpp_before_it_waits_for_the_model(plan_of):
    """The download runs while llama.cpp builds (the longest step on a real box): the
    backend's wait for the file comes after the build, before llama-server starts."""
    from gpubox.stages.backend import backend

    def both() -> None:
        model_stage.model_download()
        backend()

    plan = plan_of(both, REFERENCE, fresh_box("ubuntu2404"))
    build = next(i for i, n in enumerate(plan.names) if "Build llama-server" in n)
    wait = next(i for i, n in enumerate(plan.names) if "Download and verify" in n)
    start = next(i for i, n in enumerate(plan.names) if "(Re)start llama-server" in n)
    assert build < wait < start, plan.names


# --- issue 29 B5: the GGUF pinned to the commit whose file has the sha256 -------------------

HEAD_COMMIT, OLD_COMMIT, FIRST_COMMIT = "c" * 40, "b" * 40, "a" * 40
API = "https://huggingface.co/api/models/unsloth/Qwen3-Next-80B-A3B-Thinking-GGUF"


def hub_answers(sha256_at: dict[str, str], etag: str) -> dict[str, str]:
    """Fact answers of the Hub for the catalog's file: the size query (a 302 with the Hub's
    headers), paths-info at each commit (sha256 and the commit that last changed it), and the
    commits list, newest first; as huggingface_hub 1.33's parsers read them."""
    order = [HEAD_COMMIT, OLD_COMMIT, FIRST_COMMIT]
    answers = {
        ANNOUNCED: "HTTP/2 302\nx-linked-size: 1000\n"
        f'x-repo-commit: {HEAD_COMMIT}\nx-linked-etag: "{etag}"\n',
        f"{API}/commits/": "HTTP/2 200\n\n"
        + json.dumps([{"id": c, "title": "t", "authors": [], "date": "x"} for c in order]),
    }
    for commit in order:
        sha = sha256_at.get(commit)
        last = next(
            c for c in reversed(order[: order.index(commit) + 1]) if sha256_at.get(c) == sha
        )
        entry = {"type": "file", "path": "Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf", "size": 1,
                 "oid": "0" * 40, "lfs": {"oid": sha, "size": 1, "pointerSize": 134},
                 "lastCommit": {"id": last, "title": "t", "date": "x"}}  # fmt: skip
        answers[f"{API}/paths-info/{commit}"] = "HTTP/2 200\n\n" + json.dumps(
            [entry] if sha else []
        )
    return answers


def catalog_sha256() -> str:
    return plan_model.plan(load_host_config("b", REFERENCE)).sha256 or ""


def test_the_size_query_pins_the_commit_whose_etag_is_the_sha256(plan_of, caplog):
    sha = catalog_sha256()
    answers = fresh_box("ubuntu2404", **hub_answers({HEAD_COMMIT: sha}, etag=sha))
    written = uploads(model_stage.model, REFERENCE, answers)
    script = written[model_stage.SCRIPT]
    assert f"/resolve/{HEAD_COMMIT}/Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf" in script
    assert "/resolve/main/" not in script
    assert f"; echo commit={HEAD_COMMIT} >> /srv/models/" in script  # the marker records it
    assert "is not pinned" not in caplog.text


def test_a_reuploaded_file_is_downloaded_at_the_newest_commit_with_its_sha256(plan_of, caplog):
    caplog.set_level("INFO")
    sha, other = catalog_sha256(), "e" * 64
    sha256_at = {HEAD_COMMIT: other, OLD_COMMIT: sha, FIRST_COMMIT: sha}
    answers = fresh_box("ubuntu2404", **hub_answers(sha256_at, etag=other))
    script = uploads(model_stage.model, REFERENCE, answers)[model_stage.SCRIPT]
    assert f"/resolve/{OLD_COMMIT}/Qwen3-Next-80B-A3B-Thinking-UD-Q4_K_XL.gguf" in script
    assert f"pinned to commit {OLD_COMMIT}" in caplog.text


def test_no_commit_with_the_sha256_refuses_before_anything_is_planned(plan_of):
    from gpubox.base.errors import DeployRefused

    other = "e" * 64
    answers = fresh_box(
        "ubuntu2404", **hub_answers({HEAD_COMMIT: other, OLD_COMMIT: other}, etag=other)
    )
    with pytest.raises(DeployRefused, match=rf"main has sha256 {other}; nothing was downloaded"):
        plan_of(model_stage.model_download, REFERENCE, answers)


def test_a_mirror_without_the_hubs_api_downloads_main_and_warns(plan_of, caplog):
    data = {**REFERENCE, "hf_endpoint": "https://mirror.example.org"}
    answers = fresh_box(
        "ubuntu2404",
        **{"curl -sSI --max-time 20 https://mirror.example.org/": size_answer(1000)},
        **{"/paths-info/": "HTTP/1.1 404 Not Found\n\nnot here"},
    )
    script = uploads(model_stage.model, data, answers)[model_stage.SCRIPT]
    assert "https://mirror.example.org/unsloth/" in script and "/resolve/main/" in script
    assert "is not pinned to a revision: https://mirror.example.org did not answer" in caplog.text
