"""Origin and Host checks for ``/mcp`` (DNS-rebinding protection, transport security).

A browser page on another origin must not reach the endpoint: ``Origin``, when present, must
be the public URL's origin (under any loopback name when it is a loopback URL) or an allowed
one (else 403). ``Host`` must name the public URL's host, an allowed origin's host, or — when
Switchboard is bound to or reached over loopback — a loopback name (else 421). Ports are not
compared for Host: a reverse proxy may drop or rewrite them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Rejection:
    """Why a request was refused, and the HTTP status to refuse it with."""

    status: int
    message: str


def origin_of(url: str) -> str | None:
    """``scheme://host:port`` of a URL (default port made explicit), or None if malformed."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    port = port if port is not None else _DEFAULT_PORTS[parts.scheme]
    return f"{parts.scheme}://{_bracket(parts.hostname.lower())}:{port}"


def host_name(host_header: str) -> str:
    """The host name of a Host header value, without port or IPv6 brackets, lower-cased."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class OriginPolicy:
    """The origins and host names a deployment answers to."""

    def __init__(self, public_url: str, allowed_origins: Iterable[str], bind_host: str) -> None:
        urls = [public_url, *allowed_origins]
        origins = {o for o in (origin_of(url) for url in urls) if o is not None}
        self.hosts = {host_name(urlsplit(url).netloc) for url in urls}
        public = urlsplit(public_url)
        if host_name(public.netloc) in LOOPBACK_HOSTS or host_name(bind_host) in LOOPBACK_HOSTS:
            self.hosts |= LOOPBACK_HOSTS
            # The same server under its other loopback names (localhost vs 127.0.0.1).
            port = public.port or (443 if public.scheme == "https" else 80)
            origins |= {f"{public.scheme}://{_bracket(h)}:{port}" for h in LOOPBACK_HOSTS}
        self.origins = frozenset(origins)

    def check(self, *, host: str | None, origin: str | None) -> Rejection | None:
        """None when the request may proceed, else the rejection."""
        if origin is not None and origin_of(origin) not in self.origins:
            return Rejection(403, f"Forbidden: origin {origin!r} is not allowed")
        if host is not None and host_name(host) not in self.hosts:
            return Rejection(421, f"Misdirected Request: host {host!r} is not served here")
        return None
