"""The sandbox box end to end: up, SSH, systemd, the stand-in NVIDIA repositories, a real
reboot, Docker with the stand-in container toolkit, DCGM, the gpu-burn tarball, the 1Panel
package, llama.cpp's source tarball, the tiny model and the compiler cache, and a down that
leaves nothing behind.

The tests run in file order against one box. The first run on a machine builds the root
filesystem (about 75 s on 2 cores) and fetches llama-cpp-python's sdist (the catalog's
llama.cpp source) from PyPI (about a minute); after that `up` takes a few seconds. Timings are
printed (run with -s to see them), never asserted.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import panel_record
import pytest

import gpubox
from gpubox import catalog, sandbox
from gpubox.sandbox import box, cli, onepanel, processes

pytestmark = pytest.mark.integration

DRIVER = "570.211.01"
TEMPTATION = "580.105.08"
NEWER_580 = "580.900.01"  # gpubox.sandbox.repo_driver.NEWER_580
KEYRING = "/usr/share/keyrings/gpubox-test-nvidia-cuda.gpg"
TOOLKIT_KEYRING = "/usr/share/keyrings/gpubox-test-nvidia-container-toolkit.gpg"
TOOLKIT = "1.17.8-1"
TOOLKIT_TEMPTATION = "1.18.0-1"
DCGM = "1:4.4.1-1"
DCGM_TEMPTATION = "1:4.5.0-1"


def _timing(what: str, seconds: float) -> None:
    print(f"\n[sandbox timing] {what}: {seconds:.2f} s")


@pytest.fixture(scope="module")
def info() -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root (debootstrap, systemd-nspawn, ip netns)")
    box.check_host()  # a missing host package is an error naming it, not a skip
    if os.path.exists(sandbox.current().netns_path) or processes.read_state(sandbox.state_dir()):
        sandbox.down()  # start from a known state: this module tests up and down themselves
    started = time.monotonic()
    facts = sandbox.up()
    _timing("up", time.monotonic() - started)
    yield facts
    if processes.read_state(sandbox.state_dir()) is not None:  # a test failed before test_down
        sandbox.down()


def test_ssh_reaches_the_box(info: dict[str, Any]) -> None:
    assert sandbox.ssh("hostname", info=info).stdout.strip() == sandbox.current().name
    assert cli.main(["ssh", "--", "exit 3"]) == 3  # the exit status is passed through


def test_systemd_is_running(info: dict[str, Any]) -> None:
    result = sandbox.ssh("systemctl is-system-running", check=False, info=info)
    assert result.stdout.strip() == "running", sandbox.ssh("systemctl --failed", info=info).stdout


def test_box_json_holds_the_connection_facts(info: dict[str, Any]) -> None:
    assert sandbox.box_info() == info
    assert info["ssh_hostname"] == "127.0.0.1"
    assert info["ssh_user"] == "root"
    assert Path(info["ssh_key"]).exists()
    assert Path(info["ssh_known_hosts_file"]).exists()
    assert f"Host {info['ssh_host_alias']}" in Path(info["ssh_config"]).read_text()
    assert info["repo_url"] == "http://127.0.0.1:8765/nvidia/{distro}/x86_64/"
    assert info["key_url"] == info["repo_url"] + "cuda-archive-keyring.gpg"
    assert len(info["key_fingerprint"]) == 40


def test_exec_runs_host_commands_where_the_box_is_127_0_0_1(info: dict[str, Any]) -> None:
    # how pyinfra and testinfra reach the box: from inside its network namespace
    ssh = ["ssh", "-F", info["ssh_config"], info["ssh_host_alias"], "hostname"]
    result = subprocess.run(
        [sys.executable, "-m", "gpubox.sandbox.cli", "exec", "--", *ssh],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(Path(gpubox.__file__).parents[1])),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == sandbox.current().name


def test_stand_in_repository_and_debian_mirror(info: dict[str, Any]) -> None:
    url = info["repo_url"].format(distro=info["repo_distro"])
    key_url = info["key_url"].format(distro=info["repo_distro"])
    script = f"""set -e
        curl -fsS -o {KEYRING} {key_url}
        gpg --show-keys --with-colons {KEYRING} | grep '^fpr' | head -1 | cut -d: -f10
        echo "deb [signed-by={KEYRING}] {url} /" > /etc/apt/sources.list.d/gpubox-test.list
        sed -i 's/^Components: main$/& contrib/' /etc/apt/sources.list.d/debian.sources
        apt-get update --error-on=any -qq
        apt-cache policy nvidia-driver-cuda cuda-drivers
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nvtop >/dev/null
        nvtop --version
    """
    started = time.monotonic()
    out = sandbox.ssh(script, info=info).stdout
    _timing("apt-get update + nvtop install", time.monotonic() - started)
    assert out.splitlines()[0] == info["key_fingerprint"]
    policy = out.split("cuda-drivers:")[0]
    assert f"{DRIVER}-1" in policy and f"{TEMPTATION}-1" in policy  # both branches served
    assert f"{NEWER_580}-1" in policy  # and the newer 580 build, the candidate
    assert f"Candidate: {NEWER_580}-1" in out.split("cuda-drivers:")[1]  # the trap follows it
    assert "nvtop version 3." in out  # Debian contrib, through the bridged mirror


def test_a_withdrawn_driver_build_leaves_the_index_at_the_next_update(
    info: dict[str, Any],
) -> None:
    """gpubox sandbox repo withdraw / restore, seen by apt-get update in the box."""
    url = info["repo_url"].format(distro=info["repo_distro"])
    key_url = info["key_url"].format(distro=info["repo_distro"])
    sandbox.ssh(
        f"curl -fsS -o {KEYRING} {key_url} && echo 'deb [signed-by={KEYRING}] {url} /' > "
        "/etc/apt/sources.list.d/gpubox-test.list",
        info=info,
    )

    def offered() -> set[str]:
        out = sandbox.ssh(
            "apt-get update --error-on=any -qq && apt-cache madison nvidia-driver-cuda", info=info
        ).stdout
        return {line.split("|")[1].strip() for line in out.splitlines()}

    every = {f"{DRIVER}-1", f"{TEMPTATION}-1", f"{NEWER_580}-1"}
    assert offered() == every
    started = time.monotonic()
    assert cli.main(["repo", "withdraw", DRIVER]) == 0
    try:
        _timing("repo withdraw", time.monotonic() - started)
        assert offered() == every - {f"{DRIVER}-1"}
        assert cli.main(["repo", "withdraw", "535.309.01"]) == 1  # not served: refused
    finally:
        assert cli.main(["repo", "restore"]) == 0
    assert offered() == every


def test_hardware_stand_ins_and_faults(info: dict[str, Any]) -> None:
    def nvidia_slots() -> list[str]:
        out = sandbox.ssh("lspci -D -d 10de:", info=info).stdout
        return [line.split()[0] for line in out.splitlines()]

    assert {"0000:07:00.0", "0000:08:00.0", "0000:09:00.0"} <= set(nvidia_slots())
    sandbox.plant_fault("gpu-missing", gpu=1, info=info)
    try:
        assert "0000:08:00.0" not in nvidia_slots()
    finally:
        sandbox.clear_faults(info=info)
    assert "0000:08:00.0" in nvidia_slots()


def test_a_new_driver_loads_after_a_real_reboot(info: dict[str, Any]) -> None:
    # as the driver stage installs them: the roots at name=version under a pin that holds every
    # package of the build at that version (the (= version) dependencies alone do not make apt
    # leave the newer candidate, 580), with Debian's legacy-GPU check answered (the box's GT 710)
    from gpubox.sandbox import debian_real, repo_build, repo_tools

    names = catalog.load()["driver"]["packages"]["debian"]
    pkgs = " ".join(f"{p}={DRIVER}-1" for p in names["common"] + names["proprietary"])
    pin = repo_build.driver_pin(repo_tools.all_packages(real=debian_real.ensure()), f"{DRIVER}-1")
    sandbox.ssh(
        "cat > /etc/apt/preferences.d/90-test-driver && echo 'nvidia-legacy-check "
        "nvidia-driver/check-for-unsupported-gpu boolean false' | debconf-set-selections && "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        f"{pkgs} >/dev/null",
        input=pin,
        info=info,
    )
    before = sandbox.ssh("nvidia-smi", check=False, info=info)
    assert before.returncode == 9, before.stdout  # installed, not loaded: no driver to talk to
    boot_id = sandbox.ssh("cat /proc/sys/kernel/random/boot_id", info=info).stdout.strip()
    first_nspawn = processes.nspawn_record(Path(info["state_dir"]))

    started = time.monotonic()
    sandbox.ssh("systemctl reboot", check=False, info=info)  # the connection may drop: 255
    assert sandbox.wait_ready(info=info, since_boot_id=boot_id) == "running"
    _timing("reboot (systemctl reboot -> running)", time.monotonic() - started)

    after = sandbox.ssh("cat /proc/sys/kernel/random/boot_id; nvidia-smi -L", info=info).stdout
    assert after.split()[0] != boot_id
    assert after.count("Tesla V100-SXM2-32GB") == 2
    assert processes.nspawn_record(Path(info["state_dir"])) != first_nspawn  # a new nspawn
    assert processes.alive(info["processes"]["supervisor"])  # under the same supervisor


def test_container_toolkit_repository(info: dict[str, Any]) -> None:
    # as NVIDIA's install guide sets it up: an ASCII-armored key, dearmored into a keyring, and
    # a flat source whose "$(ARCH)" apt expands
    assert info["toolkit_repo_url"].endswith("/libnvidia-container/stable/deb/$(ARCH)")
    assert info["toolkit_key_fingerprint"] != info["key_fingerprint"]  # a key of its own
    script = f"""set -e
        curl -fsS {info["toolkit_key_url"]} | gpg --dearmor > {TOOLKIT_KEYRING}
        gpg --show-keys --with-colons {TOOLKIT_KEYRING} | grep '^fpr' | head -1 | cut -d: -f10
        echo 'deb [signed-by={TOOLKIT_KEYRING}] {info["toolkit_repo_url"]} /' \
            > /etc/apt/sources.list.d/gpubox-test-nvidia-container-toolkit.list
        apt-get update --error-on=any -qq
        apt-cache policy nvidia-container-toolkit
        apt-cache show nvidia-container-toolkit={TOOLKIT} libnvidia-container-tools={TOOLKIT} \
            | grep ^Depends
    """
    out = sandbox.ssh(script, info=info).stdout
    assert out.splitlines()[0] == info["toolkit_key_fingerprint"]
    assert f"{TOOLKIT} 500" in out and f"{TOOLKIT_TEMPTATION} 500" in out  # both versions
    assert "/libnvidia-container/stable/deb/amd64" in out  # $(ARCH) expanded
    # NVIDIA's dependency shape: only -base is tied to the version, so the four packages must
    # each be installed at name=version, or the tools move to the newer release
    assert (
        f"Depends: nvidia-container-toolkit-base (= {TOOLKIT}), "
        f"libnvidia-container-tools (>= {TOOLKIT})" in out
    )
    assert f"Depends: libnvidia-container1 (>= {TOOLKIT})" in out


def test_docker_runs_containers_that_see_the_stand_in_gpus(info: dict[str, Any]) -> None:
    packages = " ".join(
        f"{p}={TOOLKIT}"
        for p in catalog.load()["container_toolkit"]["packages"]  # all four, at one version
    )
    started = time.monotonic()
    sandbox.ssh(
        f"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io {packages} >/dev/null",
        timeout=600,
        info=info,
    )
    _timing("apt-get install docker.io + the container toolkit", time.monotonic() - started)
    assert sandbox.ssh("systemctl is-active docker", info=info).stdout.strip() == "active"
    assert "version 1.17.8" in sandbox.ssh("nvidia-ctk --version", info=info).stdout

    # nvidia-ctk runtime configure: keeps what else the file holds, and is idempotent
    configure = "nvidia-ctk runtime configure --runtime=docker"
    daemon_json = sandbox.ssh(
        f"""set -e
        printf '{{"log-opts": {{"max-size": "10m"}}}}' > /etc/docker/daemon.json
        {configure} 2>/dev/null; sha256sum < /etc/docker/daemon.json
        {configure} 2>/dev/null; sha256sum < /etc/docker/daemon.json
        cat /etc/docker/daemon.json""",
        info=info,
    ).stdout.splitlines()
    assert daemon_json[0] == daemon_json[1]  # the second run changed nothing
    assert json.loads("\n".join(daemon_json[2:])) == {
        "log-opts": {"max-size": "10m"},
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    }
    refused = sandbox.ssh(
        f"echo '{{broken' > /tmp/bad.json; {configure} --config=/tmp/bad.json; "
        "echo rc=$?; cat /tmp/bad.json",
        info=info,
    )
    assert "rc=1" in refused.stdout and "{broken" in refused.stdout  # left as it was

    # dockerd finds the hook (and so `--gpus`) and the runtime only when it starts
    sandbox.ssh("systemctl restart docker", info=info)
    started = time.monotonic()
    image = sandbox.load_check_image(info=info)
    _timing("check image built and imported", time.monotonic() - started)
    started = time.monotonic()
    assert sandbox.load_check_image(info=info) == image == info["check_image"]
    _timing("check image, already there", time.monotonic() - started)

    def gpus_listed(options: str) -> list[str]:
        out = sandbox.ssh(f"docker run --rm {options} {image} nvidia-smi -L", info=info).stdout
        return [line for line in out.splitlines() if line.startswith("GPU ")]

    started = time.monotonic()
    assert len(gpus_listed("--gpus all")) == 2  # Docker's own hook path (default runtime runc)
    _timing("docker run --gpus all nvidia-smi -L", time.monotonic() - started)
    one = gpus_listed("--runtime nvidia -e NVIDIA_VISIBLE_DEVICES=0")
    assert len(one) == 1 and "GPU-dae76d0e-3414-958a-8f3e-fc6682b36f31" in one[0]
    second = gpus_listed("--gpus device=1")
    assert len(second) == 1 and second[0].startswith("GPU 0:")  # renumbered, as on real boxes
    without = sandbox.ssh(f"docker run --rm {image} nvidia-smi -L", check=False, info=info)
    assert without.returncode == 127  # no GPU asked for: no nvidia-smi in the container
    # Debian's docker.io 20.10 has no CDI: a CDI device name is taken for a device path
    cdi = sandbox.ssh(
        f"docker run --rm --device nvidia.com/gpu=all {image} true", check=False, info=info
    )
    assert cdi.returncode == 125 and "not an absolute path" in cdi.stderr


def test_dcgm_packages_and_service(info: dict[str, Any]) -> None:
    names = catalog.load()["dcgm"]["packages"]
    policy = sandbox.ssh(f"apt-cache policy {names[0]}", info=info).stdout
    assert f"{DCGM} 500" in policy and f"{DCGM_TEMPTATION} 500" in policy
    started = time.monotonic()
    sandbox.ssh(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        + " ".join(f"{p}={DCGM}" for p in names)
        + " >/dev/null",
        info=info,
    )
    _timing("apt-get install the four DCGM packages", time.monotonic() - started)
    # like NVIDIA's package, the install leaves the unit disabled: the install guide enables it
    state = sandbox.ssh("systemctl is-enabled nvidia-dcgm", check=False, info=info).stdout
    assert state.strip() == "disabled"
    sandbox.ssh("systemctl enable --now nvidia-dcgm", info=info)
    out = sandbox.ssh(
        "systemctl is-active nvidia-dcgm; id -un nvidia-dcgm; "
        "systemctl show -p ExecStart --value nvidia-dcgm; "
        "ls /usr/bin/dcgmi /usr/lib/x86_64-linux-gnu/libdcgmmoduleprofiling.so.4",
        info=info,
    ).stdout
    assert out.splitlines()[:2] == ["active", "nvidia-dcgm"]
    assert "argv[]=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm" in out
    discovery = sandbox.ssh("dcgmi discovery -l", info=info).stdout  # the packaged stand-ins
    assert discovery.startswith("2 GPUs found.")


def test_gpu_burn_tarball(info: dict[str, Any]) -> None:
    commit = info["gpu_burn_commit"]
    assert len(commit) == 40 and int(commit, 16) >= 0
    url = info["gpu_burn_url"].format(commit=commit)
    out = sandbox.ssh(
        f"curl -fsS -o /tmp/gpu-burn.tar.gz {url} && sha256sum < /tmp/gpu-burn.tar.gz "
        "&& tar tzf /tmp/gpu-burn.tar.gz | head -1",
        info=info,
    ).stdout.split()
    assert out[0] == info["gpu_burn_sha256"]
    assert out[2] == f"gpu-burn-{commit}/"  # GitHub's archive layout
    served = Path(info["repo_root"]) / "github/wilicc/gpu-burn/archive" / f"{commit}.tar.gz"
    assert hashlib.sha256(served.read_bytes()).hexdigest() == info["gpu_burn_sha256"]


def test_1panel_package_is_served(info: dict[str, Any]) -> None:
    """The stand-in 1Panel package at the real URL's path shape, its goreleaser checksums.txt
    and latest file (onepanel.py), and the box's python3 has sqlite3 for the stand-in core."""
    version, arch = info["panel_version"], info["panel_arch"]
    url = info["panel_url"].format(version=version, arch=arch)
    name = f"1panel-{version}-linux-{arch}.tar.gz"
    assert url.endswith(f"/1panel/v2/stable/{version}/release/{name}")
    out = sandbox.ssh(
        f"cd /tmp && curl -fsS -o {name} {url} && sha256sum {name} "
        f"&& curl -fsS {info['panel_checksums_url']} && curl -fsS {info['panel_latest_url']} "
        f"&& echo && tar tzf {name} | head -1 && python3 -c 'import sqlite3' && echo sqlite3",
        info=info,
    ).stdout.splitlines()
    assert out[0] == f"{info['panel_sha256']}  {name}"
    assert out[1] == out[0]  # checksums.txt: sha256sum's own format
    assert out[2:] == [version, f"1panel-{version}-linux-{arch}/", "sqlite3"]


