"""The repair helpers and build rules, run for real in a temporary directory:

- gpubox.infra.host_facts.MissingPackageFiles' command against a dpkg database of its own (the real
  dpkg-query, pointed at it with --admindir): a deleted file of an installed package is
  named with its package and installed version; packages not installed are left out;
- the build manifests (manifest_command / ManifestProblems) of gpu-burn and llama.cpp;
- llama.cpp's build command (issue 8 item E) with curl, cmake and cp replaced by scripts: a
  build killed midway or failing leaves no marker, and bin/ is never a half-built tree;
- gpu-burn's build command, likewise."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpubox.infra.host_facts import ManifestProblems, MissingPackageFiles, manifest_command
from gpubox.plans import llamacpp as plan_llamacpp
from gpubox.stages import llamacpp_build
from gpubox.stages import tools as tools_stage


def sh(command: str, path_prefix: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    return subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, env=env, timeout=60
    )


def script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


# --------------------------------------------------------------------------- package files


@pytest.fixture
def dpkg(tmp_path):
    """A dpkg database: cuda-nvcc-12-8 installed, cuda-cudart-12-8 held, old-cuda removed
    (config files only), each shipping files under tmp_path/root; dpkg-query on PATH reads
    it."""
    root = tmp_path / "root"
    admin = tmp_path / "admin"
    (admin / "info").mkdir(parents=True)
    (admin / "updates").mkdir()
    prefix = root / "usr/local/cuda-12.8"
    packages = {
        "cuda-nvcc-12-8": ("install ok installed", "12.8.93-1", ["bin/nvcc", "bin/ptxas"]),
        "cuda-cudart-12-8": (
            "hold ok installed",
            "12.8.90-1",
            ["targets/x86_64-linux/lib/libcudart.so.12.8.90"],
        ),
        "old-cuda": ("deinstall ok config-files", "1.0-1", ["bin/gone"]),
    }
    status = []
    for name, (state, version, files) in packages.items():
        status.append(
            f"Package: {name}\nStatus: {state}\nArchitecture: amd64\nVersion: {version}\n"
            "Maintainer: x\nDescription: x\n"
        )
        listed = ["/.", str(prefix)]
        for rel in files:
            path = prefix / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if state != "deinstall ok config-files":
                path.write_text(rel)
            listed += [str(path.parent), str(path)]
        (admin / "info" / f"{name}.list").write_text("\n".join(listed) + "\n")
    (admin / "status").write_text("\n".join(status))
    # the toolkit's lib64 -> targets/x86_64-linux/lib, as NVIDIA's packages have it
    (prefix / "lib64").symlink_to("targets/x86_64-linux/lib")
    script(
        tmp_path / "bin" / "dpkg-query",
        f'exec /usr/bin/dpkg-query --admindir={admin} "$@"\n',
    )
    return tmp_path / "bin", prefix


def missing(
    bin_dir: Path, packages=(), paths=(), config: Path | None = None
) -> list[tuple[str, str, str]]:
    fact = MissingPackageFiles()
    # dpkg's own configuration unless told: the tests' paths match none of its filters
    extra = {"dpkg_config": str(config)} if config else {}
    result = sh(fact.command(packages=tuple(packages), paths=tuple(paths), **extra), bin_dir)
    assert result.returncode == 0, result.stderr
    return fact.process(result.stdout.splitlines())


def test_every_file_there_reports_nothing(dpkg):
    bin_dir, prefix = dpkg
    assert missing(bin_dir, ["cuda-nvcc-12-8", "cuda-cudart-12-8", "libcublas-12-8"]) == []
    assert missing(bin_dir, paths=[str(prefix / "bin/nvcc")]) == []


def test_a_deleted_file_is_named_with_its_package_and_installed_version(dpkg):
    bin_dir, prefix = dpkg
    (prefix / "bin/nvcc").unlink()
    (prefix / "targets/x86_64-linux/lib/libcudart.so.12.8.90").unlink()
    assert missing(bin_dir, ["cuda-nvcc-12-8", "cuda-cudart-12-8", "libcublas-12-8"]) == [
        ("cuda-nvcc-12-8", "12.8.93-1", str(prefix / "bin/nvcc")),
        (
            "cuda-cudart-12-8",
            "12.8.90-1",
            str(prefix / "targets/x86_64-linux/lib/libcudart.so.12.8.90"),
        ),
    ]


def test_a_path_is_traced_to_its_owner_through_a_symlinked_directory(dpkg):
    bin_dir, prefix = dpkg
    (prefix / "targets/x86_64-linux/lib/libcudart.so.12.8.90").unlink()
    (prefix / "bin/nvcc").unlink()
    paths = [str(prefix / "lib64/libcudart.so.12.8.90"), str(prefix / "bin/nvcc")]
    assert missing(bin_dir, paths=paths) == [
        ("cuda-cudart-12-8", "12.8.90-1", paths[0]),
        ("cuda-nvcc-12-8", "12.8.93-1", paths[1]),
    ]


def test_packages_not_installed_and_files_nobody_owns_are_left_to_the_install(dpkg):
    bin_dir, prefix = dpkg
    assert missing(bin_dir, ["old-cuda", "nosuch"]) == []
    assert missing(bin_dir, paths=[str(prefix / "bin/gone"), "/nonexistent/nvidia-smi"]) == []


def test_files_dpkg_was_told_not_to_unpack_are_not_missing(dpkg, tmp_path):
    """Minimized Ubuntu images exclude /usr/share/doc but keep copyright files: a package's
    excluded docs must not be reinstalled at every deploy; an included file still counts."""
    bin_dir, _ = dpkg
    doc = tmp_path / "root/usr/share/doc/cuda-nvcc-12-8"
    with open(tmp_path / "admin/info/cuda-nvcc-12-8.list", "a") as f:
        f.write(f"{doc}\n{doc}/changelog.Debian.gz\n{doc}/copyright\n")
    config = tmp_path / "dpkg"
    (config / "dpkg.cfg.d").mkdir(parents=True)
    (config / "dpkg.cfg").write_text("# dpkg.cfg\n")
    (config / "dpkg.cfg.d" / "excludes").write_text(
        "# Drop all documentation ...\n"
        f"path-exclude={tmp_path}/root/usr/share/doc/*\n"
        "# ... except copyright files ...\n"
        f"path-include {tmp_path}/root/usr/share/doc/*/copyright\n"
    )
    assert missing(bin_dir, ["cuda-nvcc-12-8"], config=config) == [
        ("cuda-nvcc-12-8", "12.8.93-1", f"{doc}/copyright")
    ]
    assert [f for _, _, f in missing(bin_dir, ["cuda-nvcc-12-8"], config=tmp_path / "none")] == [
        str(doc),
        f"{doc}/changelog.Debian.gz",
        f"{doc}/copyright",
    ]


# --------------------------------------------------------------------------- manifests


def problems(manifest: Path) -> list[str]:
    fact = ManifestProblems()
    result = sh(fact.command(manifest=str(manifest)))
    assert result.returncode == 0
    return fact.process(result.stdout.splitlines())


def test_a_manifest_names_what_is_missing_or_resized(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").write_text("server")
    (tmp_path / "bin" / "libllama.so").write_text("library")
    (tmp_path / "bin" / "libggml.so").symlink_to("libllama.so")
    manifest = tmp_path / "BUILD-FILES"
    assert problems(manifest) == [str(manifest)]  # no manifest: nothing is known good
    result = sh(manifest_command(str(tmp_path), "BUILD-FILES", "bin/*"))
    assert result.returncode == 0, result.stderr
    assert problems(manifest) == []
    (tmp_path / "bin" / "llama-server").unlink()
    (tmp_path / "bin" / "libllama.so").write_text("lib")  # truncated
    assert problems(manifest) == ["bin/libllama.so", "bin/llama-server"]


def test_recording_a_missing_output_fails(tmp_path):
    result = sh(manifest_command(str(tmp_path), ".gpubox-files", "gpu_burn compare.fatbin"))
    assert result.returncode != 0
    assert not (tmp_path / ".gpubox-files").exists()


# --------------------------------------------------------------------------- llama.cpp build


def tarball(top: str, files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def curl_serving(tmp_path: Path, source: bytes) -> Path:
    """A folder of shims (tmp_path/bin) whose curl "downloads" ``source`` to its -o path;
    tmp_path/mode holds "ok" (the build shims read it)."""
    (tmp_path / "src.tar.gz").write_bytes(source)
    (tmp_path / "mode").write_text("ok")
    shims = tmp_path / "bin"
    script(
        shims / "curl",
        'while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n'
        f'cp {tmp_path}/src.tar.gz "$out"\n',
    )
    return shims


@pytest.fixture
def llama(tmp_path):
    """A llama.cpp build into tmp_path/opt with curl serving a source tarball and cmake
    replaced: `cmake --build` writes bin/llama-server and a library, or, with
    tmp_path/mode holding "kill", writes half a binary and kills the build's shell (a deploy
    cut short), or with "fail" exits 2."""
    source = tarball(
        "llama.cpp-b1",
        {
            "CMakeLists.txt": "project(llama)\n",
            # what the build's source check reads: CUDA graphs from compute capability 7.0
            "ggml/src/ggml-cuda/ggml-cuda.cu": (
                "static bool ggml_cuda_graph_set_enabled(void * c, const void * k) {\n"
                "    if (cc < GGML_CUDA_CC_VOLTA) { return false; }\n}\n"
            ),
            "ggml/src/ggml-cuda/gated_delta_net.cu": "\n",
        },
    )
    shims = curl_serving(tmp_path, source)
    script(
        shims / "cmake",
        'if [ "$1" = -S ]; then mkdir -p "$4"; exit 0; fi\n'
        'b=$2; mkdir -p "$b/bin"\n'
        f"mode=$(cat {tmp_path}/mode); n=$(cat {tmp_path}/n 2>/dev/null || echo 0)\n"
        f"echo $((n + 1)) > {tmp_path}/n\n"
        "case $mode in\n"
        '  kill) printf "#!/bin/sh\\necho half" > "$b/bin/llama-server"; '
        'chmod 755 "$b/bin/llama-server"; kill -KILL $PPID; exit 1;;\n'
        '  fail) echo "error: nvcc fatal" >&2; exit 2;;\n'
        "esac\n"
        'printf "#!/bin/sh\\necho build $((n + 1))\\n" > "$b/bin/llama-server"\n'
        'chmod 755 "$b/bin/llama-server"; printf "lib %s" "$n" > "$b/bin/libllama.so"\n'
        'cp "$b/bin/llama-server" "$b/bin/llama-bench"\n',
    )
    build = plan_llamacpp.LlamaBuild(
        tag="b1",
        build_number=1,
        url="http://127.0.0.1:9/b1.tar.gz",
        sha256=hashlib.sha256(source).hexdigest(),
        tree="",
        commit="",
        cuda=False,
        architectures="70",
        nvcc="/usr/local/cuda-12.8/bin/nvcc",
        ccache=False,
        prefix=str(tmp_path / "opt"),
    )
    return build, shims


def llama_build(build, shims) -> subprocess.CompletedProcess:
    (command,) = llamacpp_build.build_commands(build)
    return sh(command, shims)


def marker(build) -> str | None:
    path = Path(build.directory) / plan_llamacpp.BUILD_INFO
    return path.read_text().strip() if path.exists() else None


def served(build) -> str:
    return subprocess.run([build.binary], capture_output=True, text=True).stdout.strip()


def test_a_complete_build_records_its_marker_and_files(llama):
    build, shims = llama
    result = llama_build(build, shims)
    assert result.returncode == 0, result.stderr
    assert marker(build) == build.info
    assert served(build) == "build 1"
    assert problems(Path(build.directory) / plan_llamacpp.BUILD_FILES) == []


def test_a_build_killed_midway_leaves_no_marker_and_the_old_binary_served(llama, tmp_path):
    build, shims = llama
    assert llama_build(build, shims).returncode == 0
    (tmp_path / "mode").write_text("kill")
    killed = llama_build(build, shims)
    assert killed.returncode == -9
    # the half-built binary is in build/, never in bin/: the service still starts build 1
    assert served(build) == "build 1"
    assert (Path(build.directory) / "build/bin/llama-server").exists()
    # and with no marker the next deploy builds again (the stage compares it with the info)
    assert marker(build) is None
    (tmp_path / "mode").write_text("ok")
    assert llama_build(build, shims).returncode == 0
    assert marker(build) == build.info and served(build) == "build 3"


def test_a_first_build_killed_midway_leaves_nothing_to_serve(llama, tmp_path):
    build, shims = llama
    (tmp_path / "mode").write_text("kill")
    assert llama_build(build, shims).returncode == -9
    assert marker(build) is None and not Path(build.binary).exists()


def test_a_failing_build_or_copy_writes_no_marker(llama, tmp_path):
    build, shims = llama
    (tmp_path / "mode").write_text("fail")
    failed = llama_build(build, shims)
    assert failed.returncode == 2 and "nvcc fatal" in failed.stderr
    assert marker(build) is None
    # a copy that fails (a full disk): the marker used to be written after `cp && ...`
    (tmp_path / "mode").write_text("ok")
    script(
        shims / "cp",
        'case "$*" in *build/bin*) echo "cp: No space left" >&2; exit 1;; esac\n'
        'exec /bin/cp "$@"\n',
    )
    copy = llama_build(build, shims)
    assert copy.returncode != 0 and "No space left" in copy.stderr
    assert marker(build) is None and not Path(build.binary).exists()


def test_a_deleted_server_or_library_is_found_by_the_manifest(llama):
    build, shims = llama
    assert llama_build(build, shims).returncode == 0
    manifest = Path(build.directory) / plan_llamacpp.BUILD_FILES
    os.remove(build.binary)
    assert problems(manifest) == ["bin/llama-server"]
    assert marker(build) == build.info  # the marker alone would have said "built"
    assert llama_build(build, shims).returncode == 0
    assert problems(manifest) == []
    (Path(build.directory) / "bin/libllama.so").write_text("")
    assert problems(manifest) == ["bin/libllama.so"]


# --------------------------------------------------------------------------- gpu-burn build


@pytest.fixture
def gpu_burn(tmp_path):
    source = tarball("gpu-burn-abc", {"Makefile": "gpu_burn:\n"})
    shims = curl_serving(tmp_path, source)
    script(
        shims / "make",
        f'[ "$(cat {tmp_path}/mode)" = fail ] && {{ echo "nvcc: not found" >&2; exit 2; }}\n'
        'd=$2; printf "#!/bin/sh\\necho gpu_burn\\n" > "$d/gpu_burn"; chmod 755 "$d/gpu_burn"\n'
        'printf "fatbin sm_70" > "$d/compare.fatbin"\n',
    )
    build = tools_stage.GpuBurnBuild(
        commit="abc",
        url="http://127.0.0.1:9/abc.tar.gz",
        sha256=hashlib.sha256(source).hexdigest(),
        compute=70,
        cuda_prefix="/usr/local/cuda-12.8",
        directory=str(tmp_path / "gpu-burn" / "abc"),
    )
    return build, shims


def test_gpu_burn_build_records_its_outputs_and_a_deleted_one_is_found(gpu_burn, tmp_path):
    build, shims = gpu_burn
    (command,) = tools_stage.build_commands(build)
    assert sh(command, shims).returncode == 0
    d = Path(build.directory)
    manifest = d / tools_stage.MANIFEST
    assert (d / tools_stage.STAMP).read_text().strip() == build.stamp
    assert problems(manifest) == []
    (d / "gpu_burn").unlink()
    assert problems(manifest) == ["gpu_burn"]
    (tmp_path / "mode").write_text("fail")  # a failed rebuild leaves the old tree as it was
    assert sh(command, shims).returncode == 2
    assert problems(manifest) == ["gpu_burn"] and not (d.parent / "abc.new/.gpubox-build").exists()
    (tmp_path / "mode").write_text("ok")
    assert sh(command, shims).returncode == 0
    assert problems(manifest) == []
