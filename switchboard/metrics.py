"""``/metrics`` (SPEC §9): request metrics, the claim counters and the scrape-time gauges.

Correct under several gunicorn workers: with ``PROMETHEUS_MULTIPROC_DIR`` set (``switchboard
serve`` and ``gunicorn.conf.py`` set it before any worker starts) every counter lives in a
per-process file, and a scrape, served by any worker, adds them all up. The gauges are not
counters: each scrape reads them from PostgreSQL in a fixed number of statements (two, however
many queues there are), so any worker of any container reports the same values.

The claim counters are incremented by :func:`counts_claims`, which wraps the claim services:
those return only after their transactions committed, so a counted claim is a committed one
and ``switchboard_todos_claimed_total`` rises exactly as ``admission_windows.used`` (R-CHARGE).
Labels name endpoints by slug and queues by name.
"""

from __future__ import annotations

import functools
import hmac
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

import psycopg
from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CollectorRegistry, Counter, multiprocess, values
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_flask_exporter import PrometheusMetrics  # type: ignore[import-untyped]

from switchboard.admission import service as admission
from switchboard.db import Database
from switchboard.errors import AdmissionUnavailable, Deferred, Unauthorized
from switchboard.models import TODO_STATES, Claim
from switchboard.store import metrics as store

log = logging.getLogger(__name__)

bp = Blueprint("metrics", __name__)
_KEY = "switchboard.metrics"
_CHALLENGE = 'Bearer realm="metrics"'

# The claim counters of this process (the default registry is left alone: several apps may be
# built in one test process). In multiprocess mode their values live in the directory's files.
COUNTERS = CollectorRegistry(auto_describe=True)
CLAIMED = Counter(
    "switchboard_todos_claimed",
    "Committed claims (every one is charged when its queue has a window limit)",
    ["endpoint", "queue"],
    registry=COUNTERS,
)
ATTEMPTS = Counter(
    "switchboard_todo_attempts",
    "Committed claims by attempt kind (first, retry, takeover, reclaim)",
    ["endpoint", "queue", "kind"],
    registry=COUNTERS,
)
CHARGED = Counter(
    "switchboard_admission_charged",
    "Claims that spent one unit of their queue's window limit",
    ["endpoint", "queue"],
    registry=COUNTERS,
)
REFUSED = Counter(
    "switchboard_admission_refused",
    "Queues a claim answer held back, by reason (one per deferred item or deferred error)",
    ["endpoint", "queue", "reason"],
    registry=COUNTERS,
)
COLLECTION_ERRORS = Counter(
    "switchboard_collection_errors",
    "Scrapes whose database read for a collector failed (the scrape still answers)",
    ["collector"],
    registry=COUNTERS,
)

# --- counting claims -------------------------------------------------------------------------

P = ParamSpec("P")
R = TypeVar("R")


def counts_claims(claim: Callable[P, R]) -> Callable[P, R]:
    """Count what a claim service answered. The service returns (or raises) only after its
    transactions ended, so every count is of a committed claim or a refusal sent.

    The claim path reads nothing for this (R-ZERO): counters carry the endpoint's id, and a
    scrape turns ids into slugs (see :class:`EndpointSlugs`)."""

    @functools.wraps(claim)
    def counted(*args: P.args, **kwargs: P.kwargs) -> R:
        db: Database = args[0] if args else kwargs["db"]  # type: ignore[assignment]
        try:
            outcome = claim(*args, **kwargs)
        except (Deferred, AdmissionUnavailable) as refusal:
            _count_refusal(db, kwargs, refusal.details)
            raise
        _count_answer(kwargs, outcome)
        return outcome

    return counted


