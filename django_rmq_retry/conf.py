"""Settings for django-rmq-retry: one namespaced dict, read lazily.

Every key lives in :data:`DEFAULTS`; projects override any of them in
``settings.RMQ_RETRY``. Values are read on each access through :data:`app_settings`
and the cache is dropped on ``setting_changed`` so ``override_settings`` just works.
Nothing here runs at import time and nothing is written back onto ``django.conf.settings``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver as django_receiver

from .core.backoff import Policy
from .core.breaker import Limits
from .core.delays import DelayLevels
from .core.names import Names
from .core.native_retry import QUORUM_NATIVE, native_retry
from .core.topology_plan import Plan, QueueOwner, plan

SETTING_NAME = "RMQ_RETRY"

DEFAULTS: dict[str, Any] = {
    # Where the broker is. amqp:// or amqps:// (TLS). The password is never printed.
    "BROKER_URL": "amqp://guest:guest@127.0.0.1:5672/%2F",
    # A cluster: every node's URL. When not empty it replaces BROKER_URL; connections try the
    # URLs in turn, and after a lost connection start with the URL after the one lost.
    "BROKER_URLS": [],
    # TLS options for amqps:// URLs: paths to PEM files; None means the system defaults.
    "TLS_CA_FILE": None,
    "TLS_CERT_FILE": None,
    "TLS_KEY_FILE": None,
    # Prefix of every exchange, queue and header we own (two projects can share a vhost).
    "PREFIX": "rmq_retry",
    # Deliveries a consumer process may hold unacked at once, per queue: retry copies waiting
    # in the landing and rows waiting for their parked commit count too.
    "PREFETCH": 20,
    # Opt-in: while retry copies wait in the landing or rows wait for their parked commit,
    # a spare consumer with this prefetch widens a queue's window, so a process may then hold
    # up to PREFETCH + SPARE_PREFETCH unacked on it. 0 (default): never; PREFETCH is the bound.
    "SPARE_PREFETCH": 0,
    # Receiver threads per consumer process (receivers never run on pika's I/O thread).
    "THREADS": 1,
    # async def receivers awaited at once per consumer process (on its event loop).
    "ASYNC_CONCURRENCY": 100,
    # Where async def receivers are awaited. False (default): on an event loop of their own
    # beside the consumer's I/O loop, so one that blocks (time.sleep in async def) never
    # holds the broker I/O. True: on the consumer's I/O loop itself, each outcome settled
    # without a thread switch (the fastest for many concurrent awaits); a receiver that
    # blocks then holds heartbeats and acks too (named in a WARNING, failing liveness).
    "ASYNC_ON_IO_LOOP": False,
    # AMQP heartbeat in seconds. 0 (disabled) is refused: dead peers would go unnoticed.
    "HEARTBEAT": 60,
    # Seconds a connection blocked by the broker (memory/disk alarm) waits before failing.
    "BLOCKED_CONNECTION_TIMEOUT": 300,
    # Seconds for the TCP connect and the AMQP handshake.
    "CONNECT_TIMEOUT": 10,
    # Reconnect backoff: starts at 0.5 s, doubles, capped at this many seconds.
    "RECONNECT_MAX_DELAY": 30,
    # Seconds a publish keeps publishing again a message the broker nacked (a quorum queue
    # electing a leader while a node stops) before it raises NackedError: pauses of 0.5 s,
    # doubling to 5 s. 0 raises at the first nack. A web request waits this long at worst.
    "PUBLISH_NACK_WAIT": 20,
    # Whether a publishing process declares the whole topology (delay levels, every receiver's
    # queue) on its first send. False: publishers need RabbitMQ's write permission only, and
    # the topology is declared by `manage.py rmq_setup` (a deploy step) or `rmq_consume` at
    # start. True: today's declare-on-first-send, which needs configure permission everywhere.
    "DECLARE_ON_SEND": False,
    # A flood of parked messages in the consumer's log: per receiver, the first 10 parks of
    # each this many seconds get a WARNING line each, the rest one line with their count.
    # 0 logs every park on its own line.
    "PARK_LOG_INTERVAL": 10,
    # Seconds a warm shutdown waits for in-flight receivers before it gives up.
    "SHUTDOWN_TIMEOUT": 30,
    # "classic" (default) or "quorum" for every queue we own.
    "QUEUE_TYPE": "classic",
    # Who holds a retry until it is due: "cascade" (default; our delay levels, any broker) or
    # "quorum-native" (RabbitMQ 4.3+ quorum queues' own delayed retry, linear backoff only;
    # docs/howto/retry-policies.md says which policies fit, a system check refuses the rest).
    "DELAY_ENGINE": "cascade",
    # Delay levels: level k holds messages RESOLUTION_MS * 2**k milliseconds. The longest
    # delay is RESOLUTION_MS * (2**DELAY_LEVELS - 1); defaults: 100 ms steps, ~9.7 days.
    "DELAY_RESOLUTION_MS": 100,
    "DELAY_LEVELS": 23,
    # The last part of each retry delay a consumer holds (unacked, in memory) rather than
    # the delay levels: at least this many ms, rounded up to whole DELAY_RESOLUTION_MS.
    # RabbitMQ adds 1-2 ms and a tail of tens of ms per level; landing early and waiting out
    # the rest runs a retry at its due time. 0: the levels hold all of it.
    "DELAY_LANDING_MS": 50,
    # Default retry policy for every receiver (a receiver's own or a RetryPolicy row wins).
    "RETRY": {
        "max_attempts": 5,
        "initial_delay": 1.0,
        "multiplier": 2.0,
        "max_delay": 3600.0,
        "jitter": "full",
        "dont_retry": [],
    },
    # Seconds a consumer caches RetryPolicy rows; edits in the admin apply within this time.
    "POLICY_CACHE_SECONDS": 10,
    # Longest error message (characters) copied into message headers.
    "ERROR_HEADER_MAX": 256,
    # Deliveries of one message (redeliveries after crashes included) before it is parked
    # with reason "delivery_limit" instead of being run again.
    "DELIVERY_LIMIT": 5,
    # Module name looked up in every installed app for receivers ("consumers", the name
    # before 1.0 and Django Channels' too, is still looked up; a check warns with Channels).
    "DISCOVER_MODULE": "receivers",
    # Seconds a parked-row claim may stay unfinished before another requeue may take it over.
    "REQUEUE_CLAIM_TIMEOUT": 300,
    # Rows per batch for requeue, discard and purge; a larger batch means fewer statements.
    "BATCH_SIZE": 1000,
    # Seconds the process stepping a background requeue operation holds it: renewed every
    # third of it while a step runs, so another process takes over only after a whole
    # lease with no renewal (the stepper died or froze). Shorter: faster takeover.
    "OPERATION_LEASE_SECONDS": 30,
    # Seconds an operation waits for the outcome of copies it sent (handled, or failed
    # again) with none reported: then they count as "outcome unknown" and are never sent
    # again; a canary or ramp stage stops there (Resume goes on), the last wait ends.
    "OPERATION_OUTCOME_TIMEOUT": 600,
    # Transactional outbox (docs/howto/outbox.md): Topic.send writes a row in the
    # current database transaction and the relay publishes it once that commits. False keeps
    # the direct publish; Topic(..., outbox=) and send(..., outbox=) choose per topic or call.
    "OUTBOX": False,
    # After a commit that wrote outbox rows, the committing thread publishes them at once
    # (the relay in rmq_consume / rmq_relay sweeps up whatever that missed).
    "OUTBOX_PUBLISH_ON_COMMIT": True,
    # Seconds the relay sleeps when the outbox is empty (a commit in its process wakes it).
    "OUTBOX_POLL_SECONDS": 1.0,
    # Rows the relay publishes per round (one database transaction, pipelined confirms).
    "OUTBOX_BATCH_SIZE": 2000,
    # Publish attempts the broker refused (unroutable, nacked) before a row is held for an
    # operator. An unreachable broker is not counted: the relay waits for it.
    "OUTBOX_MAX_ATTEMPTS": 10,
    # Days an idempotent receiver remembers a handled message (a duplicate arriving later
    # runs again). The consumer purges older rows hourly; rmq_purge_inbox does it on demand.
    "INBOX_RETENTION_DAYS": 7,
    # The broker's maximum message size (RabbitMQ's max_message_size: 128 MiB by default on
    # 3.x, 16 MiB on 4.x). A larger body is refused before it is sent, with a clear error (a
    # send, the outbox relay, a requeue, a retry copy, the admin's edit), rather than let the
    # broker close the channel under the messages beside it.
    "MAX_MESSAGE_BYTES": 134_217_728,
    # Alerts on failure groups (parking.alerts): a new group, or one past ALERT_THRESHOLD
    # parked rows, gives one notification per group per ALERT_WINDOW_SECONDS. ALERT_HANDLER:
    # None for mail_admins, or the dotted path of a callable(alert) (a Slack webhook...).
    # The consumers' operations thread looks every ALERT_CHECK_SECONDS (0: no alerts).
    "ALERT_HANDLER": None,
    "ALERT_THRESHOLD": 100,
    "ALERT_WINDOW_SECONDS": 3600,
    "ALERT_CHECK_SECONDS": 30,
    # The admin's address as operators open it (e.g. "https://ops.example.com/admin/"): each
    # alert links to its group's parked messages there. A consumer has no request to learn
    # the host from; "" gives the admin's path only (/admin/django_rmq_retry/...).
    "ALERT_ADMIN_URL": "",
    # Observability (docs/howto/observability.md). A port: rmq_consume serves Prometheus
    # metrics (/metrics, needs the "prometheus" extra) and health probes (/healthz/live,
    # /healthz/ready) there; --metrics-port overrides it. None: no endpoint.
    "METRICS_PORT": None,
    # The address the endpoint listens on ("" or "0.0.0.0": every interface, as a probe needs).
    "METRICS_ADDRESS": "",
    # OpenTelemetry traces (needs the "otel" extra and the project's SDK set up): send injects
    # a W3C trace context and every receiver attempt is a span linked to it.
    "TRACING": False,
    # A directory where rmq_consume touches "live" (each second while its I/O loop turns) and
    # keeps "ready" (while it consumes every queue): for exec probes. None: no files.
    "HEALTH_DIR": None,
    # Seconds without a turn of the I/O loop after which liveness fails.
    "LIVENESS_TIMEOUT": 60,
    # Per-key order (docs/howto/ordering.md): an ordered receiver (ordering_key=) reads this
    # many partition queues, each with one active consumer at a time. Publishers and
    # consumers must agree on it; change it only with the partition queues drained.
    "ORDERING_PARTITIONS": 4,
    # What a parked message of an ordered receiver does to the messages of its key behind
    # it: "hold" keeps them (status held) until an operator requeues or discards it,
    # "skip" lets them go on.
    "ORDERING_ON_PARK": "hold",
    # Breakers per dependency (docs/howto/dependencies.md): {"payments": {"EXCEPTIONS":
    # [dotted paths], "TRIP_FAILURES": 5, "TRIP_WINDOW": 30, "PROBE_AFTER": 10,
    # "PROBE_BACKOFF_MAX": 300, "REPLAY_PARKED": True}}; receivers name them in depends_on=.
    "DEPENDENCIES": {},
}

RETRY_KEYS = frozenset(DEFAULTS["RETRY"])


class Settings:
    """Lazy view over ``settings.RMQ_RETRY`` merged with :data:`DEFAULTS`."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    def user_settings(self) -> Mapping[str, Any]:
        value = getattr(settings, SETTING_NAME, {})
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ImproperlyConfigured(
                f"settings.{SETTING_NAME} must be a dict, got {type(value).__name__}."
            )
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(f"Unknown django-rmq-retry setting {name!r}")
        try:
            return self._cache[name]
        except KeyError:
            pass
        user = self.user_settings()
        value = user.get(name, DEFAULTS[name])
        if name == "RETRY":
            merged = dict(DEFAULTS["RETRY"])
            merged.update(value or {})
            value = merged
        self._cache[name] = value
        return value

    def reload(self) -> None:
        self._cache.clear()


