"""End to end on the sandbox box: refused runs change nothing; a fresh box converges and
verifies; a second deploy changes nothing; drift is detected and repaired; faults that
configuration cannot repair are detected and named. The tests run in order on one box."""

from __future__ import annotations

import json
import time

import pytest
from conftest import box_sh, plant

from gpubox import sandbox
from gpubox.base.layout import DCGM_EXPORTER, DCGM_EXPORTER_UNIT_FILE
from gpubox.commands import demo
from gpubox.config import load_host_config
from gpubox.knowledge import exporter_label
from gpubox.sandbox.repo_driver import NEWER_580
from gpubox.sandbox.standin import state as standin_state
from gpubox.stages.driver import PIN_FILE

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sandbox_box")]

SNAPSHOT = (
    "set -o pipefail; dpkg -l | sha256sum; "
    "find /etc -xdev -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum"
)


def failed_checks(run: demo.CheckRun) -> dict[str, str]:
    """test name -> its failure message."""
    return run.failures


def test_refused_runs_leave_the_box_unchanged():
    before = box_sh(SNAPSHOT)
    bad_key = demo.deploy(extra=("--data", "driver_brach=570"))
    assert bad_key.rc != 0
    assert "driver_brach: unknown key; did you mean 'driver_branch'?" in bad_key.output
    too_many = demo.deploy(extra=("--data", "gpu_count=4"))
    assert too_many.rc != 0
    assert "gpu_count: lspci shows 2 Tesla V100-SXM2-32GB (gpu_count is 4)" in too_many.output
    assert box_sh(SNAPSHOT) == before


def test_first_deploy_converges_and_the_checks_pass():
    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    assert run.changed > 10
    assert box_sh("cat /run/gpubox-standin/loaded-driver").split()[0] == "570.211.01"
    demo.load_check_image()  # the GPU containers' image, imported (never from a registry)
    checks = demo.checks(extra=("--burn",))
    assert checks.rc == 0 and checks.failed == 0 and checks.passed >= 30, checks.output[-4000:]


def test_second_deploy_changes_nothing_and_the_checks_still_pass():
    # driver_kernel_headers at its default (the sandbox inventory turns it off): the box runs
    # the host's kernel, whose headers no archive has, as a box not rebooted since a kernel
    # update runs one the archive dropped (issue 29 D12). The deploy asks the box's apt first
    # (its lists are there since the first deploy), skips them with a warning, and changes
    # nothing: the module is built against the kernel's own headers tree.
    run = demo.deploy(extra=("--data", "driver_kernel_headers=true"))
    assert run.no_change, f"changed: {run.changed_names}\n{run.output[-2000:]}"
    release = box_sh("uname -r").strip()
    assert (
        f"kernel headers: linux-headers-{release} is in none of the box's apt repositories; "
        f"skipped: DKMS builds the NVIDIA module for {release} against /lib/modules/{release}/"
        "build, which is there"
    ) in run.output, run.output[-3000:]
    checks = demo.checks()
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]


def test_drift_to_580_and_persistence_off_is_detected_then_repaired():
    packages = load_host_config("b", {}).driver_packages("debian").installed
    assert set(packages) <= set(box_sh("apt-mark showhold").split())
    box_sh("apt-mark unhold " + " ".join(packages))
    # Force the 580 stand-ins in, as a careless admin would: the pin moved away, then an
    # `apt install` of the newest driver (its exactly versioned dependencies follow). The
    # newest: with the pin gone, apt's candidates for those dependencies are the newest build's
    # (the sandbox's invented NEWER_580), and an older 580 asked by version alone is refused as
    # "held broken packages".
    drift = f"{NEWER_580}-1"
    box_sh(f"mv {PIN_FILE} /root/pin.bak")
    box_sh(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "
        + " ".join(f"{p}={drift}" for p in packages)
    )
    assert box_sh("dpkg-query -W -f='${Version}' nvidia-smi") == drift
    box_sh("systemctl stop nvidia-persistenced")
    checks = demo.checks()
    failed = failed_checks(checks)
    for name in (
        "driver.version",
        "driver.held",
        "driver.one-branch",
        "driver.persistenced",
        "driver.loaded",
    ):
        assert name in failed, f"{name} did not fail:\n{checks.output[-4000:]}"
    assert drift in failed["driver.version"]

    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    checks = demo.checks()
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]


