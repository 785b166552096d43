"""The key table: every host data key gpubox reads, with its type, default and a one-line doc,
declared once."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpubox.base import compat
from gpubox.knowledge import metrics


@dataclass(frozen=True)
class Key:
    name: str
    type: type | tuple[type, ...]
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    # Default computed from the other (already typed) values when ``default`` is None.
    derive: Callable[[dict[str, Any], dict[str, Any]], Any] | None = None
    # Turns an accepted value into the one the rest of gpubox sees.
    normalize: Callable[[Any], Any] | None = None
    # The range a number key accepts, both ends included (None: unbounded on that side).
    # Every int and float key declares at least one end (tests/unit/test_config_ranges.py).
    min: int | float | None = None
    max: int | float | None = None
    # The one serving backend that reads the key (None: not one backend's own). Set for a
    # host that serves with the other backend, it is ignored, and validation warns.
    backend: str | None = None

    def range_text(self) -> str:
        if self.min is not None and self.max is not None:
            return f"{self.min} to {self.max}"
        if self.min is not None:
            return f"at least {self.min}"
        return f"at most {self.max}"

    def in_range(self, value: int | float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


def _derive_driver_version(values: dict[str, Any], host_catalog: dict[str, Any]) -> str | None:
    branch = host_catalog["driver"]["branches"].get(str(values.get("driver_branch")))
    return branch["version"] if branch else None


def _derive_kernel_modules(values: dict[str, Any], host_catalog: dict[str, Any]) -> str:
    gpu = compat.GPU_MODELS.get(values.get("gpu_model", ""))
    return compat.default_kernel_modules(gpu) if gpu else "proprietary"


def _derive_ccache_dir(values: dict[str, Any], host_catalog: dict[str, Any]) -> str:
    """Inside model_dir: the one place certain to be on the models' filesystem, whether the
    volume is mounted at model_dir itself or above it (a directory beside model_dir is on
    the system disk when the volume is mounted at model_dir)."""
    return f"{str(values.get('model_dir') or '/srv/models').rstrip('/')}/.ccache"


# How long a start of the server has to answer healthy (watchdog_grace_s), per backend: its
# model's load, with room for a slow disk (docs/watchdog.md#the-keys-and-how-long-a-hang-lasts).
WATCHDOG_GRACE_S = {"llamacpp": 900, "vllm": 1800}


def _derive_watchdog_grace(values: dict[str, Any], host_catalog: dict[str, Any]) -> int:
    return WATCHDOG_GRACE_S.get(str(values.get("backend")), WATCHDOG_GRACE_S["llamacpp"])


def _listen_keys(address: str, port: str, who: str, default_port: int) -> tuple[Key, Key]:
    """The address (loopback by default) and the port a service on the box listens on."""
    return (
        Key(address, str, "127.0.0.1", f"address {who} listens on"),
        Key(port, int, default_port, f"port {who} listens on", min=1, max=65535),
    )


# llama-server's -sm values gpubox offers ("none" would leave the second GPU idle).
LLAMA_SPLIT_MODES = ("layer", "row", "tensor")

# A Hub repository id (owner/name), as Hugging Face and ModelScope accept them.
MODEL_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


KEYS: tuple[Key, ...] = (
    Key("gpu_model", str, "Tesla V100-SXM2-32GB", "GPU model as nvidia-smi names it"),
    Key("gpu_count", int, 2, "how many GPUs of gpu_model the box has", min=1),
    Key("nvlink", bool, True, "the GPUs are joined by NVLink (verified: links up, topo NV#)"),
    Key(
        "nvlink_links",
        int,
        None,
        "active NVLink links expected on each GPU (default: at least one)",
        min=1,  # unset means "at least one"; a GPU without links is nvlink: false
    ),
    Key("driver_branch", (str, int), "570", "NVIDIA driver branch to pin", normalize=str),
    Key(
        "driver_version",
        str,
        None,
        "exact driver version (default: the catalog's for the branch)",
        derive=_derive_driver_version,
    ),
    Key(
        "driver_kernel_modules",
        str,
        None,
        "'proprietary' or 'open' (default: what the GPUs' compute capability needs)",
        choices=compat.KERNEL_MODULE_FLAVOURS,
        derive=_derive_kernel_modules,
    ),
    Key(
        "driver_kernel_headers",
        bool,
        True,
        "install linux-headers for the running kernel (DKMS builds the module against them) "
        "and the headers meta of each kernel series the box boots; the running kernel's are "
        "skipped with a warning when the box's apt no longer offers them",
    ),
    Key(
        "runfile_driver",
        str,
        "refuse",
        "a driver from NVIDIA's .run installer on the box: 'refuse' (preflight stops, nothing "
        "changed) or 'uninstall' (the driver stage first runs nvidia-uninstall --silent)",
        choices=("refuse", "uninstall"),
    ),
    Key("cuda_version", str, "12.8", "CUDA toolkit to install (toolkit only, never a driver)"),
    Key(
        "allow_reboot",
        bool,
        True,
        "reboot when the installed driver differs from the loaded one (else stop and say so)",
    ),
    Key(
        "allow_desktop_reboot",
        bool,
        False,
        "reboot even while a user is logged in to a graphical session (else the deploy installs "
        "the driver and stops before the reboot, saying how to reboot)",
    ),
    Key(
        "reboot_timeout",
        int,
        900,
        "seconds to wait for the box to come back after a reboot",
        min=1,
    ),
    Key(
        "driver_rollback",
        bool,
        True,
        "after a driver move's reboot, a box that fails its driver checks goes back to the "
        "kept driver, reboots and verifies, and the deploy fails (else it fails and stays)",
    ),
    Key(
        "apt_lock_timeout",
        int,
        900,
        "seconds a deploy waits for dpkg's locks (a fresh box's unattended-upgrades) before "
        "it stops, nothing changed",
        min=1,
    ),
    Key("persistence_mode", bool, True, "run nvidia-persistenced with persistence mode on"),
    # Stage docker
    Key(
        "docker_source",
        str,
        "docker",
        "'docker' (Docker's apt repository) or 'distro' (the distribution's docker.io)",
        choices=("docker", "distro"),
    ),
    Key(
        "docker_keep_existing",
        bool,
        True,
        "keep a Docker that is already installed and running (e.g. a panel's) and only "
        "configure it",
    ),
    Key("docker_registry_mirrors", list, [], "registry mirrors merged into daemon.json"),
    Key(
        "docker_daemon_options",
        dict,
        {},
        "other daemon.json keys gpubox sets (keys it does not set are never touched)",
    ),
    Key("docker_default_runtime_nvidia", bool, False, "make nvidia Docker's default runtime"),
    Key(
        "docker_check_image",
        str,
        "ubuntu:24.04",
        "image the host checks start GPU containers from (pulled once if absent)",
    ),
    Key(
        "docker_users",
        list,
        [],
        "existing users added to the docker group: they run docker without sudo (which is "
        "root on the box); a user the box lacks is refused at preflight",
    ),
    # Stage dcgm
    Key("dcgm_exporter", bool, False, "run dcgm-exporter (a container) for Prometheus"),
    *_listen_keys("dcgm_exporter_address", "dcgm_exporter_port", "dcgm-exporter", 9400),
    # Stage grafana
    Key(
        "grafana",
        bool,
        False,
        "run Grafana (a container) on the monitor, with gpubox's dashboard; needs monitoring "
        "'prometheus'",
    ),
    *_listen_keys("grafana_address", "grafana_port", "Grafana (on the monitor)", 3000),
    # Stage tools
    Key(
        "gpu_burn_compute",
        int,
        None,
        "COMPUTE for gpu-burn's build (default: the GPUs' compute capability, 70 on V100)",
        min=50,  # compute capability x 10; CUDA 12's oldest target is sm_50 (5 would mean 5.0)
    ),
    # Stage burnin
    Key("burnin_seconds", int, 60, "gpu-burn run time per burn-in", min=1),
    Key("burnin_doubles", bool, True, "burn with doubles (gpu-burn -d)"),
    Key("burnin_tensor_cores", bool, False, "try tensor cores (gpu-burn -tc)"),
    Key(
        "burnin_dcgm_level",
        int,
        2,
        "dcgmi diag -r level after gpu-burn (1-4)",
        choices=(1, 2, 3, 4),
        min=1,
        max=4,
    ),
    Key("burnin_required", bool, False, "host checks require a passing, recent burn-in"),
    Key(
        "verify_after_deploy",
        bool,
        True,
        "deploy/full.py ends with the quick checks (the host fails when one fails)",
    ),
    Key(
        "canary_bench_tolerance",
        (int, float),
        10,
        "gpubox deploy --canary: how many percent a canary's output tok/s may fall below its "
        "last recorded gpubox bench before the canary fails (docs/deploy.md)",
        min=0,
        max=100,
    ),
    Key(
        "burnin_max_age_days",
        int,
        30,
        "how old a burn-in record the host checks accept",
        min=1,
    ),
    # Stage model and backend
    Key(
        "backend",
        str,
        "llamacpp",
        "'llamacpp', 'vllm' or 'none'",
        choices=("llamacpp", "vllm", "none"),
    ),
    Key("model", str, "qwen3-next-80b-a3b-thinking", "the catalog's model to serve"),
    Key(
        "model_source",
        str,
        "hf",
        "'hf' (or a mirror: hf_endpoint), 'modelscope' or 'url'",
        choices=("hf", "modelscope", "url"),
        backend="llamacpp",
    ),
    Key(
        "model_url",
        str,
        None,
        "with model_source 'url': where the GGUF file is",
        backend="llamacpp",
    ),
    Key(
        "model_repo",
        str,
        None,
        "with model_source 'hf' or 'modelscope': the repository (owner/name) to download "
        "model_file from (default: the catalog's)",
        backend="llamacpp",
    ),
    Key("model_file", str, None, "the file's name (default: the catalog's)", backend="llamacpp"),
    Key(
        "model_sha256", str, None, "the file's sha256 (default: the catalog's)", backend="llamacpp"
    ),
    Key(
        "model_revision",
        str,
        None,
        "the revision to download model_file at: a Hugging Face commit with model_source "
        "'hf', a ModelScope revision with 'modelscope' (default: the catalog's; main when "
        "it has none)",
        backend="llamacpp",
    ),
    Key(
        "download_stall_s",
        int,
        120,
        "the model download's stall watchdog: no new bytes for this long restarts the "
        "transfer (hf: with Xet off after 2 stalls)",
        min=5,
    ),
    Key(
        "download_memory_max",
        str,
        "4G",
        "the model download unit's memory cap (systemd MemoryMax=: bytes, K/M/G/T suffix)",
    ),
    Key("model_dir", str, "/srv/models", "where models are kept on the box"),
    Key(
        "model_quantization",
        str,
        None,
        "the weights' quantisation or dtype (default: the catalog's), checked against the GPUs",
    ),
    # llama.cpp reads -c 0 as "the model's whole context"; gpubox sizes memory from model_ctx,
    # so it must be the real number. The defaults suit a box one team uses: two requests at
    # once (two people or agents), each with a whole context of its own at the same time:
    # llama-server runs with -c model_ctx x model_parallel and no unified KV cache, so each
    # slot holds exactly model_ctx tokens (room for the model card's thinking budget), no
    # request is longer, and a request beyond model_parallel waits for a free slot. Each
    # slot costs its KV cache (about 3 GiB at 131072 tokens on Qwen3-Next); more slots also
    # split the decode speed between more streams.
    Key(
        "model_ctx",
        int,
        131072,
        "each request slot's context: every slot holds this many tokens at the same time "
        "(llama.cpp -c is model_ctx x model_parallel; vLLM --max-model-len)",
        min=1,
    ),
    Key(
        "model_parallel",
        int,
        2,
        "parallel request slots (llama.cpp -np, vLLM max seqs)",
        min=1,
    ),
    Key("model_alias", str, "qwen3-next", "the model id the API serves"),
    Key("hf_endpoint", str, None, "Hugging Face mirror, e.g. hf-mirror.com for users in China"),
    Key(
        "modelscope_ca_bundle",
        str,
        None,
        "with model_source 'modelscope': a PEM file on the box with the CA certificates the "
        "modelscope client trusts (REQUESTS_CA_BUNDLE), for a mirror whose HTTPS certificate "
        "a private CA signed (default: the client's own bundle)",
        backend="llamacpp",
    ),
    *_listen_keys("api_host", "api_port", "the API", 8080),
    Key(
        "api_key_file",
        str,
        "/etc/gpubox/api-key",
        "root-only file with the API key (generated at first deploy)",
    ),
    Key(
        "llamacpp_cuda",
        bool,
        True,
        "build llama.cpp with CUDA (false: CPU only)",
        backend="llamacpp",
    ),
    Key(
        "llamacpp_ccache",
        bool,
        True,
        "build llama.cpp through ccache: a rebuild with the same inputs takes seconds",
        backend="llamacpp",
    ),
    Key(
        "llamacpp_unity",
        bool,
        True,
        "compile llama.cpp's common library, server and mtmd as unity builds (a third less "
        "CPU on a cold build); False: upstream's one compile per file",
        backend="llamacpp",
    ),
    Key(
        "llamacpp_ccache_dir",
        str,
        None,
        "ccache's directory (default: <model_dir>/.ccache, on the models' volume, so that it "
        "outlives a reinstalled system disk)",
        derive=_derive_ccache_dir,
        backend="llamacpp",
    ),
    Key(
        "llamacpp_extra_args",
        list,
        [],
        "more llama-server arguments, checked against --help",
        backend="llamacpp",
    ),
    Key(
        "llamacpp_split_mode",
        str,
        "layer",
        "how llama.cpp splits the model over the GPUs (-sm): 'layer' (whole layers per GPU), "
        "'row' or 'tensor' (each layer across every GPU)",
        choices=LLAMA_SPLIT_MODES,
        backend="llamacpp",
    ),
    Key(
        "vllm_enforce_eager", bool, False, "vLLM without CUDA graphs (slow decode)", backend="vllm"
    ),
    # Qwen3-Next's gated-delta-net recurrent state: "auto" keeps it in the model's dtype (fp16
    # with --dtype half on Volta), "float32" passes --mamba-ssm-cache-dtype float32. Untried on
    # a V100: `gpubox bench --smoke` measures both and names the one to keep.
    Key(
        "vllm_mamba_ssm_cache_dtype",
        str,
        "auto",
        "the dtype of the model's recurrent (SSM) state in vLLM: 'auto' (the model's dtype) or "
        "'float32' (--mamba-ssm-cache-dtype float32)",
        choices=("auto", "float32"),
        backend="vllm",
    ),
    Key(
        "vllm_revision",
        str,
        None,
        "the Hugging Face revision (a commit, branch or tag) to download the vLLM checkpoint "
        "(the catalog's vllm_repo) at (default: the catalog's vllm_revision; main when none)",
        backend="vllm",
    ),
    Key(
        "vllm_gpu_memory_utilization",
        float,
        0.92,
        "vLLM --gpu-memory-utilization",
        min=0.01,  # vLLM wants more than 0 and at most 1
        max=1.0,
        backend="vllm",
    ),
    Key(
        "vllm_tensor_parallel",
        int,
        None,
        "vLLM --tensor-parallel-size (default: gpu_count)",
        min=1,
        backend="vllm",
    ),
    Key(
        "health_timeout",
        int,
        1800,
        "seconds to wait for the API to answer after a start",
        min=1,
    ),
    # The watchdog (gpubox.stages.watchdog, docs/watchdog.md): with the defaults a server that
    # stops answering is restarted within about 3 minutes, one whose completions hang while
    # /health answers within about 5.
    Key(
        "watchdog",
        bool,
        True,
        "a timer probes the API server and restarts it when it hangs (docs/watchdog.md)",
    ),
    Key(
        "watchdog_interval_s",
        int,
        30,
        "seconds between the watchdog's probes of /health",
        min=1,
        max=3600,
    ),
    Key(
        "watchdog_failures",
        int,
        3,
        "consecutive failed probes after which the watchdog restarts the server",
        min=1,
        max=100,
    ),
    Key(
        "watchdog_grace_s",
        int,
        None,
        "seconds a start of the server has to answer healthy before its failures count "
        "(default: 900 with llama.cpp, 1800 with vLLM: the model's load; docs/watchdog.md)",
        derive=_derive_watchdog_grace,
        min=0,
        max=86400,
    ),
    Key(
        "watchdog_busy_limit_s",
        int,
        600,
        "seconds a running request counts as progress when none of the server's work counters "
        "moves (a long prefill, a kernel compile); after that its failures count",
        min=0,
        max=86400,
    ),
    Key(
        "watchdog_timeout_s",
        int,
        15,
        "seconds the watchdog waits for each answer (no answer in time is a failure)",
        min=1,
        max=600,
    ),
    Key(
        "watchdog_completion_every_s",
        int,
        120,
        "seconds between the watchdog's one-token completions (0: at every probe)",
        min=0,
        max=86400,
    ),
    # Stage monitoring (gpubox.stages.monitoring, docs/monitoring.md): a host with monitoring
    # "prometheus" is the fleet's monitor, and every host of the inventory is then monitored.
    Key(
        "monitoring",
        str,
        "none",
        "'prometheus': this host is the fleet's monitor (Prometheus, Alertmanager, the alert "
        "rules), and every host of the inventory gets the node exporter and is scraped "
        "(docs/monitoring.md)",
        choices=("none", "prometheus"),
    ),
    Key(
        "monitoring_interval",
        int,
        30,
        "seconds between the monitor's scrapes and between its rule evaluations",
        min=1,
        max=3600,
    ),
    Key(
        "monitoring_retention",
        str,
        "15d",
        "how long the monitor keeps its samples (Prometheus's --storage.tsdb.retention.time: "
        "a number and one of s m h d w y)",
    ),
    *_listen_keys("prometheus_address", "prometheus_port", "Prometheus (on the monitor)", 9090),
    *_listen_keys(
        "alertmanager_address", "alertmanager_port", "Alertmanager (on the monitor)", 9093
    ),
    *_listen_keys("node_exporter_address", "node_exporter_port", "the node exporter", 9100),
    *_listen_keys(
        "metrics_relay_address",
        "metrics_relay_port",
        "the metrics relay (the backend's /metrics for a monitor on another box)",
        9401,
    ),
    Key(
        "monitoring_targets",
        dict,
        {},
        "where the monitor reaches this box's exporters, by job (node, dcgm, backend) as "
        "'HOST:PORT', instead of the derived address (NAT, tunnels, the sandbox's bridges)",
    ),
    Key(
        "output_tokens_per_second_floor",
        (int, float),
        metrics.OUTPUT_TOKENS_PER_SECOND_FLOOR,
        "output tokens/s per request below which a box serving requests fires "
        "OutputTokensPerSecondLow",
        min=0,
        normalize=float,
    ),
    Key(
        "alert_webhook_url_file",
        str,
        None,
        "on the monitor: a root-only file holding the URL Alertmanager posts alerts to",
    ),
    Key("alert_email_to", str, None, "on the monitor: the address Alertmanager mails alerts to"),
    Key("alert_email_from", str, None, "on the monitor: the alerts' From address"),
    Key(
        "alert_smtp_smarthost",
        str,
        None,
        "on the monitor: the SMTP server alerts are sent through, as 'HOST:PORT'",
    ),
    Key("alert_smtp_username", str, None, "on the monitor: the SMTP login (none: no login)"),
    Key(
        "alert_smtp_password_file",
        str,
        None,
        "on the monitor: a root-only file holding the SMTP password",
    ),
    # The optional server panel (gpubox.stages.panel, docs/panel.md)
    Key(
        "panel",
        str,
        "none",
        "a server panel on the box's Docker: 'none' or '1panel' (1Panel v2; docs/panel.md)",
        choices=("none", "1panel"),
    ),
    Key("panel_port", int, 10100, "port of the panel's web UI, on every address", min=1, max=65535),
    Key("panel_user", str, "gpubox", "the panel's login user (3 to 30 of a-z A-Z 0-9 _)"),
    Key(
        "panel_entrance",
        str,
        None,
        "the panel's security entrance, the secret path of its login page (3 to 30 of "
        "a-z A-Z 0-9 _; default: generated once on the box, kept root-only in "
        "/etc/gpubox/panel-entrance)",
    ),
    Key(
        "panel_edition",
        str,
        "intl",
        "'intl' (resource.1panel.pro) or 'cn' (resource.fit2cloud.com): the download host and "
        "the panel's edition",
        choices=("intl", "cn"),
    ),
    Key(
        "panel_version_policy",
        str,
        "warn",
        "a panel of another version than the catalog's: 'warn' (kept) or 'converge' (to it)",
        choices=("warn", "converge"),
    ),
    Key("panel_dir", str, "/opt", "where the panel keeps its data (<panel_dir>/1panel)"),
    Key(
        "catalog_overrides",
        dict,
        {},
        "catalog entries to replace for this host, by dotted path (mirrors, fingerprints)",
    ),
)
KEYS_BY_NAME: dict[str, Key] = {key.name: key for key in KEYS}
