"""Long steps in plans: the CUDA toolkit's apt install runs as a long step (a progress line
every 10 s, printed live), its pinned install command kept whole inside it."""

from __future__ import annotations

from conftest import REFERENCE, fake_host, fresh_box

from gpubox.infra import progress
from gpubox.stages import cuda as cuda_stage


def commands_of(stage, data, answers) -> dict[str, list[object]]:
    """Operation name -> its command objects (conftest's plans keep only their text)."""
    out: dict[str, list[object]] = {}
    with fake_host(data, answers) as fake:
        stage()
        for op_hash in fake.state.get_op_order():
            name = ", ".join(sorted(fake.state.op_meta[op_hash].names))
            data_for_host = fake.state.get_op_data_for_host(fake.host, op_hash)
            out[name] = list(data_for_host.command_generator())
    return out


def test_the_toolkit_install_is_a_long_step_with_the_apt_probe(plan_of):
    for os_name in ("ubuntu2404", "debian12"):
        ops = commands_of(cuda_stage.cuda, REFERENCE, fresh_box(os_name))
        ((name, (command,)),) = [(n, c) for n, c in ops.items() if "Install cuda-toolkit" in n]
        assert isinstance(command, progress.StreamingCommand), name
        text = str(command)
        install = cuda_stage.install_command("cuda-toolkit-12-8", "12.8.1-1")
        assert text == progress.wrapper_command(
            install,
            progress.apt_probe(),
            progress.DEFAULT_EVERY,
            label="Install cuda-toolkit-12-8 (toolkit only, no driver)",
        )
        assert install.startswith("DEBIAN_FRONTEND=noninteractive apt-get -y ")
        assert install.endswith("install --no-install-recommends --allow-downgrades "
                                "cuda-toolkit-12-8=12.8.1-1")  # fmt: skip
        # the guard still runs first
        names = list(ops)
        assert (
            names.index(name) == names.index(next(n for n in names if "pulls no driver" in n)) + 1
        )
    plan = plan_of(cuda_stage.cuda, REFERENCE, fresh_box("ubuntu2404"))
    assert [p for p in plan.installs() if p.startswith("cuda")] == ["cuda-toolkit-12-8=12.8.1-1"]


def test_an_older_toolkit_installed_gets_the_long_step_too(plan_of):
    old = {"dpkg -l": ["ii  cuda-toolkit-12-8  12.8.0-1  amd64  toolkit"]}
    plan = plan_of(cuda_stage.cuda, REFERENCE, fresh_box("ubuntu2404", **old))
    (text,) = plan.op("Install cuda-toolkit-12-8")
    assert text.startswith("# gpubox long step") and "cuda-toolkit-12-8=12.8.1-1\n" in text
