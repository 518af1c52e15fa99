"""Configuration from the environment (``SWITCHBOARD_*`` and ``DATABASE_URL``)."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict


class ConfigError(Exception):
    """A configuration value is missing or malformed; the message is one line for the operator."""


@dataclass(frozen=True)
class Config:
    """Everything Switchboard reads from its environment, validated once at start."""

    database_url: str | None
    data_dir: Path
    secret_key: str
    bind: str
    workers: int
    threads: int
    default_lease_seconds: int
    default_max_attempts: int
    pool_min_size: int
    pool_max_size: int
    # The URL people and agents use to reach this server (printed at start, used for links;
    # its origin and host are what /mcp accepts in Origin and Host).
    public_url: str = "http://127.0.0.1:8080"
    # Further browser origins (scheme://host[:port]) allowed to call /mcp.
    allowed_origins: tuple[str, ...] = ()
    # Seconds between keep-alive comments on an idle MCP stream (and between its liveness checks).
    mcp_keepalive_seconds: int = 15
    # Open MCP streams (legacy GET, subscriptions/listen) per worker process; more get 503.
    mcp_max_streams: int = 4
    scheduler: bool = True  # SWITCHBOARD_SCHEDULER=off: this replica never leads the sweeps
    tick_seconds: int = 30
    # SWITCHBOARD_DOORBELLS=off: this process neither listens for nor pays doorbells (tools).
    doorbells: bool = True
    # Waiting work left unclaimed this long is rung again by the heartbeat sweep.
    bell_repeat_seconds: int = 300
    # Retention (SPEC §9): terminal todos (with their attempts and events) older than this go.
    retention_days: int = 30
    # Events and the policy audit older than this go (the events bound).
    events_retention_days: int = 90
    # A bearer token /metrics requires; None: /metrics is open (scrape it on a private network).
    metrics_token: str | None = None
    # X-Forwarded-* hops to trust (the reverse proxy in front); 0 when clients connect directly.
    proxy_hops: int = 1

    @property
    def embedded(self) -> bool:
        """True when Switchboard runs its own PostgreSQL (no DATABASE_URL)."""
        return self.database_url is None


_BIND = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw in ("on", "true", "1", "yes"):
        return True
    if raw in ("off", "false", "0", "no"):
        return False
    raise ConfigError(f"{name} must be on or off, got {raw!r}")


def _bind(env: Mapping[str, str]) -> str:
    bind = env.get("SWITCHBOARD_BIND") or "127.0.0.1:8080"
    match = _BIND.match(bind)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ConfigError(f"SWITCHBOARD_BIND must be HOST:PORT, got {bind!r}")
    return bind


_WILDCARD_HOSTS = frozenset({"0.0.0.0", "[::]"})


def _origin(value: str, name: str) -> str:
    """``scheme://host[:port]`` of an http(s) URL, lower-cased; raises ConfigError."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        raise ConfigError(f"{name} must be an http(s) URL, got {value!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(f"{name} must be an http(s) URL, got {value!r}")
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _public_url(env: Mapping[str, str], bind: str) -> str:
    """SWITCHBOARD_PUBLIC_URL, else ``http://<bind>`` (a wildcard bind host reads localhost)."""
    configured = (env.get("SWITCHBOARD_PUBLIC_URL") or "").strip()
    if configured:
        _origin(configured, "SWITCHBOARD_PUBLIC_URL")
        if urlsplit(configured).path not in ("", "/"):
            raise ConfigError(
                f"SWITCHBOARD_PUBLIC_URL must have no path (Switchboard serves at /), "
                f"got {configured!r}"
            )
        return configured.rstrip("/")
    host, _, port = bind.rpartition(":")
    return f"http://{'localhost' if host in _WILDCARD_HOSTS else host}:{port}"


