"""System checks (``manage.py check``) for the RMQ_RETRY settings.

One function per concern, each returning its messages (the checks of the features a
project turns on are in :mod:`.features`); :func:`check_settings` (the one
registered with Django) runs them in order once the settings dict itself could be read.
Every check carries the tag :data:`TAG` (``manage.py check --tag django_rmq_retry``);
:func:`check_permissions` runs with ``check --deploy`` only: it states the RabbitMQ
permissions each kind of process needs.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from django.core import checks
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from ..conf import DEFAULTS, RETRY_KEYS, SETTING_NAME, app_settings
from ..core.backoff import Policy
from ..core.delays import DelayLevels
from ..core.topology_plan import QUORUM_DELIVERY_LIMIT, permissions
from ..db.tables import MIGRATE, unapplied_migrations
from .base import ID, TAG, Messages, _err
from .delay_engine import check_delay_engine
from .features import (
    _alerts,
    _binding_keys,
    _channels_module,
    _dependencies,
    _observability,
    _ordering,
)

__all__ = [
    "BROKER_MAX_TTL_MS",
    "ID",
    "TAG",
    "Messages",
    "check_migrated",
    "check_permissions",
    "check_settings",
]

#: Settings that must be positive numbers.
POSITIVE = (
    "LIVENESS_TIMEOUT",
    "PREFETCH",
    "THREADS",
    "ASYNC_CONCURRENCY",
    "BLOCKED_CONNECTION_TIMEOUT",
    "RECONNECT_MAX_DELAY",
    "SHUTDOWN_TIMEOUT",
    "DELIVERY_LIMIT",
    "BATCH_SIZE",
    "CONNECT_TIMEOUT",
    "OUTBOX_POLL_SECONDS",
    "OUTBOX_BATCH_SIZE",
    "OUTBOX_MAX_ATTEMPTS",
    "INBOX_RETENTION_DAYS",
    "MAX_MESSAGE_BYTES",
    "ALERT_THRESHOLD",
    "ALERT_WINDOW_SECONDS",
)
#: Settings that must be numbers >= 0.
NON_NEGATIVE = ("PUBLISH_NACK_WAIT", "SPARE_PREFETCH", "PARK_LOG_INTERVAL", "ALERT_CHECK_SECONDS")


#: The longest ``x-message-ttl`` RabbitMQ accepts (milliseconds, unsigned 32 bits).
BROKER_MAX_TTL_MS = 2**32 - 1


@checks.register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> Messages:
    try:
        user = app_settings.user_settings()
    except Exception as exc:
        return [_err(1, str(exc), f"Set settings.{SETTING_NAME} = {{...}}.")]
    return [
        *_known_keys(user),
        *_broker_url(),
        *_heartbeat(),
        *_positive_numbers(),
        *_prefix(),
        *_queue_type(),
        *_delays_and_retry(user),
        *_delivery_limit(),
        *_reserved_prefix(),
        *_level_ttls(),
        *_landing(),
        *_switches(),
        *_observability(),
        *_channels_module(),
        *_alerts(),
        *_ordering(),
        *_dependencies(),
        *_binding_keys(),
        *check_delay_engine(),
    ]


@checks.register(checks.Tags.database)
def check_migrated(app_configs: Any = None, **kwargs: Any) -> Messages:
    """Migrations of this app not applied: the consumer could not park, the commands would
    fail. A database check, run the way Django runs its own: only when asked for a database
    (``manage.py check --database default``), never at import or on a plain ``check``. It
    carries Django's ``database`` tag only, not ours: Django 6 runs every check of a tag it
    is asked for against every database, so ``check --tag django_rmq_retry`` would query
    them too."""
    databases = kwargs.get("databases")
    if not databases or _migrating():
        return []
    out: Messages = []
    for alias in databases:
        try:
            pending = unapplied_migrations(alias)
        except DatabaseError:  # cannot ask: Django's own database checks say why
            continue
        if pending:
            where = "" if alias == DEFAULT_DB_ALIAS else f" --database {alias}"
            out.append(
                checks.Warning(
                    f"{len(pending)} migration(s) of django_rmq_retry not applied on database "
                    f"'{alias}' ({', '.join(pending)}): its tables are missing or out of date.",
                    hint=f"Run `{MIGRATE}{where}`.",
                    id=f"{ID}.W010",
                )
            )
    return out


MIGRATE_MODULE = "django.core.management.commands.migrate"


def _migrating() -> bool:
    """``migrate`` runs the database checks just before it applies the migrations: that
    they are not applied yet is no news there."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        # Django 5.2 calls the checks from migrate's handle(), Django 6 from the base
        # command's execute() (with self the migrate command): either frame tells.
        caller = frame.f_globals.get("__name__"), type(frame.f_locals.get("self")).__module__
        if MIGRATE_MODULE in caller:
            return True
        frame = frame.f_back
    return False


