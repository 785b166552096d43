"""Every host data key gpubox reads: name, type, default and a one-line doc, declared once.

Inventory host data -> ``validate`` (all problems at once) -> ``HostConfig`` (typed, defaults
and catalog values resolved). The stages and the host checks both read a ``HostConfig``, so
deploy and verify can never disagree about what the box should be.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpubox import catalog, compat, vllm_rules


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
        "install linux-headers for the running kernel (DKMS builds the module against them)",
    ),
    Key("cuda_version", str, "12.8", "CUDA toolkit to install (toolkit only, never a driver)"),
    Key(
        "allow_reboot",
        bool,
        True,
        "reboot when the installed driver differs from the loaded one (else stop and say so)",
    ),
    Key(
        "reboot_timeout",
        int,
        900,
        "seconds to wait for the box to come back after a reboot",
        min=1,
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
    # Stage dcgm
    Key("dcgm_exporter", bool, False, "run dcgm-exporter (a container) for Prometheus"),
    Key("dcgm_exporter_address", str, "127.0.0.1", "address dcgm-exporter listens on"),
    Key("dcgm_exporter_port", int, 9400, "port dcgm-exporter listens on", min=1, max=65535),
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
    ),
    Key("model_url", str, None, "with model_source 'url': where the GGUF file is"),
    Key(
        "model_repo",
        str,
        None,
        "with model_source 'hf' or 'modelscope': the repository (owner/name) to download "
        "model_file from (default: the catalog's)",
    ),
    Key("model_file", str, None, "the file's name (default: the catalog's)"),
    Key("model_sha256", str, None, "the file's sha256 (default: the catalog's)"),
    Key("model_dir", str, "/srv/models", "where models are kept on the box"),
    Key(
        "model_quantization",
        str,
        None,
        "the weights' quantisation or dtype (default: the catalog's), checked against the GPUs",
    ),
    # llama.cpp reads -c 0 as "the model's whole context"; gpubox sizes memory from model_ctx,
    # so it must be the real number. The defaults suit a box one team uses: two requests at
    # once (two people or agents), each of which may use the whole context, since llama-server
    # runs with a unified KV cache (-kvu): the slots share one pool of model_ctx tokens, so a
    # second slot costs no memory, and each answer has room for the model card's thinking
    # budget. More slots would split the decode speed between more streams.
    Key(
        "model_ctx",
        int,
        131072,
        "context length the server allocates; with llama.cpp's unified KV cache every slot "
        "may use all of it",
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
    Key("api_host", str, "127.0.0.1", "address the API listens on"),
    Key("api_port", int, 8080, "port the API listens on", min=1, max=65535),
    Key(
        "api_key_file",
        str,
        "/etc/gpubox/api-key",
        "root-only file with the API key (generated at first deploy)",
    ),
    Key("llamacpp_cuda", bool, True, "build llama.cpp with CUDA (false: CPU only)"),
    Key("llamacpp_ccache", bool, False, "build llama.cpp through ccache (fast rebuilds)"),
    Key("llamacpp_extra_args", list, [], "more llama-server arguments, checked against --help"),
    Key(
        "llamacpp_split_mode",
        str,
        "layer",
        "how llama.cpp splits the model over the GPUs (-sm): 'layer' (whole layers per GPU), "
        "'row' or 'tensor' (each layer across every GPU)",
        choices=LLAMA_SPLIT_MODES,
    ),
    Key("vllm_enforce_eager", bool, False, "vLLM without CUDA graphs (slow decode)"),
    Key(
        "vllm_gpu_memory_utilization",
        float,
        0.92,
        "vLLM --gpu-memory-utilization",
        min=0.01,  # vLLM wants more than 0 and at most 1
        max=1.0,
    ),
    Key(
        "vllm_tensor_parallel",
        int,
        None,
        "vLLM --tensor-parallel-size (default: gpu_count)",
        min=1,
    ),
    Key(
        "health_timeout",
        int,
        1800,
        "seconds to wait for the API to answer after a start",
        min=1,
    ),
    Key(
        "catalog_overrides",
        dict,
        {},
        "catalog entries to replace for this host, by dotted path (mirrors, fingerprints)",
    ),
)
KEYS_BY_NAME: dict[str, Key] = {key.name: key for key in KEYS}


def _pyinfra_keys() -> set[str]:
    """Host data keys that belong to pyinfra itself (connectors, global arguments)."""
    from pyinfra.api.arguments import all_argument_meta
    from pyinfra.api.connectors import get_all_connectors

    keys = set(all_argument_meta)
    for connector in get_all_connectors().values():
        keys.update(getattr(connector, "data_meta", {}) or {})
    return keys


@dataclass(frozen=True)
class Problem:
    host: str
    key: str
    message: str
    severity: str = "error"  # or "warning"

    def __str__(self) -> str:
        return f"{self.host}: {self.key}: {self.message}"


class ConfigError(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid inventory ({len(problems)} problem(s)):\n{lines}")


@dataclass(frozen=True)
class HostConfig:
    host: str
    values: dict[str, Any] = field(repr=False)
    catalog: dict[str, Any] = field(repr=False)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

    # Derived facts, in one place.
    @property
    def gpu(self) -> compat.GpuModel:
        return compat.GPU_MODELS[self.values["gpu_model"]]

    @property
    def branch(self) -> int:
        return int(self.values["driver_branch"])

    @property
    def cuda(self) -> dict[str, Any]:
        return dict(self.catalog["cuda"]["versions"][self.values["cuda_version"]])

    def driver_packages(self, family: str) -> DriverPackages:
        """The driver packages for an OS family, expanded from the catalog."""
        driver = self.catalog["driver"]
        branch, version = self.values["driver_branch"], self.values["driver_version"]
        package_version = driver["branches"][branch]["package_version"][family]
        if version != driver["branches"][branch]["version"]:
            # An explicit driver_version: NVIDIA's version string keeps the catalog's suffix.
            package_version = f"{version}-{package_version.split('-', 1)[1]}"
        cuda_dash = self.values["cuda_version"].replace(".", "-")

        def expand(names: list[str]) -> list[str]:
            return [n.format(branch=branch, version=version, cuda_dash=cuda_dash) for n in names]

        names = driver["packages"][family]
        flavour = self.values["driver_kernel_modules"]
        other = "open" if flavour == "proprietary" else "proprietary"
        return DriverPackages(
            installed=expand(names["common"] + names[flavour]),
            package_version=package_version,
            refused=expand(names[other]),
            forbidden=expand(driver["forbidden_packages"]),
        )


@dataclass(frozen=True)
class DriverPackages:
    installed: list[str]  # installed as name=package_version, pinned, held
    package_version: str
    refused: list[str]  # the other kernel module flavour: pinned away and removed
    forbidden: list[str]  # metas that drag in a driver of their own: removed


@dataclass(frozen=True)
class Target:
    """What the host's OS release means to gpubox."""

    os_id: str
    version_id: str
    distro: str  # NVIDIA's repository name: ubuntu2404, debian12
    family: str  # package naming: ubuntu (suffixed names) or debian (unsuffixed)

    @property
    def distro_origin(self) -> str:
        """The Origin of the distribution's own archive (apt preferences' o=)."""
        return "Ubuntu" if self.family == "ubuntu" else "Debian"