# What 1Panel's install.sh (Init_Panel, Check_Ready) does with the package, in shell, so that
# the stand-ins are seen running under the box's systemd and tests/panel_record.py is seen
# accepting such a box. A test's own layout, not gpubox's stage.
PANEL_LAYOUT = r"""
set -e
PW='Pw_t3st_only'
cd /tmp && rm -rf 1panel-* && curl -fsS -o p.tgz "$URL" && tar xzf p.tgz && cd 1panel-*/
install -m 755 1panel-core 1panel-agent 1pctl /usr/local/bin/
ln -sf /usr/local/bin/1panel-core /usr/bin/1panel
for n in 1panel-core 1panel-agent 1pctl; do
    [ -e /usr/bin/$n ] || ln -s /usr/local/bin/$n /usr/bin/$n
done
set_ctl() {  # KEY VALUE, with builtins only (no value on a command line)
    mapfile -t L </usr/local/bin/1pctl
    for i in "${!L[@]}"; do [[ "${L[$i]}" == "$1="* ]] && L[$i]="$1=$2"; done
    printf '%s\n' "${L[@]}" >/usr/local/bin/1pctl
}
set_ctl BASE_DIR /opt; set_ctl ORIGINAL_PORT "$PORT"; set_ctl ORIGINAL_USERNAME box_admin
set_ctl ORIGINAL_PASSWORD "$PW"; set_ctl ORIGINAL_ENTRANCE "$ENTRANCE"; set_ctl PANEL_EDITION intl
mkdir -p /opt/1panel/geo /opt/1panel/resource && cp GeoIP.mmdb /opt/1panel/geo/
cp -r lang /usr/local/bin/ && cp initscript/1panel-core.service initscript/1panel-agent.service \
    /etc/systemd/system/
systemctl daemon-reload && systemctl enable -q 1panel-core 1panel-agent
systemctl start 1panel-core 1panel-agent && cp -r initscript /opt/1panel/resource/
for i in $(seq 50); do curl -fsS -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.2; done
for i in $(seq 50); do [ -S /etc/1panel/agent.sock ] && break; sleep 0.2; done
set_ctl ORIGINAL_PASSWORD '**********'
rm -rf /tmp/1panel-* /tmp/p.tgz
"""