@checks.register(TAG, deploy=True)
def check_permissions(app_configs: Any = None, **kwargs: Any) -> Messages:
    """The RabbitMQ permissions (configure / write / read regexes on the vhost of
    BROKER_URL) each kind of process needs under PREFIX: docs/howto/permissions.md."""
    prefix = app_settings.PREFIX
    if not isinstance(prefix, str) or not prefix:
        return []  # E006's
    lines = [
        f"{p.role}: configure '{p.configure}' write '{p.write}' read '{p.read}' ({p.why})"
        for p in permissions(prefix)
    ]
    return [
        checks.Info(
            "RabbitMQ permissions each process needs under PREFIX "
            f"{prefix!r}:\n  " + "\n  ".join(lines),
            hint="rabbitmqctl set_permissions -p <vhost> <user> <configure> <write> <read>; "
            "see docs/howto/permissions.md.",
            id=f"{ID}.I001",
        )
    ]


#: The settings that are True or False, with what their default (False) means.
SWITCHES = {
    "DECLARE_ON_SEND": "publishers need write permission only; the topology is declared by "
    "rmq_setup or rmq_consume.",
    "ASYNC_ON_IO_LOOP": "async def receivers run on an event loop of their own, beside the "
    "consumer's I/O loop.",
}


def _switches() -> Messages:
    return [
        _err(
            15,
            f"{SETTING_NAME}[{key!r}] must be True or False, got {value!r}.",
            f"False (the default): {meaning}",
        )
        for key, meaning in SWITCHES.items()
        if not isinstance(value := getattr(app_settings, key), bool)
    ]


def _known_keys(user: Mapping[str, Any]) -> Messages:
    unknown = sorted(set(user) - set(DEFAULTS))
    if not unknown:
        return []
    return [
        _err(
            2,
            f"Unknown key(s) in settings.{SETTING_NAME}: {', '.join(unknown)}.",
            f"Valid keys: {', '.join(sorted(DEFAULTS))}.",
        )
    ]


def _broker_url() -> Messages:
    """BROKER_URL and every BROKER_URLS entry: a typo in a cluster's third node only shows up
    the day the first two are down, so it is refused at start. Never echoes a URL (passwords)."""
    urls = app_settings.BROKER_URLS
    if isinstance(urls, str) or not isinstance(urls, list | tuple):
        return [
            _err(
                3,
                f"{SETTING_NAME}['BROKER_URLS'] must be a list of URLs.",
                'e.g. ["amqp://u:p@node1:5672/%2F", "amqp://u:p@node2:5672/%2F"].',
            )
        ]
    named = [("BROKER_URL", app_settings.BROKER_URL)]
    named += [(f"BROKER_URLS[{i}]", url) for i, url in enumerate(urls)]
    return [
        _err(
            3,
            f"{SETTING_NAME}['{name}'] must start with amqp:// or amqps://.",
            "e.g. amqp://user:password@host:5672/%2F (the vhost '/' is %2F).",
        )
        for name, url in named
        if (urlsplit(url).scheme if isinstance(url, str) else "") not in ("amqp", "amqps")
    ]


def _heartbeat() -> Messages:
    hb = app_settings.HEARTBEAT
    if isinstance(hb, int) and not isinstance(hb, bool) and hb > 0:
        return []
    return [
        _err(
            4,
            f"{SETTING_NAME}['HEARTBEAT'] must be a positive number of seconds.",
            "A heartbeat of 0 disables dead-peer detection; use 30-60.",
        )
    ]


def _positive_numbers() -> Messages:
    out: Messages = []
    for key in (*POSITIVE, *NON_NEGATIVE):
        value = getattr(app_settings, key)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if key in NON_NEGATIVE:
            ok, words = number and math.isfinite(value) and value >= 0, "a finite number >= 0"
        else:
            ok, words = number and value > 0, "a positive number"
        if not ok:
            out.append(
                _err(
                    5,
                    f"{SETTING_NAME}['{key}'] must be {words}.",
                    f"The default is {DEFAULTS[key]!r}.",
                )
            )
    return out


def _prefix() -> Messages:
    prefix = app_settings.PREFIX
    if isinstance(prefix, str) and prefix and not any(c in prefix for c in " *#"):
        return []
    return [
        _err(
            6,
            f"{SETTING_NAME}['PREFIX'] must be a non-empty name without spaces, '*' or '#'.",
            "The default is 'rmq_retry'.",
        )
    ]


def _queue_type() -> Messages:
    if app_settings.QUEUE_TYPE in ("classic", "quorum"):
        return []
    return [
        _err(
            7,
            f"{SETTING_NAME}['QUEUE_TYPE'] must be 'classic' or 'quorum'.",
            "Quorum queues need RabbitMQ 3.8+ (at-least-once dead-lettering 3.10+).",
        )
    ]


