"""gunicorn's settings and hooks: the one source for ``switchboard serve`` and for
``gunicorn -c gunicorn.conf.py wsgi:app`` (which reads the same ``SWITCHBOARD_*`` environment).

- Metrics (SPEC §9): before any worker starts, the master empties this server's
  ``PROMETHEUS_MULTIPROC_DIR`` (under the data directory unless set) and exports it, so every
  worker's counters land in files a scrape adds up; a worker that exits is marked dead.
- Graceful shutdown: on SIGTERM a worker stops accepting, ends its open MCP streams at once
  (each sends its closing event) and finishes the requests in flight, for at most
  ``GRACEFUL_TIMEOUT`` seconds.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from switchboard import config as configmod

if TYPE_CHECKING:
    from switchboard.mcp.streams import Streams

GRACEFUL_TIMEOUT = 20  # seconds a stopping worker gives its requests in flight
WORKER_TIMEOUT = 60  # seconds of silence before the master replaces a stuck worker


def settings(config: configmod.Config) -> dict[str, Any]:
    """Every gunicorn setting Switchboard uses, from its configuration."""
    return {
        "bind": config.bind,
        "workers": config.workers,
        "threads": config.threads,
        "worker_class": "gthread",
        "graceful_timeout": GRACEFUL_TIMEOUT,
        "timeout": WORKER_TIMEOUT,
        "accesslog": None,
        "on_starting": on_starting,
        "post_worker_init": post_worker_init,
        "child_exit": child_exit,
    }


def metrics_dir(data_dir: Path, bind: str) -> Path:
    """``PROMETHEUS_MULTIPROC_DIR`` if set, else one directory per listening address under the
    data directory (two servers on one host never share one)."""
    configured = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if configured:
        return Path(configured)
    return data_dir / "prometheus" / re.sub(r"[^A-Za-z0-9.-]", "_", bind)


def prepare_metrics_dir(directory: Path) -> None:
    """Create the directory, drop the files of a previous run, export it to the workers."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)


def on_starting(server: Any) -> None:
    """Master, before the first worker: the metrics directory, fresh."""
    config = configmod.load()
    prepare_metrics_dir(metrics_dir(config.data_dir, server.cfg.bind[0]))


def child_exit(server: Any, worker: Any) -> None:
    """Master, a worker exited: its live gauges stop counting (its counters stay summed)."""
    from prometheus_client import multiprocess

    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        multiprocess.mark_process_dead(worker.pid, directory)  # type: ignore[no-untyped-call]


def post_worker_init(worker: Any) -> None:
    """Worker, app loaded: SIGTERM also ends the app's MCP streams and live board pages, which
    would otherwise hold the worker for the whole graceful timeout."""
    from switchboard.views.board import live_of

    streams = mcp_streams(worker.wsgi)
    live = live_of(worker.wsgi)
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        for each in streams:
            each.close()
        if live is not None:
            live.close()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)


def mcp_streams(app: Any) -> list[Streams]:
    """The MCP streams of the app (none for anything that is not the Flask app)."""
    from switchboard.mcp.server import McpServer

    extensions = getattr(app, "extensions", {})
    return [ext.streams for ext in extensions.values() if isinstance(ext, McpServer)]