def test_a_kernel_update_without_the_module_is_caught_then_built_by_the_next_deploy():
    """A kernel update whose DKMS build did not run (its hooks never ran, say the headers came
    later): the check names the kernel; the next deploy builds the module for it. A kernel whose
    headers' hook runs (what the headers meta package brings) gets the module by itself."""
    from gpubox.sandbox import box as sandbox_box

    with_hooks = sandbox_box.plant_kernel("6.18.99-gpubox-hooked", headers=True)
    assert all(h["returncode"] == 0 for h in with_hooks["hooks"]), with_hooks["hooks"]
    assert "6.18.99-gpubox-hooked, x86_64: installed" in box_sh("dkms status")
    sandbox_box.plant_kernel("6.18.98-gpubox-update", headers=True, run_hooks=False)
    failed = failed_checks(demo.checks(extra=("-m", "quick")))
    message = failed["driver.kernels"]
    assert "for kernel(s) 6.18.98-gpubox-update:" in message
    assert "hooked" not in message
    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
    assert "Build the NVIDIA module for every bootable kernel (6.18.98-gpubox-update)" in (
        " ".join(run.changed_names)
    )
    checks = demo.checks(extra=("-m", "quick"))
    assert checks.rc == 0 and checks.failed == 0, checks.output[-3000:]
    assert demo.deploy().no_change


def test_a_missing_gpu_is_detected_and_named():
    plant(lambda s: standin_state.set_gpu_present(s, 1, False))
    try:
        failed = failed_checks(demo.checks(extra=("-m", "gpu")))
        assert "nvidia-smi lists 1 GPU(s), expected 2 Tesla V100-SXM2-32GB" in failed["gpu.listed"]
        assert "topo -m shows 1 GPU(s), expected 2" in failed["nvlink.topology"]
        assert "GPU 1 reports no NVLink links" in failed["nvlink.links"]
    finally:
        plant(lambda s: standin_state.set_gpu_present(s, 1, True))


def test_an_nvlink_link_down_is_detected_and_named():
    plant(lambda s: standin_state.set_link_active(s, 0, 2, False))
    try:
        failed = failed_checks(demo.checks(extra=("-m", "gpu")))
        message = failed["nvlink.links"]
        assert "GPU 0: 1 NVLink link(s) active, expected 2 (active: 0; inactive: 1, 2," in message
        assert "GPU 1: 1 NVLink link(s) active, expected 2 (active: 1; inactive: 0, 2," in message
        # the pair is still joined by its other link (NV1): only the link check fails
        assert set(failed) == {"nvlink.links"}
    finally:
        plant(lambda s: standin_state.set_link_active(s, 0, 2, True))
    checks = demo.checks(extra=("-m", "gpu"))
    assert checks.rc == 0, checks.output[-3000:]


# Containers, monitoring and burn-in (issue 3): faults, each caught by its own check; what is
# configuration is repaired by a re-deploy.

DAEMON_JSON = "/etc/docker/daemon.json"


def test_runtime_removed_from_daemon_json_is_caught_and_restored_keeping_other_keys():
    box_sh(f'echo \'{{"log-level": "warn"}}\' > {DAEMON_JSON} && systemctl restart docker')
    failed = failed_checks(demo.checks(extra=("-k", "docker or daemon")))
    assert "has no nvidia runtime" in failed["docker.daemon-json"]
    assert "Docker has no nvidia runtime" in failed["docker.runtime"]
    run = demo.deploy()
    assert run.rc == 0 and run.changed >= 1, run.output[-3000:]
    assert json.loads(box_sh(f"cat {DAEMON_JSON}"))["log-level"] == "warn"
    checks = demo.checks()
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]


def test_stopped_dcgm_is_caught_and_restarted():
    box_sh("systemctl stop nvidia-dcgm")
    failed = failed_checks(demo.checks(extra=("-k", "dcgm")))
    assert "nvidia-dcgm is inactive" in failed["dcgm.service"]
    assert "dcgm.discovery" in failed
    run = demo.deploy()
    assert run.rc == 0, run.output[-3000:]
    checks = demo.checks(extra=("-k", "dcgm"))
    assert checks.rc == 0 and checks.failed == 0, checks.output[-4000:]


def test_invalid_daemon_json_stops_the_deploy_and_is_not_replaced():
    broken = '{"log-level": "warn",'
    box_sh(f"printf '%s' '{broken}' > {DAEMON_JSON}")
    run = demo.deploy()
    assert run.rc != 0 or run.failed_hosts
    assert "daemon.json is not valid JSON" in run.output
    assert "will not replace it" in run.output
    assert box_sh(f"cat {DAEMON_JSON}") == broken
    box_sh(f'echo \'{{"log-level": "warn"}}\' > {DAEMON_JSON}')
    run = demo.deploy()
    assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]