def _delays_and_retry(user: Mapping[str, Any]) -> Messages:
    out: Messages = []
    levels = None
    try:
        levels = DelayLevels(int(app_settings.DELAY_RESOLUTION_MS), int(app_settings.DELAY_LEVELS))
    except (TypeError, ValueError) as exc:
        out.append(
            _err(
                8,
                f"Bad delay levels: {exc}.",
                "DELAY_RESOLUTION_MS >= 1 and 1 <= DELAY_LEVELS <= 32.",
            )
        )
    retry = user.get("RETRY") or {}
    unknown = sorted(set(retry) - RETRY_KEYS) if isinstance(retry, dict) else []
    if unknown:
        out.append(
            _err(
                9,
                f"Unknown key(s) in {SETTING_NAME}['RETRY']: {', '.join(unknown)}.",
                f"Valid keys: {', '.join(sorted(RETRY_KEYS))}.",
            )
        )
        return out
    try:
        policy = Policy.from_mapping(app_settings.RETRY)
    except (TypeError, ValueError) as exc:
        out.append(
            _err(10, f"Bad {SETTING_NAME}['RETRY']: {exc}.", "See docs/reference/settings.md.")
        )
        return out
    if levels and policy.max_delay * 1000 > levels.max_delay_ms:
        out.append(
            checks.Warning(
                f"RETRY max_delay {policy.max_delay}s exceeds the longest delay the delay "
                f"levels hold ({levels.max_delay_ms / 1000:.0f}s); longer delays are clamped.",
                hint="Raise DELAY_LEVELS or DELAY_RESOLUTION_MS.",
                id=f"{ID}.W001",
            )
        )
    return out


def _delivery_limit() -> Messages:
    """Our start count must park before the broker's quorum limit dead-letters the message."""
    limit = app_settings.DELIVERY_LIMIT
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < QUORUM_DELIVERY_LIMIT:
        return []  # a non-number is E005's
    return [
        _err(
            11,
            f"{SETTING_NAME}['DELIVERY_LIMIT'] = {limit} can never be reached: quorum receiver "
            f"queues are declared with x-delivery-limit {QUORUM_DELIVERY_LIMIT}, and the "
            "broker dead-letters a message at that count first.",
            f"Use a value well below {QUORUM_DELIVERY_LIMIT} (the default is "
            f"{DEFAULTS['DELIVERY_LIMIT']}); it counts receiver runs that were never settled.",
        )
    ]


def _reserved_prefix() -> Messages:
    """``x-`` headers never match in a headers exchange; ``amq.`` names are the broker's."""
    prefix = app_settings.PREFIX
    if not isinstance(prefix, str):
        return []  # E006's
    lowered = prefix.lower()
    if not (lowered.startswith("x-") or lowered == "amq" or lowered.startswith("amq.")):
        return []
    return [
        _err(
            12,
            f"{SETTING_NAME}['PREFIX'] = {prefix!r} is reserved by RabbitMQ: headers starting "
            "with 'x-' are ignored by the deliver exchange's exact match (every retry would "
            "end orphaned), and names starting with 'amq.' cannot be declared.",
            "Choose a prefix that starts with neither 'x-' nor 'amq' (the default is 'rmq_retry').",
        )
    ]


def _level_ttls() -> Messages:
    """A delay level whose TTL the broker refuses cannot be declared: nothing would start."""
    try:
        levels = DelayLevels(int(app_settings.DELAY_RESOLUTION_MS), int(app_settings.DELAY_LEVELS))
    except (TypeError, ValueError):
        return []  # E008's
    top = levels.ttl_ms(levels.levels - 1)
    if top <= BROKER_MAX_TTL_MS:
        return []
    return [
        _err(
            13,
            f"The longest delay level's TTL ({top} ms = DELAY_RESOLUTION_MS × 2^(DELAY_LEVELS−1)) "
            f"exceeds RabbitMQ's limit for x-message-ttl ({BROKER_MAX_TTL_MS} ms, ~49.7 days).",
            "Lower DELAY_LEVELS or DELAY_RESOLUTION_MS.",
        )
    ]


#: The longest landing: each held copy fills a prefetch slot for this long at most.
MAX_LANDING_MS = 10_000


def _landing() -> Messages:
    """A landing the consumer could not honour (not a whole number of ms in range)."""
    value = app_settings.DELAY_LANDING_MS
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_LANDING_MS:
        return []
    return [
        _err(
            14,
            f"{SETTING_NAME}['DELAY_LANDING_MS'] must be a whole number of milliseconds from 0 "
            f"to {MAX_LANDING_MS}, got {value!r}.",
            "50 (the default) holds the last 50 ms, rounded up to DELAY_RESOLUTION_MS, of each "
            "retry delay in the consumer; 0 leaves all of it to the delay levels.",
        )
    ]