def test_1panel_standins_run_as_services(info: dict[str, Any]) -> None:
    url = info["panel_url"].format(version=info["panel_version"], arch=info["panel_arch"])
    env = f"URL={url} PORT=20410 ENTRANCE=s3cretway\n"
    sandbox.ssh(["bash", "-s"], info=info, input=env + PANEL_LAYOUT, timeout=120)
    pages = sandbox.ssh(
        "curl -fsS http://127.0.0.1:20410/s3cretway; curl -fsS http://127.0.0.1:20410/",
        info=info,
    ).stdout
    assert pages.count("<title>loading...</title>") == 1
    assert pages.count("<pre>1pctl user-info</pre>") == 1  # the wrong path's page, once
    out = sandbox.ssh("1pctl version; echo 20411 | 1pctl update port", info=info).stdout
    assert out.startswith("version: v2.3.2\nmode: stable\n") and "Panel Port: 20411" in out
    again = sandbox.ssh(
        "for i in $(seq 50); do curl -fsS http://127.0.0.1:20411/s3cretway && break; sleep 0.2;"
        " done",
        info=info,
    )
    assert "first-loading-wrap" in again.stdout

    def run(script: str) -> str:
        return sandbox.ssh(["bash", "-s"], info=info, input=script, timeout=120).stdout

    problems = panel_record.check(run, "/opt", "v2.3.2", password="Pw_t3st_only", services=True)
    assert problems == []
    ran = sandbox.ssh(f"test -e {onepanel.INSTALL_SH_RAN}", check=False, info=info)
    assert ran.returncode == 1  # install.sh never ran


