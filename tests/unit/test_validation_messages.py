"""What `gpubox check` tells a user, case by case: the nearest GPU models, weights that do not
fit (more GPUs, fewer bits) apart from a context that does not, the warnings for NVLink on one
GPU and for keys the backend ignores, docker_users, and the inventory that is a directory or
defines no hosts. Each fix a message proposes is applied here and must validate."""

from __future__ import annotations

import re

import pytest
from helpers import REFERENCE

from gpubox import parsers
from gpubox.base import compat
from gpubox.cli import main
from gpubox.config import KEYS, load_host_config, validate
from gpubox.config.validation import gpu_model_suggestions
from gpubox.knowledge import users
from gpubox.preflight import gate as preflight
from gpubox.remote import inventory

MODEL = "qwen3-next-80b-a3b-thinking"


def problems(data, severity="error"):
    _, found = validate("box", {**REFERENCE, **data})
    return {p.key: p.message for p in found if p.severity == severity}


# --------------------------------------------------------------------------- GPU models


@pytest.mark.parametrize(
    ("given", "nearest"),
    [
        (
            "V100",
            [
                "Tesla V100-SXM2-32GB",
                "Tesla V100-SXM2-16GB",
                "Tesla V100-PCIE-32GB",
                "Tesla V100-PCIE-16GB",
                "Tesla V100S-PCIE-32GB",
            ],
        ),
        (
            "NVIDIA V100 32GB",
            ["Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB"],
        ),
        ("Tesla V100S", ["Tesla V100S-PCIE-32GB"]),
        ("v100-sxm2", ["Tesla V100-SXM2-32GB", "Tesla V100-SXM2-16GB"]),
        ("T4", ["Tesla T4"]),
        ("RTX4090", ["NVIDIA GeForce RTX 4090"]),
        ("a100 80gb", ["NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"]),
        ("Tesla V100-SXM2-32G", ["Tesla V100-SXM2-32GB"]),
        ("GeForce 256", []),
    ],
)
def test_the_nearest_gpu_models(given, nearest):
    assert gpu_model_suggestions(given) == nearest
    assert all(name in compat.GPU_MODELS for name in nearest)


def test_an_unknown_gpu_model_says_did_you_mean_and_nothing_else_about_the_gpu():
    found = problems({"gpu_model": "V100"})
    assert found == {
        "gpu_model": "unknown GPU model 'V100'; did you mean 'Tesla V100-SXM2-32GB', "
        "'Tesla V100-SXM2-16GB', 'Tesla V100-PCIE-32GB', 'Tesla V100-PCIE-16GB' or "
        "'Tesla V100S-PCIE-32GB'? (the name as `nvidia-smi --query-gpu=name "
        "--format=csv,noheader` prints it)"
    }
    # the first suggestion is a valid inventory
    assert problems({"gpu_model": gpu_model_suggestions("V100")[0]}) == {}


# --------------------------------------------------------------------------- memory


ONE_V100 = {"gpu_count": 1, "nvlink": False}
WEIGHTS_MESSAGE = (
    f"{MODEL}'s weights alone are about 46 GiB (gguf-q4_k); 1x Tesla V100-SXM2-32GB has 30 GiB "
    "usable, so no model_ctx fits: use more GPUs (gpu_count 2: 61 GiB, room for model_ctx "
    "131072 x model_parallel 2), or fewer bits per weight: a quantisation of at most 24 GiB at "
    "model_ctx 131072 x model_parallel 2 (its GGUF as model_file and model_sha256, its size "
    f"as catalog_overrides models.{MODEL}.weights_gib)"
)


def test_weights_that_do_not_fit_one_v100_are_not_a_context_problem():
    assert problems(ONE_V100) == {"gpu_count": WEIGHTS_MESSAGE}


def test_each_fix_the_weights_message_proposes_validates():
    # more GPUs
    assert problems({**ONE_V100, "gpu_count": 2}) == {}
    # fewer bits: a GGUF of at most the size it names
    size = int(re.search(r"at most (\d+) GiB", WEIGHTS_MESSAGE).group(1))
    smaller = {
        "model_file": "Qwen3-Next-80B-A3B-Thinking-UD-Q2_K_XL.gguf",
        "model_sha256": "0" * 64,
        "catalog_overrides": {f"models.{MODEL}.weights_gib": size},
    }
    assert problems({**ONE_V100, **smaller}) == {}
    too_big = {**smaller, "catalog_overrides": {f"models.{MODEL}.weights_gib": size + 1}}
    assert "model_ctx" in problems({**ONE_V100, **too_big})


