"""Stand-in kernels of the sandbox box: what DKMS needs to build for a kernel.

The box is a container: it runs the host's kernel (``uname -r`` is the host's, e.g.
6.18.44-fc-v857), for which no Debian headers package exists. Debian's real dkms builds a
module only for a kernel whose headers are installed (``/lib/modules/<kernel>/build/include``),
and Debian's dkms postinst only for a kernel that is installed (``/lib/modules/<kernel>``).
So the box gets a stand-in of both for its running kernel (``install_kernel``, from the box
setup in rootfs.py), laid out like Debian's packages lay them out:

- ``linux-image``: ``/lib/modules/<kernel>/`` (empty ``modules.order``, ``modules.builtin``,
  ``modules.builtin.modinfo``, so that depmod runs quietly) and ``/boot/config-<kernel>``
  (Debian's dkms postinst finds the newest installed kernel there);
- ``linux-headers``: ``/usr/src/linux-headers-<kernel>/`` with ``.config`` (no PREEMPT_RT:
  NVIDIA's dkms.conf excludes real-time kernels), ``include/``, ``Module.symvers``, a Makefile
  that refuses to build anything, the ``build`` link in ``/lib/modules/<kernel>/``, and
  ``scripts/sign-file``: a link to the real one of Debian's ``linux-kbuild-6.1`` (installed in
  the box's root filesystem, as Debian's headers packages depend on it). Debian's dkms 3.0.10
  looks for ``/usr/lib/linux-kbuild-${kernelver%.*}/scripts/sign-file`` (for a 6.18.x kernel:
  linux-kbuild-6.18, absent), then ``/lib/modules/$kernelver/build/scripts/sign-file``: it
  finds this one and signs every module it builds with its MOK (/var/lib/dkms/mok.key,
  mok.pub, made on the first build). Its ``.config`` has Debian 12's module signing options
  (CONFIG_MODULE_SIG, sha256).

The stand-in NVIDIA module source (repo_driver.py, STANDINS.md) builds against any such tree
without compiling. ``box.plant_kernel`` adds a second stand-in kernel to a running box and
runs DKMS's kernel hooks as the kernel packages' postinst scripts would: the lead's
kernel-update test.
Nothing here is ever shipped to a real box.
"""

from __future__ import annotations

import re
from pathlib import Path

_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+_~-]*$")

CONFIG = """\
# gpubox sandbox stand-in kernel configuration for {version} (never shipped to a real box):
# the few options DKMS and NVIDIA's dkms.conf look at. CONFIG_PREEMPT_RT is not set.
CONFIG_LOCALVERSION=""
CONFIG_MODULES=y
CONFIG_MODULE_UNLOAD=y
CONFIG_MODVERSIONS=y
CONFIG_MODULE_SIG=y
CONFIG_MODULE_SIG_ALL=y
CONFIG_MODULE_SIG_SHA256=y
CONFIG_MODULE_SIG_HASH="sha256"
CONFIG_SMP=y
CONFIG_PREEMPT_VOLUNTARY=y
CONFIG_X86_64=y
CONFIG_DRM=m
"""

MAKEFILE = """\
# gpubox sandbox stand-in kernel headers for {version} (never shipped to a real box). There
# is no kernel source here: only the stand-in NVIDIA module (which does not compile) builds
# against this tree.
%:
\t@echo "gpubox sandbox stand-in kernel headers ({version}): nothing can be compiled here" >&2
\t@exit 2
"""

README = """\
gpubox sandbox stand-in kernel headers for {version} (never shipped to a real box).
The sandbox box runs the host's kernel, for which no headers package exists; this tree is
what Debian's dkms needs to see headers installed (include/, .config). See
gpubox/sandbox/kernel.py and STANDINS.md.
"""


# Debian 12's real sign-file (package linux-kbuild-6.1, in the box's root filesystem).
SIGN_FILE = "/usr/lib/linux-kbuild-6.1/scripts/sign-file"


class KernelError(ValueError):
    pass


def check_version(version: str) -> str:
    if not _VERSION.match(version) or ".." in version:
        raise KernelError(f"not a kernel version: {version!r}")
    return version


def kernel_files(version: str, headers: bool = True) -> dict[str, str]:
    """Path in the box (no leading slash) -> content of a stand-in kernel's files; the
    ``build`` link is made by ``install_kernel``."""
    check_version(version)
    files = {
        f"lib/modules/{version}/modules.order": "",
        f"lib/modules/{version}/modules.builtin": "",
        f"lib/modules/{version}/modules.builtin.modinfo": "",
        f"boot/config-{version}": CONFIG.format(version=version),
        # where linux-image puts the kernel: gpubox counts /boot/vmlinuz-* as bootable kernels
        f"boot/vmlinuz-{version}": f"gpubox sandbox stand-in kernel image {version}\n",
    }
    if headers:
        src = f"usr/src/linux-headers-{version}"
        files.update(
            {
                f"{src}/.config": CONFIG.format(version=version),
                f"{src}/Makefile": MAKEFILE.format(version=version),
                f"{src}/Module.symvers": "",
                f"{src}/README.gpubox-sandbox": README.format(version=version),
                f"{src}/include/config/kernel.release": version + "\n",
                f"{src}/include/generated/utsrelease.h": f'#define UTS_RELEASE "{version}"\n',
                f"{src}/arch/x86/Makefile": MAKEFILE.format(version=version),
                f"{src}/scripts/README.gpubox-sandbox": README.format(version=version),
            }
        )
    return files


def install_kernel(root: Path, version: str, headers: bool = True) -> list[str]:
    """Write a stand-in kernel (and its headers) into the box root filesystem ``root``;
    returns the paths written (in the box)."""
    written = []
    for rel, content in kernel_files(version, headers).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append("/" + rel)
    (root / f"lib/modules/{version}/kernel").mkdir(parents=True, exist_ok=True)
    if headers:
        build = root / f"lib/modules/{version}/build"
        if build.is_symlink() or build.exists():
            build.unlink()
        build.symlink_to(f"/usr/src/linux-headers-{version}")
        written.append(f"/lib/modules/{version}/build")
        sign_file = root / f"usr/src/linux-headers-{version}/scripts/sign-file"
        if sign_file.is_symlink() or sign_file.exists():
            sign_file.unlink()
        sign_file.symlink_to(SIGN_FILE)
        written.append(f"/usr/src/linux-headers-{version}/scripts/sign-file")
    return written
