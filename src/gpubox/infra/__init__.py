"""Layer 7, pyinfra facts and operations: gpubox's own facts, operations and run state.

- ``host_facts``: pyinfra facts (those the checks read too are ``knowledge.reads``' reads);
- ``operations``: operations, ``ManagedFiles``, ``reboot_and_wait``;
- ``readahead``: a host's fact commands read in one round trip;
- ``progress``: progress lines on long steps;
- ``outcome``: which hosts a run stopped on purpose (``gpubox deploy``'s exit 4);
- ``runfile``: a driver from NVIDIA's ``.run`` installer;
- ``driver_rollback``: the checks after a driver move's reboot, and the automatic rollback.
"""
