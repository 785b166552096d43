"""ModelScope's endpoint as the real `modelscope` client takes it: the host name of an HTTPS
server, to which the client adds ``https://`` itself.

- modelscope 1.20 to 1.37 (modelscope/hub/utils/utils.py ``get_endpoint``, and
  modelscope/hub/file_download.py ``get_file_download_url``): ``'https://' + MODELSCOPE_DOMAIN``,
  whatever the variable holds, so a URL there asks ``https://https://www.modelscope.cn``.
- modelscope 1.38 and later hand the CLI to modelscope-hub (0.5.1 read:
  modelscope_hub/config.py ``HubConfig.__post_init__``, ``normalize_endpoint``):
  ``MODELSCOPE_ENDPOINT`` (a URL) first, then the deprecated ``MODELSCOPE_DOMAIN``, ``https://``
  added to either when it has no scheme.

So the download names the host twice (``env``), and a mirror must be HTTPS: an ``http://``
endpoint would become ``https://http://...`` for the older clients."""

from __future__ import annotations

import re

# The catalog's key (a user sets it through catalog_overrides).
KEY = "'modelscope.endpoint'"
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:\d{1,5})?")


def domain(endpoint: str) -> str:
    """The ``host[:port]`` of a ModelScope endpoint given as ``https://host[:port][/]`` or as
    the bare host. ValueError, naming the key, for ``http://`` (the client speaks HTTPS only),
    a path, or anything that is not a host name."""
    value = endpoint.strip()
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "https", value
    if scheme.lower() == "http":
        raise ValueError(
            f"{KEY} is {endpoint!r}: the modelscope client speaks HTTPS only (it puts "
            "https:// in front of the host), so a ModelScope mirror must serve HTTPS; "
            "give its https:// URL or its host name (docs/models.md)"
        )
    if scheme.lower() != "https":
        raise ValueError(f"{KEY} is {endpoint!r}: give an https:// URL or a host name")
    host = rest.rstrip("/")
    if not _HOST.fullmatch(host):
        raise ValueError(
            f"{KEY} is {endpoint!r}: give the server's https:// URL without a path "
            "(https://host or https://host:port) or its host name"
        )
    return host


def env(endpoint: str) -> dict[str, str]:
    """The variables that point every modelscope release at ``endpoint``: the host for 1.20
    to 1.37 (``MODELSCOPE_DOMAIN``), the URL for modelscope-hub (``MODELSCOPE_ENDPOINT``,
    which it reads before the deprecated ``MODELSCOPE_DOMAIN``, so it does not warn)."""
    host = domain(endpoint)
    return {"MODELSCOPE_DOMAIN": host, "MODELSCOPE_ENDPOINT": f"https://{host}"}