app_settings = Settings()


@django_receiver(setting_changed)
def _reload(setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        app_settings.reload()


# The settings read as core values ------------------------------------------------------------
def broker_urls() -> list[str]:
    """The broker URLs in the order to try them: ``BROKER_URLS``, else ``[BROKER_URL]``."""
    urls = app_settings.BROKER_URLS or []
    if isinstance(urls, str) or not all(isinstance(url, str) and url for url in urls):
        raise ImproperlyConfigured(
            f"{SETTING_NAME}['BROKER_URLS'] must be a list of amqp:// URLs, got {urls!r}."
        )
    return list(urls) or [str(app_settings.BROKER_URL)]


def current_names() -> Names:
    return Names(app_settings.PREFIX)


def current_levels() -> DelayLevels:
    return DelayLevels(int(app_settings.DELAY_RESOLUTION_MS), int(app_settings.DELAY_LEVELS))


def current_plan(receivers: Iterable[QueueOwner], names: Names | None = None) -> Plan:
    """The topology for ``receivers`` under the current settings (``names`` overrides the prefix)."""
    return plan(
        receivers,
        names or current_names(),
        current_levels(),
        str(app_settings.QUEUE_TYPE),
        ordering_partitions(),
        native_retry=_native_arguments if quorum_native() else None,
    )


def quorum_native() -> bool:
    """Whether retries are given back to quorum queues that hold them (``DELAY_ENGINE``)."""
    return app_settings.DELAY_ENGINE == QUORUM_NATIVE


def code_policy(rec: QueueOwner) -> Policy:
    """A receiver's retry policy as the code says (its own, else ``RETRY``): what its queue
    is declared with under the quorum-native engine (a RetryPolicy row cannot redeclare it)."""
    return getattr(rec, "policy", None) or Policy.from_mapping(app_settings.RETRY)


def _native_arguments(rec: QueueOwner) -> dict[str, Any]:
    return native_retry(code_policy(rec)).arguments()


def ordering_partitions() -> int:
    """``ORDERING_PARTITIONS``, checked: the partition queues of every ordered receiver."""
    value = app_settings.ORDERING_PARTITIONS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise ImproperlyConfigured(
            f"{SETTING_NAME}['ORDERING_PARTITIONS'] must be an integer from 1 to 1024 (the "
            f"partition queues of each ordered receiver), got {value!r}."
        )
    return value


def dependency_limits() -> dict[str, Limits]:
    """Every dependency's breaker limits by name (``DEPENDENCIES``); ``ImproperlyConfigured``
    names the dependency and the key that is wrong."""
    deps = app_settings.DEPENDENCIES or {}
    if not isinstance(deps, Mapping):
        raise ImproperlyConfigured(
            f"{SETTING_NAME}['DEPENDENCIES'] must be a dict of name -> settings, got {deps!r}."
        )
    out: dict[str, Limits] = {}
    for name, data in deps.items():
        if not isinstance(name, str) or not name:
            raise ImproperlyConfigured(f"{SETTING_NAME}['DEPENDENCIES']: bad name {name!r}.")
        try:
            out[name] = Limits.from_mapping(data)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{SETTING_NAME}['DEPENDENCIES'][{name!r}]: {exc}.") from exc
    return out
