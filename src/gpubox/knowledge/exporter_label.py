"""The Hostname label dcgm-exporter puts on its metrics, as the pinned exporter computes it.

Pure rules, the Python standard library only and nothing of gpubox imported: the sandbox's
stand-in dcgm-exporter (sandbox/packages/dcgm-exporter) runs this very file inside its
container, so the rule is written once, here.

Source: NVIDIA/dcgm-exporter at tag 4.4.1-4.6.0 (commit 13ad457b344272c3252a7d5be5bcb3fbf6e1c65f,
the catalog's ``dcgm.exporter_image``):

- ``internal/pkg/hostname/hostname.go`` ``GetHostname``: with ``--kubernetes`` the local
  hostname (``NODE_NAME`` when set, else the kernel's hostname); else, when remote mode is on,
  the host part of ``--remote-hostengine-info`` (Go's ``net.SplitHostPort``; the whole value
  when that fails), ``NODE_NAME`` ignored; else the local hostname again.
- ``pkg/cmd/app.go``: remote mode is ``c.IsSet("remote-hostengine-info")``, i.e. the flag
  (``-r``) or its variable ``DCGM_REMOTE_HOSTENGINE_INFO`` was given; its default value is
  ``localhost:5555``. ``--no-hostname`` is parsed there but nothing reads it at that tag.
- ``internal/pkg/rendermetrics/render_metrics.go``: the label is ``Hostname="..."`` on GPU,
  NVSwitch, CPU and CPU-core metrics and ``hostname="..."`` on the per-link NVLink metrics;
  it is left out when the value is empty.
"""

import re  # no __future__ import: the sandbox image's python3 carries only what it needs

REMOTE_DEFAULT = "localhost:5555"  # app.go: the flag's default value

# Hostname="..." (GPU, switch, CPU metrics) and hostname="..." (per-link NVLink metrics),
# after { or , in a sample's label set.
_LABEL = re.compile(r'[{,]\s*(Hostname|hostname)="((?:[^"\\]|\\.)*)"')


def split_host_port(hostport: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort`` (src/net/ipsock.go): ``host:port``, ``[v6]:port``; raises
    ValueError where Go returns an error (no port, too many colons, stray brackets)."""
    i = hostport.rfind(":")
    if i < 0:
        raise ValueError(f"address {hostport}: missing port in address")
    j = k = 0
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise ValueError(f"address {hostport}: missing ']' in address")
        if end + 1 == len(hostport):
            raise ValueError(f"address {hostport}: missing port in address")
        if end + 1 != i:
            if hostport[end + 1] == ":":
                raise ValueError(f"address {hostport}: too many colons in address")
            raise ValueError(f"address {hostport}: missing port in address")
        host = hostport[1:end]
        j, k = 1, end + 1
    else:
        host = hostport[:i]
        if ":" in host:
            raise ValueError(f"address {hostport}: too many colons in address")
    if "[" in hostport[j:]:
        raise ValueError(f"address {hostport}: unexpected '[' in address")
    if "]" in hostport[k:]:
        raise ValueError(f"address {hostport}: unexpected ']' in address")
    return host, hostport[i + 1 :]


def exporter_hostname(
    remote_hostengine_info: str | None,
    *,
    kubernetes: bool = False,
    node_name: str = "",
    local_hostname: str = "",
) -> str:
    """The value of the Hostname label. ``remote_hostengine_info``: the value of
    ``--remote-hostengine-info`` (or of DCGM_REMOTE_HOSTENGINE_INFO), None when neither was
    given; ``node_name``: $NODE_NAME in the exporter's container; ``local_hostname``: the
    container's hostname (the host's, with ``--network host``)."""
    if kubernetes or remote_hostengine_info is None:
        return node_name or local_hostname
    try:
        host, _ = split_host_port(remote_hostengine_info)
    except ValueError:
        host = remote_hostengine_info
    return host


def hostname_labels(metrics: str) -> list[str]:
    """The Hostname/hostname label of every sample in a Prometheus text exposition, in order
    (a sample without one contributes nothing)."""
    values: list[str] = []
    for line in metrics.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        labels = line[line.index("{") : line.rfind("}") + 1]
        values.extend(match.group(2) for match in _LABEL.finditer(labels))
    return values
