"""Where gpubox puts things on a box: every host path and systemd unit name it owns, once.

The stages write these paths, the checks (gpubox.checks) read them, doctor shows them. A leaf
module: it imports nothing of gpubox, so anything may import it."""

from __future__ import annotations

# --- state gpubox keeps on the box
STATE_DIR = "/var/lib/gpubox"
BURNIN_RECORD = f"{STATE_DIR}/burnin.json"
CDI_STAMP = f"{STATE_DIR}/cdi-driver-version"
CACHE_DIR = "/var/cache/gpubox"
APT_QUERY_DIR = f"{CACHE_DIR}/apt-query"
# the repositories' last answers (gpubox.rules.offers): root-only, asked again only when needed
KEPT_OFFERS = f"{STATE_DIR}/apt-offers.json"
VLLM_CACHE_DIR = f"{CACHE_DIR}/vllm"
# a driver build's packages, kept before a move replaces it (gpubox.plans.driver_move): root-only
DRIVER_KEPT_DIR = f"{STATE_DIR}/driver-kept"
# the pinned driver's kept packages as a flat apt repository apt's sandbox user can read (hard
# links of the kept files: apt-get update reads a file: source as _apt, and DRIVER_KEPT_DIR is
# 0700), and its source file
DRIVER_KEPT_REPO = f"{STATE_DIR}/driver-kept-repo"
DRIVER_KEPT_SOURCE = "/etc/apt/sources.list.d/gpubox-driver-kept.list"

# --- apt: pins, holds' companions, unattended-upgrades, dpkg's lock
APT_PREFERENCES = "/etc/apt/preferences.d"
DRIVER_PIN = f"{APT_PREFERENCES}/90-gpubox-nvidia-driver"
TOOLKIT_PIN = f"{APT_PREFERENCES}/90-gpubox-nvidia-container-toolkit"
DCGM_PIN = f"{APT_PREFERENCES}/90-gpubox-dcgm"
UNATTENDED_BLACKLIST = "/etc/apt/apt.conf.d/51gpubox-nvidia-driver"
DPKG_LOCK_CONF = "/etc/apt/apt.conf.d/50gpubox-dpkg-lock"

# --- driver
NOUVEAU_BLACKLIST = "/etc/modprobe.d/gpubox-blacklist-nouveau.conf"
SYS_MODULE = "/sys/module"  # a directory per loaded kernel module
NVIDIA_MODULE_VERSION = f"{SYS_MODULE}/nvidia/version"

# --- CUDA
USR_LOCAL_CUDA = "/usr/local/cuda"
CUDA_PROFILE = "/etc/profile.d/gpubox-cuda.sh"
CUDA_LD_CONF = "/etc/ld.so.conf.d/gpubox-cuda.conf"

# --- Docker and the NVIDIA Container Toolkit
DAEMON_JSON = "/etc/docker/daemon.json"
DEV_CHAR_UDEV_RULE = "/etc/udev/rules.d/71-gpubox-nvidia-dev-char.rules"

# --- tools
GPU_BURN_WRAPPER = "/usr/local/bin/gpu-burn"

# --- llama.cpp: the home of its system user (llama); the build's compiler cache is the
# llamacpp_ccache_dir key (by default under model_dir, on the models' volume)
LLAMA_HOME = "/var/lib/llama"

# --- model downloads
HF_VENV = "/opt/gpubox/hf-venv"
MODELSCOPE_VENV = "/opt/gpubox/modelscope-venv"
HF_TOKEN_FILE = "/root/.cache/gpubox/hf-token"

# --- groups
DOCKER_GROUP = "docker"  # its members use Docker's socket without sudo (root on the box)

# --- systemd units (names without ".service")
PERSISTENCED = "nvidia-persistenced"
DOCKER = "docker"
DCGM = "nvidia-dcgm"
DCGM_EXPORTER = "gpubox-dcgm-exporter"
LLAMA_SERVER = "gpubox-llama-server"
VLLM = "gpubox-vllm"  # the unit and the container it runs
LLAMA_USER = "llama"  # the system user llama-server runs as
BACKEND_UNITS = {"llamacpp": LLAMA_SERVER, "vllm": VLLM}
# The vLLM unit's runtime directory (RuntimeDirectory=: /run/<name>, root only, gone when the
# unit stops) and the env file (VLLM_API_KEY=...) it writes there from its credential.
VLLM_RUNTIME_DIR = VLLM
VLLM_ENV_FILE = f"/run/{VLLM_RUNTIME_DIR}/env"
SYSTEMD_DIR = "/etc/systemd/system"


def unit_file(unit: str) -> str:
    """The path of a unit file gpubox writes."""
    return f"{SYSTEMD_DIR}/{unit}.service"


def dropin(unit: str, name: str = "gpubox.conf") -> str:
    """The path of a gpubox drop-in for ``unit``."""
    return f"{SYSTEMD_DIR}/{unit}.service.d/{name}"


PERSISTENCED_DROPIN = dropin(PERSISTENCED)
PERSISTENCED_WANTED = f"{SYSTEMD_DIR}/multi-user.target.d/gpubox-nvidia-persistenced.conf"
DCGM_DROPIN = dropin(DCGM)
# Where nv-hostengine listens: the drop-in binds it to this address; the port is its default
# (the drop-in sets no --port). dcgm-exporter connects here instead of embedding a second engine.
HOSTENGINE_ADDRESS = "127.0.0.1"
HOSTENGINE_PORT = 5555
DCGM_EXPORTER_UNIT_FILE = unit_file(DCGM_EXPORTER)
LLAMA_BENCH_PIDFILE = "/run/gpubox-llama-bench.pid"

