"""The reference box: 2x Tesla V100-SXM2-32GB joined by NVLink, Ubuntu 24.04.

Copy to inventories/mybox.py and set the address. Every key, with its type, default and
meaning, is in docs/keys.md (or `gpubox keys`); each is written as Python, as here
("allow_reboot": True). The reference desktop, step by step: docs/walkthrough.md."""

box = {
    "ssh_hostname": "192.0.2.10",  # your box's address (this one is a documentation address)
    "ssh_user": "root",  # or a sudoer, with "_sudo": True
    "gpu_model": "Tesla V100-SXM2-32GB",
    "gpu_count": 2,
    "nvlink": True,
    # "nvlink_links": 2,  # active links per GPU on your board (nvidia-smi nvlink -s)
    "driver_branch": "570",
    "cuda_version": "12.8",
    "allow_reboot": True,
    "persistence_mode": True,
    # Mirrors: point any catalog URL elsewhere, e.g. NVIDIA's repository:
    # "catalog_overrides": {
    #     "repos.nvidia_cuda.url": "https://example.org/mirror/nvidia-cuda/{distro}/x86_64/",
    #     "repos.nvidia_cuda.key_url":
    #         "https://example.org/mirror/nvidia-cuda/{distro}/x86_64/cuda-archive-keyring.gpg",
    # },
}

hosts = [("v100box", box)]
