"""Pure: a catalog repository's apt source line and the placeholders its URL, suite and key URL
are written with (the distribution, its version, its codename). The stage that adds the
repository (gpubox.ops.apt_repo), the preflight's query (gpubox.rules.offers,
gpubox.preflight.answers) and
the driver replacement's simulation all write the same line."""

from __future__ import annotations

from gpubox.config import HostConfig, Target


def placeholders(target: Target, os_release: dict[str, str] | None = None) -> dict[str, str]:
    codename = (os_release or {}).get("VERSION_CODENAME") or {
        "ubuntu-24.04": "noble",
        "debian-12": "bookworm",
    }.get(f"{target.os_id}-{target.version_id}", "")
    return {
        "distro": target.distro,
        "os_id": target.os_id,
        "version_id": target.version_id,
        "codename": codename,
    }


def source_line(config: HostConfig, name: str, target: Target) -> str:
    repo = config.catalog["repos"][name]
    values = placeholders(target)
    url = repo["url"].replace("$(ARCH)", "\0").format(**values).replace("\0", "$(ARCH)")
    suite = repo["suite"].format(**values)
    component = f" {repo['component']}" if repo.get("component") else ""
    return f"deb [signed-by={repo['keyring']}] {url} {suite}{component}\n"
