"""Layer 1, leaves: pure parsers of the command outputs gpubox reads from a host.

Pure parsers of the command outputs gpubox reads from a host, one module per source:

- ``nvidia_smi``: nvidia-smi's table, -L, --query-gpu, nvlink -s, topo -m and its error
  messages;
- ``system``: nvcc --version, lspci -Dnn (and -Dnnk's drivers), /etc/os-release,
  mokutil --sb-state, users' groups (id -nG);
- ``systemd``: systemctl get-default, systemctl show -p, loginctl show-session -p;
- ``secure_boot``: mokutil --test-key, openssl x509, modinfo's signer, module taint;
- ``apt``: apt-cache policy, apt-mark showhold, dpkg-query, and deb822 stanzas (``Stanza``,
  ``parse_stanzas``; ``format_stanza(s)`` writes them back);
- ``gpu_burn``: gpu-burn (a burn and `gpu_burn -l`);
- ``dcgm``: DCGM's dcgmi (discovery -l, dmon, diag -j, and the errors it prints when it cannot
  do its work);
- ``alertmanager``: Alertmanager's ``GET /api/v2/alerts`` (the alerts firing, by host);
- ``sections``: gpubox's own multi-command outputs (``@@gpubox NAME`` lines start each);
- ``_common``: ParseError and the helpers the modules share.

Every public name is re-exported here, so callers write ``parsers.parse_lspci(...)``.

Text in, dataclasses out: nothing here runs a command or imports pyinfra or testinfra, so the
deploy's facts, the host checks and the CLI all read a host the same way. Every parser is
tested on real captured outputs (tests/fixtures, sources in tests/fixtures/SOURCES.md) and
raises ParseError, quoting the line it could not read, rather than guessing."""

from __future__ import annotations

from gpubox.parsers._common import ParseError
from gpubox.parsers.alertmanager import Alert, firing_by_host, parse_alerts
from gpubox.parsers.apt import (
    AptPolicy,
    AptPolicyVersion,
    DpkgPackage,
    Stanza,
    format_stanza,
    format_stanzas,
    parse_apt_policy,
    parse_dpkg_query,
    parse_showhold,
    parse_stanzas,
)
from gpubox.parsers.dcgm import (
    DcgmDiag,
    DcgmDiagTest,
    DcgmGpu,
    DmonRow,
    DmonSample,
    parse_dcgmi_diag_json,
    parse_dcgmi_discovery,
    parse_dcgmi_dmon,
    parse_dcgmi_error,
)
from gpubox.parsers.gpu_burn import (
    GpuBurnDevice,
    GpuBurnResult,
    parse_gpu_burn,
    parse_gpu_burn_list,
)
from gpubox.parsers.nvidia_smi import (
    NvLink,
    SmiGpu,
    SmiTable,
    SmiTableGpu,
    Topology,
    nvml_library_version,
    parse_loaded_driver,
    parse_nvlink_status,
    parse_query_gpu,
    parse_smi_error,
    parse_smi_list,
    parse_smi_table,
    parse_topo_matrix,
)
from gpubox.parsers.sections import SECTION, parse_sections
from gpubox.parsers.secure_boot import (
    MokState,
    parse_mok_state,
    parse_test_key,
    parse_x509,
)
from gpubox.parsers.system import (
    NvccVersion,
    PciDevice,
    PciKernelDevice,
    parse_lspci,
    parse_lspci_kernel,
    parse_nvcc_version,
    parse_os_release,
    parse_secure_boot,
    parse_user_groups,
    parse_yes,
)
from gpubox.parsers.systemd import (
    LoginSession,
    UnitState,
    parse_default_target,
    parse_login_session,
    parse_properties,
    parse_unit_state,
    parse_unit_states,
)

__all__ = [
    "Alert",
    "firing_by_host",
    "parse_alerts",
    "SECTION",
    "parse_sections",
    "MokState",
    "parse_mok_state",
    "parse_test_key",
    "parse_x509",
    "AptPolicy",
    "AptPolicyVersion",
    "DcgmDiag",
    "DcgmDiagTest",
    "DcgmGpu",
    "DmonRow",
    "DmonSample",
    "DpkgPackage",
    "LoginSession",
    "GpuBurnDevice",
    "GpuBurnResult",
    "NvLink",
    "NvccVersion",
    "ParseError",
    "PciDevice",
    "PciKernelDevice",
    "SmiGpu",
    "SmiTable",
    "SmiTableGpu",
    "Stanza",
    "Topology",
    "UnitState",
    "nvml_library_version",
    "parse_loaded_driver",
    "parse_apt_policy",
    "parse_dcgmi_diag_json",
    "parse_dcgmi_discovery",
    "parse_dcgmi_dmon",
    "parse_dcgmi_error",
    "parse_default_target",
    "parse_dpkg_query",
    "format_stanza",
    "format_stanzas",
    "parse_gpu_burn",
    "parse_gpu_burn_list",
    "parse_login_session",
    "parse_lspci",
    "parse_lspci_kernel",
    "parse_nvcc_version",
    "parse_nvlink_status",
    "parse_os_release",
    "parse_properties",
    "parse_query_gpu",
    "parse_secure_boot",
    "parse_showhold",
    "parse_smi_error",
    "parse_smi_list",
    "parse_smi_table",
    "parse_stanzas",
    "parse_topo_matrix",
    "parse_unit_state",
    "parse_unit_states",
    "parse_user_groups",
    "parse_yes",
]
