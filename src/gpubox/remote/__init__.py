"""Layer 1, leaves: reaching hosts over SSH, the API tunnel, an inventory read offline.

- ``reach``: the exit codes every command shares and whether a host's SSH can be reached;
- ``tunnel``: the SSH port forward to a box's loopback API and the API key read over SSH;
- ``inventory``: a pyinfra inventory read without connecting.
"""