def _count_answer(kwargs: Mapping[str, Any], outcome: Any) -> None:
    claim = getattr(outcome, "claim", None)
    if isinstance(claim, Claim):
        todo = claim.todo
        endpoint = str(todo.endpoint_id)
        CLAIMED.labels(endpoint, todo.queue).inc()
        ATTEMPTS.labels(endpoint, todo.queue, claim.kind).inc()
        headroom = getattr(outcome, "headroom", None)
        if headroom is not None and headroom.max_claims_per_window is not None:
            CHARGED.labels(endpoint, todo.queue).inc()
        return
    for item in getattr(outcome, "deferred", None) or []:
        REFUSED.labels(str(kwargs["endpoint_id"]), item.queue, item.reason).inc()


def _count_refusal(db: Database, kwargs: Mapping[str, Any], details: Mapping[str, Any]) -> None:
    endpoint_id = kwargs.get("endpoint_id") or _todo_endpoint(db, kwargs["id"])
    REFUSED.labels(str(endpoint_id), details["queue"], details["reason"]).inc()


def _todo_endpoint(db: Database, todo_id: UUID) -> UUID | str:
    """The endpoint of a todo the board's claim refused (that caller names only the todo)."""
    try:
        with db.statement() as conn:
            return store.todo_endpoint(conn, id=todo_id) or "unknown"
    except psycopg.Error as exc:  # the refusal is answered already: never turn it into an error
        log.warning("metrics: cannot read the endpoint of todo %s: %s", todo_id, exc)
        return "unknown"


class EndpointSlugs:
    """The counters of ``source`` with each endpoint id label replaced by the endpoint's slug:
    one statement per scrape, however many endpoints."""

    def __init__(self, db: Database, source: Any) -> None:
        self.db = db
        self.source = source

    def collect(self) -> Iterator[Metric]:
        families = list(self.source.collect())
        ids = {
            sample.labels["endpoint"]
            for family in families
            for sample in family.samples
            if "endpoint" in sample.labels
        }
        slugs = self._slugs(ids)
        for family in families:
            family.samples = [
                sample._replace(labels=_relabel(sample.labels, slugs)) for sample in family.samples
            ]
            yield family

    def _slugs(self, ids: set[str]) -> dict[str, str]:
        known = [UUID(id) for id in ids if _is_uuid(id)]
        if not known:
            return {}
        try:
            with self.db.statement() as conn:
                return {str(id): slug for id, slug in store.endpoint_slugs(conn, ids=known)}
        except psycopg.Error as exc:
            log.warning("metrics: the endpoint slugs could not be read: %s", exc)
            COLLECTION_ERRORS.labels("endpoints").inc()
            return {}


def _relabel(labels: dict[str, str], slugs: Mapping[str, str]) -> dict[str, str]:
    if "endpoint" not in labels:
        return labels
    return {**labels, "endpoint": slugs.get(labels["endpoint"], labels["endpoint"])}


def _is_uuid(text: str) -> bool:
    try:
        UUID(text)
    except ValueError:
        return False
    return True


# --- the scrape-time gauges ------------------------------------------------------------------


