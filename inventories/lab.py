"""A lab of three GPU servers from one inventory: what the hosts share is group data, what
differs is per-host data, which wins over the group's.

`pyinfra inventories/lab.py deploy/full.py` converges all three in parallel (a host refused
by preflight fails alone); `pytest tests/host --inventory inventories/lab.py` checks each;
`gpubox doctor inventories/lab.py` opens with one row per host. Copy it and set the
addresses (these are documentation addresses)."""

# The group: every key here applies to each host of the list, unless the host sets it.
lab = (
    [
        ("gpu1", {"ssh_hostname": "192.0.2.11"}),
        # one T4, no NVLink, and no model served: a box for builds and tests
        (
            "gpu2",
            {
                "ssh_hostname": "192.0.2.12",
                "gpu_model": "Tesla T4",
                "gpu_count": 1,
                "nvlink": False,
                "backend": "none",
            },
        ),
        # its API on port 8081 instead of 8080, e.g. where 8080 is taken by another service;
        # api_port is per host, so the group's other hosts keep 8080
        ("gpu3", {"ssh_hostname": "192.0.2.13", "api_port": 8081}),
    ],
    {
        "ssh_user": "root",  # or a sudoer, with "_sudo": True
        "gpu_model": "Tesla V100-SXM2-32GB",
        "gpu_count": 2,
        "nvlink": True,
        "driver_branch": "570",
        "cuda_version": "12.8",
        "allow_reboot": True,
        "persistence_mode": True,
    },
)
