"""Prometheus metrics of a consumer process (the ``prometheus`` extra: prometheus-client).

Every name starts with ``django_rmq_retry_``. Under ``rmq_consume --processes N`` the
children write their samples to files in ``PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's
multiprocess mode, set up by the supervisor) and the supervisor alone serves them, summed:
one endpoint, each message counted once (``server.py``). The database-backed gauges (the
parked backlog, the outbox backlog) are read only by the process that serves a scrape,
from the kept group counts: never a ``COUNT(*)`` over the parked table.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.message import Message
from ..core.names import Names
from ..hooks import SendEvent
from .observer import Part, lateness

PREFIX = "django_rmq_retry_"

#: The gauges read from the database by the process that serves a scrape.
PARKED = PREFIX + "parked_messages"
OUTBOX = PREFIX + "outbox_messages"
OUTBOX_AGE = PREFIX + "outbox_oldest_pending_age_seconds"
#: A dependency's breaker (0 closed, 1 half-open, 2 open) and its trips, from its row.
DEPENDENCY_STATE = PREFIX + "dependency_state"
DEPENDENCY_TRIPS = PREFIX + "dependency_trips"
DATABASE_METRICS = (PARKED, OUTBOX, OUTBOX_AGE, DEPENDENCY_STATE, DEPENDENCY_TRIPS + "_total")

#: Seconds of receiver attempts (defaults of prometheus-client, plus the long tail).
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: Seconds a retry ran after its due time.
LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300)
#: Rows per parking commit (the parking thread batches at most 200).
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200)
#: Seconds from a receiver's failure to its parked row's commit.
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300)


class ConsumerMetrics(Part):
    """The metrics a consumer process updates, and the hooks that update them."""

    def __init__(self, registry: CollectorRegistry | None, names: Names | None = None) -> None:
        self.registry = r = registry
        names = names or Names("rmq_retry")
        self._due, self._due_us = names.header("due"), names.header("due-us")
        # Children by label values, looked up once (``labels()`` validates and hashes its
        # values on every call).
        self._per_receiver: dict[str, tuple[Any, Any, Any]] = {}
        self._per_outcome: dict[tuple[str, str], Any] = {}
        self._published: dict[str, Any] = {}
        self._beat_set = 0.0
        self._ready: bool | None = None
        self.messages = Counter(
            PREFIX + "messages",
            "Deliveries settled, by receiver and outcome (acked, retried, parked, released, "
            "retry_refused).",
            ["receiver", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            PREFIX + "handle_duration_seconds",
            "Seconds a receiver attempt took (its retry or park decision included).",
            ["receiver"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            PREFIX + "in_flight",
            "Receiver attempts running now.",
            ["receiver"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.reconnects = Counter(
            PREFIX + "reconnects", "Times the consumer connected again to RabbitMQ.", registry=r
        )
        self.published = Counter(
            PREFIX + "published",
            "Messages sent: confirmed by the broker, written to the outbox, or failed.",
            ["outcome"],
            registry=r,
        )
        self.lateness = Histogram(
            PREFIX + "retry_lateness_seconds",
            "Seconds a retry's receiver started after the retry's due time.",
            ["receiver"],
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.park_batch = Histogram(
            PREFIX + "park_batch_size",
            "Rows committed per parking batch.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.park_lag = Histogram(
            PREFIX + "park_lag_seconds",
            "Seconds from a receiver's failure to the commit of its parked row.",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.ready = Gauge(
            PREFIX + "consumer_ready",
            "1 while the consumer consumes every queue it was asked to (with several "
            "processes: the least ready of them).",
            multiprocess_mode="livemin",
            registry=r,
        )
        self.heartbeat = Gauge(
            PREFIX + "loop_heartbeat_timestamp_seconds",
            "When the consumer's I/O loop last turned (Unix time; with several processes: "
            "the oldest).",
            multiprocess_mode="livemin",
            registry=r,
        )

    def _children(self, receiver: str) -> tuple[Any, Any, Any]:
        """(in_flight, duration, lateness) of ``receiver``."""
        found = self._per_receiver.get(receiver)
        if found is None:
            found = self._per_receiver[receiver] = (
                self.in_flight.labels(receiver),
                self.duration.labels(receiver),
                self.lateness.labels(receiver),
            )
        return found

    # Hooks ------------------------------------------------------------------------------------
    def attempt_started(self, message: Message, now: int = 0) -> Any:
        children = self._children(message.receiver)
        children[0].inc()
        if message.attempt > 1:
            late = lateness(message.headers, self._due, self._due_us, (now or time.time_ns()) / 1e9)
            if late is not None:
                children[2].observe(late)
        return children

    def attempt_ended(
        self, token: Any, error: BaseException | None, action: Any, now: int = 0, took: int = 0
    ) -> None:
        token[1].observe(took / 1e9)
        token[0].dec()

    def settled(self, receiver: str, queue: str, outcome: str) -> None:
        child = self._per_outcome.get((receiver, outcome))
        if child is None:
            child = self._per_outcome[receiver, outcome] = self.messages.labels(receiver, outcome)
        child.inc()

    def loop_tick(self, ready: bool) -> None:
        now = time.time()
        if ready is not self._ready or now - self._beat_set >= 1.0:
            self._ready = ready
            self._beat_set = now
            self.ready.set(1 if ready else 0)
            self.heartbeat.set(now)

    def reconnecting(self) -> None:
        self.reconnects.inc()

    def parked_batch(self, size: int, lag_seconds: float) -> None:
        self.park_batch.observe(size)
        self.park_lag.observe(lag_seconds)

    def send_started(self, out: SendEvent) -> Any:
        return out

    def send_ended(self, token: Any, error: BaseException | None) -> None:
        outcome = "failed" if error is not None else "outboxed" if token.outbox else "confirmed"
        child = self._published.get(outcome)
        if child is None:
            child = self._published[outcome] = self.published.labels(outcome)
        child.inc(token.count)

    def stopped(self) -> None:
        self.ready.set(0)


class DatabaseCollector(Collector):
    """The parked backlog (from the kept group counts) and the outbox backlog, read at
    most once per ``cache_seconds`` (a scrape every few seconds costs two small queries)."""

    def __init__(self, cache_seconds: float = 5.0, *, own_thread: bool = True) -> None:
        self.cache_seconds = cache_seconds
        #: Collected on a thread of ours (the endpoint's): its database connection is ours
        #: to close. False in a web request, whose connection Django manages.
        self.own_thread = own_thread
        self._cached: tuple[float, list[GaugeMetricFamily]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.monotonic()
        if self._cached is None or now - self._cached[0] > self.cache_seconds:
            self._cached = (now, database_families(self.own_thread))
        yield from self._cached[1]

    def describe(self) -> list[Any]:
        return []  # collected lazily: registering must not query the database


def database_families(own_thread: bool = True) -> list[GaugeMetricFamily]:
    """Read the two backlogs now (``own_thread``: close its database connection after)."""
    from django.db import close_old_connections

    from .backlog import outbox_backlog, parked_backlog

    if own_thread:
        close_old_connections()
    try:
        families = []
        parked = parked_backlog()
        if parked is not None:
            family = GaugeMetricFamily(
                PARKED,
                "Parked messages by receiver and status (from the kept group counts).",
                labels=["receiver", "status"],
            )
            for (receiver, status), count in sorted(parked.items()):
                family.add_metric([receiver, status], count)
            families.append(family)
        pending, held, oldest_age = outbox_backlog()
        outbox = GaugeMetricFamily(
            OUTBOX,
            "Outbox rows waiting for the relay, by status (pending, held).",
            labels=["status"],
        )
        outbox.add_metric(["pending"], pending)
        outbox.add_metric(["held"], held)
        families.append(outbox)
        families.append(
            GaugeMetricFamily(
                OUTBOX_AGE,
                "Age of the oldest pending outbox row (0: none).",
                value=oldest_age,
            )
        )
        families.extend(dependency_families())
        return families
    finally:
        if own_thread:
            close_old_connections()


def dependency_families() -> list[Any]:
    """Each dependency's breaker state and trips, read from its row: the cluster's, the
    same whichever process serves the scrape (none without ``DEPENDENCIES``)."""
    from ..breakers import state
    from ..conf import dependency_limits

    names = sorted(dependency_limits())
    if not names:
        return []
    breakers = state.read_all(names)
    states = GaugeMetricFamily(
        DEPENDENCY_STATE,
        "A dependency's breaker: 0 closed, 1 half-open (one probe), 2 open.",
        labels=["dependency"],
    )
    trips = CounterMetricFamily(
        DEPENDENCY_TRIPS,
        "Times a dependency's breaker opened (failures, or an operator).",
        labels=["dependency"],
    )
    for name in names:
        states.add_metric([name], breakers[name].state.gauge)
        trips.add_metric([name], breakers[name].trips)
    return [states, trips]