class QueueCollector:
    """Todos by state and the oldest pending age of every queue (one statement per scrape)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        try:
            with self.db.statement() as conn:
                rows = store.queue_gauges(conn)
        except psycopg.Error as exc:
            log.warning("metrics: the queue gauges could not be read: %s", exc)
            COLLECTION_ERRORS.labels("queues").inc()
            return
        todos = GaugeMetricFamily(
            "switchboard_queue_todos", "Todos per queue by state", labels=[*_QUEUE, "state"]
        )
        age = GaugeMetricFamily(
            "switchboard_queue_oldest_pending_age_seconds",
            "Seconds the oldest pending todo of the queue has waited (0: none pending)",
            labels=_QUEUE,
        )
        for row in rows:
            for state in TODO_STATES:
                todos.add_metric([row.endpoint, row.queue, state], getattr(row, state))
            age.add_metric([row.endpoint, row.queue], row.oldest_pending_age_seconds or 0.0)
        yield todos
        yield age


_QUEUE = ["endpoint", "queue"]
_ADMISSION_GAUGES = {
    "limit": "The queue's max_claims_per_window",
    "used": "Claims charged in the queue's current window",
    "remaining": "Claims left in the queue's current window",
    "in_flight": "Todos of the queue claimed now",
    "in_flight_cap": "The queue's max_in_flight",
    "window_resets_at_seconds": "When the current window ends (Unix time)",
    "deferred_pending": "Claimable todos held back because the queue is deferred (0: open)",
}


class AdmissionCollector:
    """Every budgeted queue's limit, usage, in-flight, cap, window end and deferred work,
    derived at read time exactly as the API's status is (one statement per scrape)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        try:
            with self.db.statement() as conn:
                rows = store.admission_gauges(conn)
        except psycopg.Error as exc:
            log.warning("metrics: the admission gauges could not be read: %s", exc)
            COLLECTION_ERRORS.labels("admission").inc()
            return
        families = {
            name: GaugeMetricFamily(f"switchboard_admission_{name}", text, labels=_QUEUE)
            for name, text in _ADMISSION_GAUGES.items()
        }
        for row in rows:
            for name, value in _admission_values(row).items():
                if value is not None:
                    families[name].add_metric([row.endpoint, row.state.queue], value)
        yield from families.values()


def _admission_values(row: store.PolicyGauge) -> dict[str, float | None]:
    verdict = admission.evaluate(row.state)  # window bounds via admission.windows
    resets_at = verdict.window_resets_at
    return {
        "limit": row.state.max_claims_per_window,
        "used": verdict.used,
        "remaining": verdict.remaining,
        "in_flight": row.state.in_flight,
        "in_flight_cap": row.state.max_in_flight,
        "window_resets_at_seconds": resets_at.timestamp() if resets_at is not None else None,
        "deferred_pending": row.waiting if verdict.deferred else 0,
    }


# --- the endpoint ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _State:
    db: Database
    token: str | None
    requests: CollectorRegistry  # this app's request metrics (outside multiprocess mode)


def multiprocess_dir() -> str | None:
    """The multiprocess directory when metrics are shared by several processes."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def init_app(app: Flask, db: Database, *, token: str | None = None) -> None:
    """Track the app's requests and serve ``/metrics`` (bearer ``token`` when given).

    Raises RuntimeError when a multiprocess directory is set but prometheus_client was
    imported before it was (its counters would then count this process only)."""
    if multiprocess_dir() and values.ValueClass is values.MutexValue:
        raise RuntimeError(
            "PROMETHEUS_MULTIPROC_DIR was set after prometheus_client was imported: "
            "set it before the application is loaded"
        )
    for collector in ("admission", "queues", "endpoints"):
        COLLECTION_ERRORS.labels(collector)  # exported as 0 until a read fails
    requests = CollectorRegistry()
    PrometheusMetrics(app, path=None, registry=requests, group_by="url_rule")
    app.extensions[_KEY] = _State(db, token, requests)
    app.register_blueprint(bp)


@bp.after_request
def _challenge(response: Response) -> Response:
    if response.status_code == 401:
        response.headers["WWW-Authenticate"] = _CHALLENGE
    return response


@bp.get("/metrics")
def scrape() -> Response:
    """The Prometheus exposition of this deployment (every worker's counters)."""
    state: _State = current_app.extensions[_KEY]
    if state.token is not None and not _authorized(state.token):
        raise Unauthorized("/metrics needs its bearer token")
    registry = CollectorRegistry()
    # The database collectors first: a read failure they count is in this very scrape.
    registry.register(QueueCollector(state.db))
    registry.register(AdmissionCollector(state.db))
    if (directory := multiprocess_dir()) is not None:
        every_process = multiprocess.MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]
        registry.register(EndpointSlugs(state.db, every_process))
    else:
        registry.register(EndpointSlugs(state.db, COUNTERS))
        registry.register(state.requests)
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return Response(encode(registry), 200, {"Content-Type": content_type})


def _authorized(token: str) -> bool:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())