def test_weights_that_fit_with_a_context_that_does_not_name_model_ctx():
    # 27 GiB of weights fit one V100; two slots of 262144 tokens of KV cache (12 GiB) do not
    data = {
        **ONE_V100,
        "model_ctx": 262144,
        "catalog_overrides": {f"models.{MODEL}.weights_gib": 27},
    }
    found = problems(data)
    assert list(found) == ["model_ctx"]
    assert found["model_ctx"].startswith(
        f"{MODEL} with 2 slot(s) of 262144 tokens (a KV pool of 524288"
    )
    largest = int(re.search(r"lower model_ctx to (\d+) or less", found["model_ctx"]).group(1))
    assert problems({**data, "model_ctx": largest}) == {}


def test_a_cpu_build_is_not_judged_against_gpu_memory():
    assert problems({**ONE_V100, "llamacpp_cuda": False}) == {}


# --------------------------------------------------------------------------- warnings


def test_nvlink_on_one_gpu_is_a_warning_set_or_defaulted():
    one_h100 = {"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 1}
    _, found = validate("box", one_h100)  # nvlink not set: its default, true
    assert [(p.key, p.severity, p.message) for p in found] == [
        (
            "nvlink",
            "warning",
            "defaults to true (the reference box) but gpu_count is 1: NVLink joins two or "
            'more GPUs, and the NVLink checks would look for links to a peer; set "nvlink": False',
        )
    ]
    explicit = problems({**one_h100, "nvlink": True}, "warning")  # REFERENCE sets it
    assert explicit["nvlink"].startswith("is true but gpu_count is 1")
    assert problems({**one_h100, "nvlink": True}) == {}  # no error
    assert problems({**one_h100, "nvlink": False}, "warning") == {}
    assert problems({}, "warning") == {}  # two GPUs


def test_keys_the_backend_ignores_are_warnings():
    vllm = problems(
        {"backend": "vllm", "llamacpp_split_mode": "row", "model_file": "x.gguf"}, "warning"
    )
    assert vllm == {
        "llamacpp_split_mode": "is ignored with backend 'vllm': only llama.cpp reads it "
        "(backend 'llamacpp')",
        "model_file": "is ignored with backend 'vllm': only llama.cpp reads it (backend "
        "'llamacpp')",
    }
    llama = problems({"vllm_enforce_eager": True, "vllm_tensor_parallel": 2}, "warning")
    assert set(llama) == {"vllm_enforce_eager", "vllm_tensor_parallel"}
    assert "only vLLM reads it" in llama["vllm_enforce_eager"]
    # warnings only: the inventory is valid
    assert problems({"backend": "vllm", "llamacpp_split_mode": "row"}) == {}
    # with nothing served, a box keeps its settings without a word
    assert problems({"backend": "none", "llamacpp_split_mode": "row"}, "warning") == {}
    # a key the backend reads is not warned about
    assert problems({"backend": "vllm", "vllm_enforce_eager": True}, "warning") == {}


def test_every_backend_named_key_belongs_to_its_backend():
    for key in KEYS:
        for prefix, backend in (("llamacpp_", "llamacpp"), ("vllm_", "vllm")):
            if key.name.startswith(prefix):
                assert key.backend == backend, key.name
    assert {k.backend for k in KEYS} == {None, "llamacpp", "vllm"}


# --------------------------------------------------------------------------- docker_users


def test_docker_users_defaults_to_nobody_and_takes_user_names():
    assert load_host_config("box", REFERENCE).docker_users == []
    assert load_host_config(
        "box", {**REFERENCE, "docker_users": ["owner", "ci_1"]}
    ).docker_users == [
        "owner",
        "ci_1",
    ]
    assert problems({"docker_users": "owner"}) == {"docker_users": "must be list, got str 'owner'"}
    assert problems({"docker_users": ["owner", "-rf", 7, "a b"]}) == {
        "docker_users": "must be a list of user names (like 'alice'), got '-rf', 7, 'a b'"
    }
    assert problems({"docker_users": ["owner", "owner"]}, "warning") == {
        "docker_users": "lists owner twice"
    }


def test_preflight_refuses_a_user_the_box_lacks_and_names_the_key():
    config = load_host_config("box", {**REFERENCE, "docker_users": ["owner", "ghost", "nobody2"]})
    groups = parsers.parse_user_groups(
        "owner:owner adm cdrom sudo dip plugdev users lpadmin\nghost:\nnobody2:\n"
    )
    found = [
        p for p in preflight.evaluate(config, {}, [], 0, None, groups) if p.key == "docker_users"
    ]
    assert [str(p) for p in found] == [
        "box: docker_users: no user 'ghost', 'nobody2' on the box: create them first (sudo "
        "adduser ghost; sudo adduser nobody2), or take them out of docker_users"
    ]
    everyone = parsers.parse_user_groups("owner:owner\nghost:ghost\nnobody2:nobody2 docker\n")
    assert not [
        p for p in preflight.evaluate(config, {}, [], 0, None, everyone) if p.key == "docker_users"
    ]


def test_the_user_groups_command_and_its_parser():
    command = users.groups_command(["owner", "o'b"])
    assert command == (
        'for u in owner \'o\'"\'"\'b\'; do printf "%s:" "$u"; id -nG -- "$u" 2>/dev/null || '
        "echo; done"
    )
    assert parsers.parse_user_groups("owner:owner sudo docker\nghost:\n\n") == {
        "owner": ["owner", "sudo", "docker"],
        "ghost": None,
    }
    with pytest.raises(parsers.ParseError, match="want NAME:GROUPS"):
        parsers.parse_user_groups("uid=1000(owner) gid=1000(owner)\n")


# --------------------------------------------------------------------------- inventories


def test_a_directory_names_the_inventory_files_in_it(tmp_path, capsys):
    (tmp_path / "box.py").write_text("hosts = [('a', {})]\n")
    (tmp_path / "lab.py").write_text("hosts = [('b', {})]\n")
    (tmp_path / "notes.txt").write_text("")
    assert main(["check", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"gpubox check: cannot read {tmp_path}: is a directory, not an inventory file: name one "
        f"of its inventory files, e.g. {tmp_path / 'box.py'}, {tmp_path / 'lab.py'}\n"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        inventory.InventoryError, match="is a directory, not an inventory file with no"
    ):
        inventory.load(str(empty))


@pytest.mark.parametrize("body", ["", "x = 1\n", "hosts = []\n"])
def test_an_inventory_without_hosts_shows_the_format(tmp_path, capsys, body):
    path = tmp_path / "empty.py"
    path.write_text(body)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"gpubox check: cannot read {path}: it defines no hosts; an inventory is "
    )
    assert inventory.FORMAT_EXAMPLE in err
    # the example is itself an inventory that defines a host, and a valid one
    example = tmp_path / "example.py"
    example.write_text(
        inventory.FORMAT_EXAMPLE.split("e.g.:\n", 1)[1].split("\n(", 1)[0].strip() + "\n"
    )
    assert main(["check", str(example)]) == 0
    assert "1 host(s) valid" in capsys.readouterr().out


def test_the_check_output_of_warnings_alone_is_valid(tmp_path, capsys):
    path = tmp_path / "warn.py"
    path.write_text(
        "hosts = [('v', {'ssh_hostname': '192.0.2.11', 'backend': 'vllm', "
        "'llamacpp_split_mode': 'row'})]\n"
    )
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    # the default pin's lifecycle note (R570, past its end of life) is no warning (issue 30 A)
    assert out[1].startswith("note: v: driver branch R570 is past its end of life")
    assert out[:1] + out[2:] == [
        "warning: v: llamacpp_split_mode: is ignored with backend 'vllm': only llama.cpp reads it "
        "(backend 'llamacpp')",
        "v  valid, 1 warning(s), 1 note",
        f"{path}: 1 host(s) valid",
    ]