def test_llamacpp_source_and_tiny_model_are_served(info: dict[str, Any]) -> None:
    # The catalog's llama.cpp source, PyPI's sdist byte for byte, at a path that mirrors
    # files.pythonhosted.org (no build here: the deploy's integration test builds it)
    llama = catalog.load()["llamacpp"]
    pypi_path = urllib.parse.urlparse(llama["url"]).path
    assert info["llamacpp_url"] == f"http://127.0.0.1:8765/pypi{pypi_path}"
    assert not {"llamacpp_sha256", "llamacpp_tag", "llamacpp_commit"} & set(info)
    started = time.monotonic()
    out = sandbox.ssh(
        f"""set -e
        curl -fsS -o /tmp/llama.cpp.tar.gz {info["llamacpp_url"]}
        sha256sum < /tmp/llama.cpp.tar.gz | cut -d' ' -f1
        tar -tzf /tmp/llama.cpp.tar.gz > /tmp/llama.cpp.list
        grep -c '^{llama["tree"]}/tools/server/server-context.cpp$' /tmp/llama.cpp.list
        rm /tmp/llama.cpp.tar.gz /tmp/llama.cpp.list""",
        info=info,
    ).stdout.split()
    _timing("llama.cpp sdist downloaded and listed", time.monotonic() - started)
    assert out == [llama["sha256"], "1"]

    # the tiny model, whole and in a byte range (a resumed download)
    assert info["model_url"].endswith("/models/gpubox-tiny.gguf")
    assert info["model_file"] == "gpubox-tiny.gguf"
    out = sandbox.ssh(
        f"""set -e
        curl -fsS -o /tmp/tiny.gguf {info["model_url"]}
        sha256sum < /tmp/tiny.gguf | cut -d' ' -f1; stat -c %s /tmp/tiny.gguf
        head -c 1000 /tmp/tiny.gguf > /tmp/part.gguf
        curl -fsS -C - -o /tmp/part.gguf {info["model_url"]}
        sha256sum < /tmp/part.gguf | cut -d' ' -f1
        curl -fsS -r 0-3 {info["model_url"]}; echo
        rm /tmp/tiny.gguf /tmp/part.gguf""",
        info=info,
    ).stdout.split()
    assert out == [info["model_sha256"], str(info["model_size"]), info["model_sha256"], "GGUF"]

    # the compiler cache is the host's directory, bind-mounted into the box
    assert info["ccache_dir"] == sandbox.CCACHE_DIR == "/var/cache/gpubox-ccache"
    marker = f"gpubox-test-{os.getpid()}"
    sandbox.ssh(f"touch {info['ccache_dir']}/{marker}", info=info)
    host_marker = Path(info["ccache_host_dir"]) / marker
    assert host_marker.exists()
    host_marker.unlink()


def test_down_leaves_nothing_behind(info: dict[str, Any]) -> None:
    records = dict(info["processes"])
    records["nspawn_now"] = processes.nspawn_record(Path(info["state_dir"]))
    rootfs = Path(info["rootfs"])
    namespace = processes.box_pid_namespace(records["nspawn_now"])
    assert processes.processes_in_namespace(namespace)  # the box's processes, seen from the host

    started = time.monotonic()
    report = sandbox.down()
    _timing("down", time.monotonic() - started)

    assert report["was_up"]
    assert [name for name, rec in records.items() if processes.alive(rec)] == []
    assert report["pid_namespace"] == namespace
    assert processes.processes_in_namespace(namespace) == []
    assert processes.mounts_under(rootfs) == []
    assert not os.path.exists(sandbox.current().netns_path)
    assert not (Path(info["state_dir"]) / "mirror.sock").exists()
    with pytest.raises(sandbox.SandboxNotUp, match="sandbox is not up: run gpubox sandbox up"):
        sandbox.box_info()