def test_burnin_fails_naming_a_faulty_gpu_then_passes(tmp_path):
    # The same box, with burnin_required set: the host check reads the burn-in record.
    required = tmp_path / "sandbox_burnin_required.py"
    required.write_text(
        "import runpy\n"
        f"hosts = runpy.run_path({str(demo.ROOT / demo.INVENTORY)!r})['hosts']\n"
        "hosts = [(name, {**data, 'burnin_required': True}) for name, data in hosts]\n"
    )
    plant(lambda s: standin_state.set_gpu_burn_faulty(s, 1, True))
    try:
        failed = demo.burnin()
        assert failed.rc != 0
        assert "burn-in failed" in failed.output and "GPU 1: gpu-burn says FAULTY" in failed.output
        record = json.loads(box_sh("cat /var/lib/gpubox/burnin.json"))
        assert record["passed"] is False and record["gpu_burn"]["gpus"]["1"] == "FAULTY"
        check = failed_checks(demo.checks(inventory=str(required), extra=("-k", "burnin")))
        assert "the last burn-in failed" in check["burnin.record"]
    finally:
        plant(lambda s: standin_state.set_gpu_burn_faulty(s, 1, False))
    passed = demo.burnin()
    assert passed.rc == 0, passed.output[-3000:]
    record = json.loads(box_sh("cat /var/lib/gpubox/burnin.json"))
    assert record["passed"] is True and set(record["gpu_burn"]["gpus"].values()) == {"OK"}
    checks = demo.checks(inventory=str(required), extra=("-k", "burnin"))
    assert checks.rc == 0 and checks.passed == 1, checks.output[-3000:]


# The inference backend (issue 4): llama.cpp built in the box, serving the tiny model.

LLAMA = "gpubox-llama-server"


def invocation() -> str:
    return box_sh(f"systemctl show -p InvocationID --value {LLAMA}").strip()


def test_the_api_serves_the_tiny_models_reply_and_reports_its_speed():
    info = demo.box_info()
    key = box_sh("cat /etc/gpubox/api-key").strip()
    body = json.dumps(
        {
            "model": "qwen3-next",
            "max_tokens": 32,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Hi"}],
        }
    )
    out = box_sh(
        f"curl -sS -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' "
        f"-d '{body}' http://127.0.0.1:8080/v1/chat/completions"
    )
    events = [json.loads(line[6:]) for line in out.splitlines() if line.startswith("data: {")]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))
    assert text == info["model_reply"], out[-1000:]
    timings = [e["timings"] for e in events if "timings" in e][-1]
    print(
        f"\ntiny model decode: {timings['predicted_per_second']:.0f} tokens/s "
        f"({timings['predicted_n']} tokens)"
    )
    assert timings["predicted_n"] >= 1


def test_llama_cpp_is_the_catalogs_source_with_cuda_graphs_on_volta_and_full_slots():
    """The box built the catalog's pinned llama.cpp (the sandbox served the same sdist bytes
    under a mirror URL): the source check found CUDA graphs on from 7.0, llama-bench was built
    beside llama-server, --version shows the catalog's commit, and each slot has the whole
    model_ctx of its own (-c model_ctx x model_parallel, no unified KV cache)."""
    config = load_host_config("b", {"llamacpp_cuda": False})
    llama = config.catalog["llamacpp"]
    d = f"{llama['prefix']}/{llama['tag']}"
    graphs = box_sh(f"head -n 2 {d}/build.log")
    print(f"\n{graphs.strip()}")
    assert "disables CUDA graphs for cc < GGML_CUDA_CC_VOLTA" in graphs
    assert "CUDA graphs on from compute capability 7.0 (Volta) up" in graphs
    assert "bin/llama-bench" in box_sh(f"cat {d}/BUILD-FILES")
    assert box_sh(f"{d}/bin/llama-bench --help >/dev/null 2>&1 && echo ok").strip() == "ok"
    version = box_sh(f"{d}/bin/llama-server --version 2>&1")
    print(version.strip().splitlines()[0])
    assert f"(build {llama['build_number']}, commit {llama['commit'][:7]})" in version
    unit = box_sh(f"systemctl show -p ExecStart --value {LLAMA}")
    assert " -c 4096 -np 2 -no-kvu " in unit and " -sm layer " in unit
    key = box_sh("cat /etc/gpubox/api-key").strip()
    props = json.loads(
        box_sh(f"curl -sS -H 'Authorization: Bearer {key}' http://127.0.0.1:8080/props")
    )
    print(
        f"/props: n_ctx {props['default_generation_settings']['n_ctx']}, "
        f"total_slots {props['total_slots']}"
    )
    # the sandbox inventory's model_ctx 2048 and model_parallel 2: each slot holds 2048
    assert props["default_generation_settings"]["n_ctx"] == 2048
    assert props["total_slots"] == 2
    # build time, from the extracted tree to the marker (configure and build; printed only)
    took = box_sh(f"echo $(( $(stat -c %Y {d}/BUILD-INFO.json) - $(stat -c %Y {d}/src) ))")
    print(f"[sandbox timing] llama.cpp configure + build: {took.strip()} s")