def target_for(os_release: Mapping[str, str], host_catalog: dict[str, Any]) -> Target | None:
    os_id = os_release.get("ID", "")
    version_id = os_release.get("VERSION_ID", "")
    entry = host_catalog["os"].get(f"{os_id}-{version_id}")
    if entry is None:
        return None
    return Target(os_id, version_id, entry["distro"], entry["family"])


def _type_name(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def _check_type(key: Key, value: Any) -> bool:
    if isinstance(value, bool) and key.type is not bool:
        return False
    if key.type is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if key.type is str and isinstance(value, int | float) and not isinstance(value, bool):
        return False
    return isinstance(value, key.type)


def validate(host: str, data: Mapping[str, Any]) -> tuple[HostConfig | None, list[Problem]]:
    """Check one host's data; return its config (when valid) and every problem found."""
    problems: list[Problem] = []
    pyinfra_keys = _pyinfra_keys()
    values: dict[str, Any] = {}
    # Keys whose value was refused: they take their default below, and every rule that reads
    # one is skipped, so one wrong key is one problem, not a cascade built on a stand-in value.
    invalid: set[str] = set()

    for name, value in data.items():
        if name in pyinfra_keys or name.startswith("_"):
            continue
        key = KEYS_BY_NAME.get(name)
        if key is None:
            near = difflib.get_close_matches(name, list(KEYS_BY_NAME), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            problems.append(Problem(host, name, f"unknown key{hint}"))
            continue
        if value is None:
            continue
        if not _check_type(key, value):
            problems.append(
                Problem(
                    host,
                    name,
                    f"must be {_type_name(key.type)}, got {type(value).__name__} {value!r}",
                )
            )
            invalid.add(name)
            continue
        if key.choices and value not in key.choices:
            choices = ", ".join(repr(c) for c in key.choices)
            problems.append(Problem(host, name, f"must be one of {choices}, got {value!r}"))
            invalid.add(name)
            continue
        if isinstance(value, int | float) and not key.in_range(value):
            problems.append(Problem(host, name, f"must be {key.range_text()}, got {value!r}"))
            invalid.add(name)
            continue
        values[name] = key.normalize(value) if key.normalize else value

    for key in KEYS:
        if key.name not in values and key.derive is None:
            values[key.name] = copy.deepcopy(key.default)

    # The catalog, with this host's overrides (each refused one is reported and left out).
    host_catalog = catalog.load()
    for path, value in values["catalog_overrides"].items():
        message = _override_problem(host_catalog, path, value)
        if message:
            problems.append(Problem(host, "catalog_overrides", message))
            invalid.update(("catalog_overrides", f"catalog_overrides:{path}"))
        else:
            catalog.set_path(host_catalog, path, value)

    def valid(*names: str) -> bool:
        """Whether every key a rule reads holds the host's own, accepted value."""
        return invalid.isdisjoint(names)

    for key in KEYS:
        if key.name not in values and key.derive is not None:
            values[key.name] = key.derive(values, host_catalog)

    branches = host_catalog["driver"]["branches"]
    if values["driver_branch"] not in branches:
        if valid("driver_branch"):
            problems.append(
                Problem(
                    host,
                    "driver_branch",
                    f"no catalog entry for branch {values['driver_branch']!r}; "
                    f"known: {', '.join(branches)}",
                )
            )
    elif values["driver_version"] is None:
        values["driver_version"] = branches[values["driver_branch"]]["version"]
    if (
        valid("driver_branch", "driver_version")
        and values["driver_branch"] in branches
        and values["driver_version"]
        and not str(values["driver_version"]).startswith(values["driver_branch"] + ".")
    ):
        problems.append(
            Problem(
                host,
                "driver_version",
                f"{values['driver_version']!r} is not a release of branch "
                f"{values['driver_branch']}",
            )
        )
    if valid("cuda_version") and values["cuda_version"] not in host_catalog["cuda"]["versions"]:
        problems.append(
            Problem(
                host,
                "cuda_version",
                f"no catalog entry for CUDA {values['cuda_version']!r}; "
                f"known: {', '.join(host_catalog['cuda']['versions'])}",
            )
        )
    try:
        branch = int(values["driver_branch"])
    except ValueError:
        problems.append(
            Problem(
                host,
                "driver_branch",
                f"must be a branch number like '570', got {values['driver_branch']!r}",
            )
        )
    else:
        for name, message in compat.check(
            values["gpu_model"],
            branch,
            values["driver_kernel_modules"],
            values["cuda_version"],
            skip=invalid,
        ):
            if not any(p.key == name and p.message == message for p in problems):
                problems.append(Problem(host, name, message))

    problems += _backend_problems(host, values, host_catalog, invalid)

    errors = [p for p in problems if p.severity == "error"]
    config = None if errors else HostConfig(host, values, host_catalog)
    return config, problems


def _override_problem(host_catalog: dict[str, Any], path: Any, value: Any) -> str | None:
    """Why one catalog_overrides entry is refused, or None. A number in the catalog (a model's
    context, weights_gib, sampling) stays a number of the same kind, and is never negative."""
    if not isinstance(path, str):
        return f"keys are dotted catalog paths, got {type(path).__name__} {path!r}"
    try:
        current = catalog.get_path(host_catalog, path)
    except catalog.CatalogError as exc:
        near = difflib.get_close_matches(exc.path, catalog.leaf_paths(), n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return f"{exc}{hint}"
    if isinstance(current, dict):
        return str(catalog.CatalogError(path, "is a section, not a value"))
    if isinstance(current, int | float) and not isinstance(current, bool):
        whole = isinstance(current, int)
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
            kind = "int" if whole else "int or float"
            return f"{path!r} must be {kind}, got {type(value).__name__} {value!r}"
        if value < 0:
            return f"{path!r} must be at least 0, got {value!r}"
    return None


def _backend_problems(
    host: str, values: dict[str, Any], host_catalog: dict[str, Any], invalid: set[str]
) -> list[Problem]:
    """The model and backend rules (compat.check_backend) and whether the model fits. A rule
    that reads a refused key (``invalid``) is skipped."""

    def valid(*names: str) -> bool:
        return invalid.isdisjoint(names)

    if values["backend"] == "none" or not valid("backend"):
        return []
    models = host_catalog["models"]
    model = models.get(values["model"])
    if not valid("model"):
        return []
    if model is None:
        return [
            Problem(
                host,
                "model",
                f"unknown model {values['model']!r}; known: {', '.join(sorted(models))}",
            )
        ]
    # A refused override of this model's entry (context, weights_gib, ...): the rules that read
    # the entry's numbers would judge the catalog's instead of the host's.
    entry = f"catalog_overrides:models.{values['model']}."
    if any(name.startswith(entry) for name in invalid):
        invalid = invalid | {"model_ctx"}
    problems: list[Problem] = []
    if (
        valid("model_source", "model_url")
        and values["model_source"] == "url"
        and not values["model_url"]
    ):
        problems.append(Problem(host, "model_url", "model_source is 'url' but model_url is unset"))
    if valid("model_repo") and values["model_repo"] is not None:
        if not MODEL_REPO.fullmatch(values["model_repo"]):
            problems.append(
                Problem(
                    host,
                    "model_repo",
                    f"must be a repository id like 'owner/name', got {values['model_repo']!r}",
                )
            )
        elif valid("model_source") and values["model_source"] == "url":
            problems.append(
                Problem(
                    host,
                    "model_repo",
                    "is not used with model_source 'url' (model_url is)",
                    severity="warning",
                )
            )
    quantization = values["model_quantization"] or model["quantization"]
    vllm_version = ""
    if values["backend"] == "vllm":
        # What the vLLM unit runs: the image's tag, its CUDA, the checkpoint and whether it
        # fits (gpubox.vllm_rules); compat judges the version and quantisation it reports.
        vllm_version, findings = vllm_rules.check(values, host_catalog, model, skip=invalid)
        problems += [Problem(host, f.key, f.message, f.severity) for f in findings]
        flag = vllm_rules.quantization_flag(model)
        quantization = values["model_quantization"] or (flag.replace("_", "-") if flag else "fp16")
    tensor_parallel = values["vllm_tensor_parallel"] or values["gpu_count"]
    for key, message in compat.check_backend(
        values["gpu_model"],
        values["gpu_count"],
        values["backend"],
        quantization,
        vllm_version,
        tensor_parallel,
        values["model_ctx"],
        model["context"],
        skip=invalid,
    ):
        problems.append(Problem(host, key, message))
    if values["backend"] == "llamacpp":
        problems += [
            Problem(host, k, m) for k, m in _llamacpp_problems(values, host_catalog, valid)
        ]
    gpu = compat.GPU_MODELS.get(values["gpu_model"])
    if (
        gpu
        and valid("gpu_model", "gpu_count", "model_ctx", "llamacpp_cuda")
        and values["backend"] == "llamacpp"
        and values["llamacpp_cuda"]
    ):
        need_mib = (
            model["weights_gib"] * 1024 + model["kv_mib_per_1k_ctx"] * values["model_ctx"] / 1024
        )
        have_mib = gpu.memory_mib * values["gpu_count"] * 0.95
        if need_mib > have_mib:
            problems.append(
                Problem(
                    host,
                    "model_ctx",
                    f"{values['model']} with context {values['model_ctx']} needs about "
                    f"{need_mib / 1024:.0f} GiB of GPU memory; {values['gpu_count']}x {gpu.name} "
                    f"have {have_mib / 1024:.0f} GiB usable: lower model_ctx",
                )
            )
    return problems


def _arg_values(args: list[Any], *names: str) -> list[str]:
    """The values given to any of ``names`` in an argument list ("-c 0" or "-c=0")."""
    found = []
    for i, arg in enumerate(str(a) for a in args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found.append(str(args[i + 1]))
            elif arg.startswith(name + "="):
                found.append(arg[len(name) + 1 :])
    return found


def _llamacpp_problems(
    values: dict[str, Any], host_catalog: dict[str, Any], valid: Callable[..., bool]
) -> list[tuple[str, str]]:
    """llama.cpp's rules: a pinned source, a per-slot context that holds a thinking answer,
    and what each split mode needs. (key, message) pairs."""
    found: list[tuple[str, str]] = []
    llama = host_catalog["llamacpp"]
    sha256 = str(llama["sha256"])
    if not sha256:
        found.append(
            (
                "catalog_overrides",
                "llamacpp.sha256 is empty: set it to the sha256 its publisher gives for the "
                "file at llamacpp.url (nothing is downloaded unverified)",
            )
        )
    elif len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        found.append(
            (
                "catalog_overrides",
                f"llamacpp.sha256 must be 64 lowercase hex digits, got {sha256!r}",
            )
        )
    extra = [str(a) for a in values["llamacpp_extra_args"]]
    model = host_catalog["models"][values["model"]]
    thinking = model.get("thinking_output_tokens") or 0
    # The sandbox's tiny model (a model_file of its own) is not the catalog's thinking model.
    serves_catalog_file = values["model_file"] in (None, model["file"])
    if serves_catalog_file and valid("model_ctx", "model_parallel", "llamacpp_extra_args"):
        unified = not {"-no-kvu", "--no-kv-unified"} & set(extra)
        per_slot = (
            values["model_ctx"] if unified else values["model_ctx"] // values["model_parallel"]
        )
        if per_slot < thinking:
            how = (
                "with the unified KV cache each slot gets all of model_ctx"
                if unified
                else f"without the unified KV cache each slot gets model_ctx / model_parallel "
                f"({values['model_ctx']} / {values['model_parallel']})"
            )
            found.append(
                (
                    "model_ctx",
                    f"{values['model']} may think for {thinking} tokens (its model card's output "
                    f"budget), but a slot holds {per_slot} tokens ({how}): raise model_ctx"
                    + ("" if unified else " or lower model_parallel"),
                )
            )
    if not valid("llamacpp_split_mode", "llamacpp_extra_args", "gpu_count"):
        return found
    mode = values["llamacpp_split_mode"]
    if _arg_values(extra, "-sm", "--split-mode"):
        found.append(("llamacpp_extra_args", "sets -sm: use llamacpp_split_mode instead"))
    if mode in ("row", "tensor") and values["gpu_count"] < 2:
        found.append(
            (
                "llamacpp_split_mode",
                f"{mode!r} splits each layer across the GPUs: it needs gpu_count 2 or more "
                f"(got {values['gpu_count']}); use 'layer'",
            )
        )
    if mode == "tensor":
        # llama.cpp's tensor split refuses to start without FlashAttention and needs an f16
        # KV cache and an explicit context; gpubox passes -fa on -ctk f16 -ctv f16 -c model_ctx.
        fa = [v for v in _arg_values(extra, "-fa", "--flash-attn") if v != "on"]
        if fa:
            found.append(
                (
                    "llamacpp_extra_args",
                    f"llamacpp_split_mode 'tensor' needs FlashAttention on; the extra args set "
                    f"-fa {fa[-1]}",
                )
            )
        kv = [
            v
            for v in _arg_values(extra, "-ctk", "--cache-type-k", "-ctv", "--cache-type-v")
            if v != "f16"
        ]
        if kv:
            found.append(
                (
                    "llamacpp_extra_args",
                    f"llamacpp_split_mode 'tensor' needs an f16 KV cache; the extra args ask for "
                    f"{kv[-1]}",
                )
            )
        if values["model_ctx"] <= 0 or "0" in _arg_values(extra, "-c", "--ctx-size"):
            found.append(
                (
                    "model_ctx",
                    "llamacpp_split_mode 'tensor' needs an explicit context: set model_ctx, "
                    "and no -c 0 in llamacpp_extra_args",
                )
            )
    return found


def load_host_config(host: str, data: Mapping[str, Any]) -> HostConfig:
    config, problems = validate(host, data)
    if config is None:
        raise ConfigError([p for p in problems if p.severity == "error"])
    return config