# --- the watchdog of the API server (gpubox.stages.watchdog): a timer runs a oneshot service
# that probes the server, restarts it when it hangs, and keeps its count in the state file
WATCHDOG = "gpubox-watchdog"  # the service and its timer (WATCHDOG_TIMER)
WATCHDOG_TIMER = f"{WATCHDOG}.timer"
WATCHDOG_UNIT_FILE = unit_file(WATCHDOG)
WATCHDOG_TIMER_FILE = f"{SYSTEMD_DIR}/{WATCHDOG_TIMER}"
WATCHDOG_SCRIPT = "/usr/local/lib/gpubox/gpubox-watchdog"
WATCHDOG_CONFIG = "/etc/gpubox/watchdog.json"  # its settings (no secret: the key stays in its file)
WATCHDOG_STATE = f"{STATE_DIR}/watchdog.json"

# --- monitoring (gpubox.stages.monitoring, docs/monitoring.md). The node exporter's textfile
# directory is Debian's and Ubuntu's package default; gpubox's textfiles are one per writer.
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
TEXTFILE_CONFIG = f"{TEXTFILE_DIR}/gpubox-config.prom"  # the monitoring stage's: keys' values
BOX_METRICS_CONFIG = "/etc/gpubox/box-metrics.json"
NODE_EXPORTER = "prometheus-node-exporter"  # the distribution's units and /etc/default files
PROMETHEUS = "prometheus"
ALERTMANAGER = "prometheus-alertmanager"
NODE_EXPORTER_DEFAULTS = f"/etc/default/{NODE_EXPORTER}"
PROMETHEUS_DEFAULTS = f"/etc/default/{PROMETHEUS}"
ALERTMANAGER_DEFAULTS = f"/etc/default/{ALERTMANAGER}"
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
PROMETHEUS_RULES = "/etc/prometheus/gpubox-alerts.yml"  # files/monitoring/alerts.yml as it is
ALERTMANAGER_CONFIG = "/etc/prometheus/alertmanager.yml"  # rendered on the box (its secrets)
# alertmanager.yml without its secrets (root-only): the box renders ALERTMANAGER_CONFIG from it
ALERTMANAGER_TEMPLATE = "/etc/gpubox/alertmanager.yml.in"
ALERTMANAGER_RENDER = "/usr/local/lib/gpubox/gpubox-render-secrets"
# the monitor's own backend's API key, copied for Prometheus (0640 root:<Prometheus's group>)
PROMETHEUS_API_KEY = "/etc/prometheus/gpubox-api-key"
# the metrics relay: another box's monitor reads the backend's /metrics through it
METRICS_RELAY = "gpubox-metrics-relay"
METRICS_RELAY_UNIT_FILE = unit_file(METRICS_RELAY)
METRICS_RELAY_SCRIPT = "/usr/local/lib/gpubox/gpubox-metrics-relay"
METRICS_RELAY_CONFIG = "/etc/gpubox/metrics-relay.json"  # no secret: the key stays in its file
# dcgm-exporter's counters file: on the host, and where the container sees it (read-only)
DCGM_COUNTERS = "/etc/gpubox/dcgm-counters.csv"
DCGM_COUNTERS_IN_CONTAINER = "/etc/dcgm-exporter/gpubox-counters.csv"

# --- the optional server panel, 1Panel v2 (gpubox.stages.panel, docs/panel.md). Its own
# paths are the installer's (1Panel-dev/installer install.sh); gpubox keeps its secrets and
# the downloaded package.
PANEL_PASSWORD = "/etc/gpubox/panel-password"  # root only: the panel's login password
PANEL_ENTRANCE = "/etc/gpubox/panel-entrance"  # root only: the security entrance (a secret path)
PANEL_CACHE = f"{CACHE_DIR}/panel"  # the verified release tarballs, kept for re-runs
PANEL_MARKER = ".gpubox-panel"  # in <panel_dir>/1panel: gpubox installed there
PANEL_CORE = "1panel-core"  # the units (and the binaries' names)
PANEL_AGENT = "1panel-agent"
PANEL_CTL = "/usr/local/bin/1pctl"  # the control script that holds the settings
PANEL_BIN_DIR = "/usr/local/bin"
PANEL_LANG_DIR = "/usr/local/bin/lang"
PANEL_AGENT_SOCKET = "/etc/1panel/agent.sock"

# --- Grafana on the fleet's monitor (gpubox.stages.grafana, docs/monitoring.md#the-dashboard):
# a container of the catalog's image, its provisioning and gpubox's dashboard mounted read-only,
# its database in a Docker volume of its own
GRAFANA = "gpubox-grafana"  # the unit, and the container's name
GRAFANA_UNIT_FILE = unit_file(GRAFANA)
GRAFANA_DIR = "/etc/gpubox/grafana"
GRAFANA_PROVISIONING = f"{GRAFANA_DIR}/provisioning"  # /etc/grafana/provisioning in the container
GRAFANA_DATASOURCE = f"{GRAFANA_PROVISIONING}/datasources/gpubox.yml"
GRAFANA_DASHBOARD_PROVIDER = f"{GRAFANA_PROVISIONING}/dashboards/gpubox.yml"
GRAFANA_DASHBOARDS = f"{GRAFANA_DIR}/dashboards"  # the same path in the container
GRAFANA_DASHBOARD = f"{GRAFANA_DASHBOARDS}/gpubox-fleet.json"
# root only on the box (0640 root:root; the container's grafana user, uid 472, is in group 0)
GRAFANA_ADMIN_PASSWORD = f"{GRAFANA_DIR}/admin-password"
GRAFANA_VOLUME = "gpubox-grafana"  # the Docker volume at /var/lib/grafana