def test_a_changed_flag_restarts_the_service_once():
    before = invocation()
    changed = demo.deploy(extra=("--data", "model_parallel=3"))
    assert changed.rc == 0 and changed.changed >= 1, changed.output[-3000:]
    after = invocation()
    assert after != before
    assert "-np 3" in box_sh(f"systemctl show -p ExecStart --value {LLAMA}")
    again = demo.deploy(extra=("--data", "model_parallel=3"))
    assert again.no_change, again.changed_names
    assert invocation() == after
    restored = demo.deploy()
    assert restored.rc == 0 and invocation() != after
    checks = demo.checks(extra=("-k", "backend"))
    assert checks.rc == 0 and checks.failed == 0, checks.output[-3000:]


def exporter_metrics(want: str) -> str:
    """The exporter's /metrics on the box once it carries ``want`` (it starts in a second)."""
    text = ""
    for _ in range(60):
        text = box_sh("curl -fsS --max-time 2 http://127.0.0.1:9400/metrics", check=False)
        if want in text:
            return text
        time.sleep(0.5)
    raise AssertionError(f"/metrics never showed {want}:\n{text[-1500:]}")


def test_dcgm_exporter_labels_its_metrics_with_the_boxs_hostname(tmp_path):
    # The DCGM stage alone, with dcgm_exporter on; the exporter is the sandbox's stand-in image
    # (the catalog's exporter_image overridden by inventories/sandbox.py, as a mirror would).
    started = time.monotonic()
    inventory = tmp_path / "sandbox_exporter.py"
    inventory.write_text(
        "import runpy\n"
        f"hosts = runpy.run_path({str(demo.ROOT / demo.INVENTORY)!r})['hosts']\n"
        "hosts = [(name, {**data, 'dcgm_exporter': True}) for name, data in hosts]\n"
    )
    unit, dropin = DCGM_EXPORTER_UNIT_FILE, f"{DCGM_EXPORTER_UNIT_FILE}.d/gpubox-test.conf"
    image = sandbox.load_exporter_image()
    try:
        run = demo.deploy("deploy/dcgm.py", inventory=str(inventory))
        assert run.rc == 0 and not run.failed_hosts, run.output[-3000:]
        hostname = box_sh("hostname").strip()
        text = exporter_metrics(f'Hostname="{hostname}"')
        assert set(exporter_label.hostname_labels(text)) == {hostname}
        checks = demo.checks(inventory=str(inventory), extra=("-k", "exporter"))
        assert checks.rc == 0 and checks.failed == 0 and checks.passed == 2, checks.output[-3000:]
        again = demo.deploy("deploy/dcgm.py", inventory=str(inventory))
        assert again.no_change, f"changed: {again.changed_names}\n{again.output[-2000:]}"
        # The unit as it was before: the engine named 127.0.0.1, so is every metric.
        before = (
            f"/usr/bin/docker run --rm --name {DCGM_EXPORTER} --pull never --network host "
            f"--gpus all {image} --address 127.0.0.1:9400 --remote-hostengine-info 127.0.0.1:5555"
        )
        box_sh(
            f"mkdir -p {unit}.d && printf '[Service]\\nExecStart=\\nExecStart=%s\\n' "
            f"'{before}' > {dropin} && systemctl daemon-reload && systemctl restart {DCGM_EXPORTER}"
        )
        exporter_metrics('Hostname="127.0.0.1"')
        failed = failed_checks(demo.checks(inventory=str(inventory), extra=("-k", "exporter")))
        assert list(failed) == ["dcgm.exporter-hostname"], failed
        assert 'Hostname="127.0.0.1"' in failed["dcgm.exporter-hostname"]
        assert f'not this box\'s name "{hostname}"' in failed["dcgm.exporter-hostname"]
    finally:  # the box as the tests before left it: no exporter, no image
        box_sh(
            f"rm -f {dropin}; rmdir {unit}.d 2>/dev/null; systemctl disable --now {DCGM_EXPORTER}; "
            f"rm -f {unit}; systemctl daemon-reload; docker rmi {image} >/dev/null",
            check=False,
        )
    print(f"[sandbox timing] dcgm-exporter hostname test: {time.monotonic() - started:.1f} s")
