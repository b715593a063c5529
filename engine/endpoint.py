"""A server's base URL as the remote backend and the settings take it: checked, normalised, and whether it is
plain http to another machine. A leaf (the standard library only), so `engine.config` checks `endpoint` without
importing a backend.
"""

from __future__ import annotations

from urllib.parse import urlsplit

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0")


def normalize_endpoint(url: str) -> str:
    """The server's base URL (no trailing slash, no trailing /v1); ValueError with a one-line reason."""
    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"endpoint {url!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8080)")
    if parts.username or parts.password:
        raise ValueError(
            "endpoint must not carry a user or password: put the API key in an environment variable "
            "and pass --api-key-env VAR"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"endpoint {url!r} must be a base URL without ?query or #fragment")
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base


def insecure_warning(url: str) -> str | None:
    """A warning for plain http:// to a host other than this machine (the API key and chat go in clear)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme == "http" and host not in LOCAL_HOSTS and not host.startswith("127."):
        return f"warning: {host} is not this machine and the endpoint is plain http: the chat and API key travel unencrypted"
    return None