def _allowed_origins(env: Mapping[str, str]) -> tuple[str, ...]:
    raw = env.get("SWITCHBOARD_ALLOWED_ORIGINS") or ""
    items = [item.strip() for item in raw.split(",") if item.strip()]
    origins = []
    for item in items:
        origin = _origin(item, "SWITCHBOARD_ALLOWED_ORIGINS")
        if urlsplit(item).path not in ("", "/"):
            raise ConfigError(f"SWITCHBOARD_ALLOWED_ORIGINS entries have no path, got {item!r}")
        origins.append(origin)
    return tuple(dict.fromkeys(origins))


def _secret_key(env: Mapping[str, str], data_dir: Path) -> str:
    """The configured key, else one generated once and kept in the data directory."""
    configured = env.get("SWITCHBOARD_SECRET_KEY")
    if configured:
        if len(configured) < 16:
            raise ConfigError("SWITCHBOARD_SECRET_KEY must be at least 16 characters")
        return configured
    path = data_dir / "secret_key"
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(48))
        return path.read_text().strip()
    except FileExistsError:  # another process created it first
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"SWITCHBOARD_DATA_DIR {data_dir} is not writable: {exc}") from None


def _metrics_token(env: Mapping[str, str]) -> str | None:
    token = (env.get("SWITCHBOARD_METRICS_TOKEN") or "").strip()
    if token and len(token) < 16:
        raise ConfigError("SWITCHBOARD_METRICS_TOKEN must be at least 16 characters")
    return token or None


def _database_url(env: Mapping[str, str]) -> str | None:
    url = env.get("DATABASE_URL") or None
    if url is None:
        return None
    error = "DATABASE_URL must be a postgresql:// URL or a libpq key=value string"
    if "://" in url and not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(error)
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise ConfigError(error) from None
    return url


def load(env: Mapping[str, str] | None = None) -> Config:
    """Read and validate the configuration; raises ConfigError with one clear line."""
    env = os.environ if env is None else env
    data_dir = Path(env.get("SWITCHBOARD_DATA_DIR") or "./var").expanduser().resolve()
    workers = _int(env, "SWITCHBOARD_WORKERS", 2, 1, 64)
    threads = _int(env, "SWITCHBOARD_THREADS", 8, 1, 256)
    bind = _bind(env)
    return Config(
        database_url=_database_url(env),
        data_dir=data_dir,
        secret_key=_secret_key(env, data_dir),
        bind=bind,
        workers=workers,
        threads=threads,
        default_lease_seconds=_int(env, "SWITCHBOARD_LEASE_SECONDS", 300, 1, 86400),
        default_max_attempts=_int(env, "SWITCHBOARD_MAX_ATTEMPTS", 5, 1, 100),
        pool_min_size=_int(env, "SWITCHBOARD_POOL_MIN", 1, 0, 100),
        pool_max_size=_int(env, "SWITCHBOARD_POOL_MAX", threads + 2, 1, 500),
        public_url=_public_url(env, bind),
        allowed_origins=_allowed_origins(env),
        mcp_keepalive_seconds=_int(env, "SWITCHBOARD_MCP_KEEPALIVE_SECONDS", 15, 1, 300),
        # Half the threads by default, so streams can never take every thread from claims.
        mcp_max_streams=_int(env, "SWITCHBOARD_MCP_STREAMS", max(1, threads // 2), 0, 256),
        scheduler=_switch(env, "SWITCHBOARD_SCHEDULER", True),
        tick_seconds=_int(env, "SWITCHBOARD_TICK_SECONDS", 30, 1, 3600),
        doorbells=_switch(env, "SWITCHBOARD_DOORBELLS", True),
        bell_repeat_seconds=_int(env, "SWITCHBOARD_BELL_REPEAT_SECONDS", 300, 10, 86400),
        retention_days=_int(env, "SWITCHBOARD_RETENTION_DAYS", 30, 1, 3650),
        events_retention_days=_int(env, "SWITCHBOARD_EVENTS_RETENTION_DAYS", 90, 1, 3650),
        metrics_token=_metrics_token(env),
        proxy_hops=_int(env, "SWITCHBOARD_PROXY_HOPS", 1, 0, 5),
    )
