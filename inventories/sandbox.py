"""The local sandbox boxes (gpubox sandbox up [--boxes N]): Debian 12 systemd hosts in
systemd-nspawn with stand-in GPUs, installing from a stand-in NVIDIA repository served on
loopback. Every box that is up is a host here.

Everything that differs from a real box is data here: the connection, and the catalog URLs
and key fingerprint pointed at the stand-in repository, through the same catalog_overrides
key a user would use for a mirror."""

from gpubox.sandbox import EXPORTER_IMAGE, box_info, box_infos


def box_data(info):
    """The reference box's data, for the box ``info`` describes."""
    return {
        "ssh_hostname": info["ssh_hostname"],
        "ssh_port": info["ssh_port"],
        "ssh_user": info["ssh_user"],
        "ssh_key": info["ssh_key"],
        "ssh_known_hosts_file": info["ssh_known_hosts_file"],
        "ssh_strict_host_key_checking": "no",
        "gpu_model": "Tesla V100-SXM2-32GB",
        "gpu_count": 2,
        "nvlink": True,
        "nvlink_links": 2,
        "driver_branch": "570",
        "cuda_version": "12.8",
        # The box shares the host's kernel, whose headers are not in Debian's archive (the
        # deploy skips them with a warning, issue 29 D12: test_deploy's second deploy sets the
        # key true to show it; a first deploy finds no apt lists on the fresh box and would ask
        # for them); off here.
        "driver_kernel_headers": False,
        "reboot_timeout": 120,
        # Debian's real docker.io (Docker's own repository is not reachable from here).
        "docker_source": "distro",
        # Imported into the box's Docker from a local root filesystem, never pulled.
        "docker_check_image": info["check_image"],
        "burnin_seconds": 3,
        # llama.cpp built for real in the box, for its CPU (no GPU there), through a
        # compiler cache the sandbox keeps across boxes: the host's cache, bind-mounted at
        # this path in every box (not the default under model_dir, which dies with the box).
        "backend": "llamacpp",
        "llamacpp_cuda": False,
        "llamacpp_ccache": True,
        "llamacpp_ccache_dir": info["ccache_dir"],
        # The tiny model through the default path: the hf tool (installed on the box from
        # a PyPI mirror, below) from a Hugging Face mirror on loopback, as a user sets one.
        "model_source": "hf",
        "hf_endpoint": info["hub_url"],
        "model_repo": info["hub_repo"],
        "model_file": info["model_file"],
        "model_sha256": info["model_sha256"],
        # the Hub mirror's commit: the download names it (--revision), as the catalog's would
        "model_revision": info["hub_commit"],
        # model_source "modelscope" (a test's override): the real modelscope tool, from the
        # PyPI mirror, through the HTTPS ModelScope mirror on loopback (catalog_overrides
        # below), whose CA it trusts through this file, as a user trusts a private CA
        "modelscope_ca_bundle": info["modelscope_ca_bundle"],
        "model_ctx": 2048,
        "model_parallel": 2,
        "health_timeout": 120,
        "catalog_overrides": {
            # every pip install on the box, from the PyPI mirror on loopback
            "pypi.index_url": info["pypi_index_url"],
            # a ModelScope mirror (https: the client's only scheme), as a user sets one
            "modelscope.endpoint": info["modelscope_url"],
            "repos.nvidia_cuda.url": info["repo_url"],
            "repos.nvidia_cuda.key_url": info["key_url"],
            "repos.nvidia_cuda.key_fingerprint": info["key_fingerprint"],
            "repos.nvidia_container_toolkit.url": info["toolkit_repo_url"],
            "repos.nvidia_container_toolkit.key_url": info["toolkit_key_url"],
            "repos.nvidia_container_toolkit.key_fingerprint": info["toolkit_key_fingerprint"],
            "gpu_burn.url": info["gpu_burn_url"],
            "gpu_burn.sha256": info["gpu_burn_sha256"],
            "gpu_burn.commit": info["gpu_burn_commit"],
            # The catalog's llama.cpp sdist, the same bytes, from the loopback server's
            # PyPI stand-in: a mirror URL, as a user would set one. The sha256, tag and
            # commit stay the catalog's.
            "llamacpp.url": info["llamacpp_url"],
            # The stand-in dcgm-exporter image, built in the box (sandbox.load_exporter_image)
            # and never pulled: the deploy finds it there, as it finds a mirror user's image.
            "dcgm.exporter_image": info.get("exporter_image", EXPORTER_IMAGE),
            # The stand-in 1Panel release package (gpubox.sandbox.onepanel) at the real
            # URL's path shape on the loopback server, and its sha256: a mirror, as a user
            # sets one (used only by a host with panel: "1panel").
            "panel.onepanel.url.intl": info["panel_url"],
            "panel.onepanel.sha256.amd64": info["panel_sha256"],
        },
    }


# Box 2 (gpubox sandbox up --boxes 2 or more): one Tesla T4, no NVLink, nothing served, as a
# lab's build-and-test box; box 3 and 4: the reference box again (tests plant faults there).
DIFFERENT = {
    2: {"gpu_model": "Tesla T4", "gpu_count": 1, "nvlink": False, "backend": "none"},
}


def fleet_data(info):
    """Box k's data: the reference box's with what box k has of its own. Every box is reached
    at 127.0.0.1 on its own SSH port inside box 1's network namespace (box k's sshd is
    bridged there), where pyinfra, the host checks and doctor run for the sandbox."""
    data = {**box_data(info), **DIFFERENT.get(info.get("box", 1), {})}
    if data["nvlink"] is False:
        data.pop("nvlink_links")
    return data


box_info()  # box 1 must be up: a clear error when it is not
hosts = [(info["name"], fleet_data(info)) for info in box_infos()]
