"""System checks of the features a project turns on: observability, alerts, Django
Channels beside us, per-key order, dependency breakers, and the binding keys RabbitMQ 4.3.5
refuses. :func:`django_rmq_retry.checks.check_settings` runs them after the settings' own
checks; each returns its messages.
"""

from __future__ import annotations

import inspect
from urllib.parse import urlsplit

from django.core import checks

from ..conf import SETTING_NAME, app_settings
from ..registry.discovery import LEGACY_MODULE
from .base import ID, Messages, _err


def _binding_keys() -> Messages:
    """Every topic key a receiver binds: RabbitMQ 4.3.5+ refuses more than two ``#``."""
    from ..core.broker_rules import MAX_HASHES, too_many_hashes
    from ..registry import default_registry

    return [
        _err(
            50,
            f"Receiver {rec.name} binds {key!r}: RabbitMQ 4.3.5 and later refuse a binding "
            f"key with more than {MAX_HASHES} '#' wildcards (the declare fails).",
            "Use at most two '#' (a '*' matches one word), or bind several keys.",
        )
        for rec in default_registry.all()
        for key in too_many_hashes(rec.routing_keys)
    ]


def _observability() -> Messages:
    """METRICS_PORT, METRICS_ADDRESS, TRACING, HEALTH_DIR (docs/howto/observability.md)."""
    port, address = app_settings.METRICS_PORT, app_settings.METRICS_ADDRESS
    tracing, health_dir = app_settings.TRACING, app_settings.HEALTH_DIR
    wrong = []
    if port is not None and not (
        isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536
    ):
        wrong.append(("METRICS_PORT", port, "None (no endpoint) or a port, e.g. 9100"))
    if not isinstance(address, str):
        wrong.append(("METRICS_ADDRESS", address, '"" (every interface) or an address'))
    if not isinstance(tracing, bool):
        wrong.append(("TRACING", tracing, "True or False"))
    if health_dir is not None and not (isinstance(health_dir, str) and health_dir):
        wrong.append(("HEALTH_DIR", health_dir, "None or a directory path"))
    return [
        _err(16, f"{SETTING_NAME}['{key}'] is {value!r}.", f"Set {hint}.")
        for key, value, hint in wrong
    ]


def _channels_module() -> Messages:
    """Receivers in ``<app>.consumers`` (the module name before 1.0) while Django Channels
    is installed: the same name holds Channels' consumers, and discovery imports it in
    every process."""
    from django.apps import apps

    from ..registry import default_registry

    if not apps.is_installed("channels") or app_settings.DISCOVER_MODULE == LEGACY_MODULE:
        return []
    found = sorted(
        {
            r.func.__module__
            for r in default_registry.all()
            if r.func.__module__.rsplit(".", 1)[-1] == LEGACY_MODULE
        }
    )
    if not found:
        return []
    return [
        checks.Warning(
            f"Receivers are declared in {', '.join(found)}: '{LEGACY_MODULE}' is Django "
            "Channels' module name too, and discovery imports it in every process.",
            hint=f"Move them to '{app_settings.DISCOVER_MODULE}.py' (keep their queue= names "
            "so their queues stay the same).",
            id=f"{ID}.W002",
        )
    ]


def _alerts() -> Messages:
    """Alerts on (ALERT_CHECK_SECONDS > 0) that nobody would read: without ALERT_HANDLER
    they go to ``mail_admins``, which returns quietly when ADMINS is empty. And a link base
    (ALERT_ADMIN_URL) that would make broken links."""
    from django.conf import settings

    out: Messages = []
    base = app_settings.ALERT_ADMIN_URL
    if not isinstance(base, str) or (base and urlsplit(base).scheme not in ("http", "https")):
        out.append(
            _err(
                17,
                f"{SETTING_NAME}['ALERT_ADMIN_URL'] must be \"\" or an http(s) URL, got {base!r}.",
                'The admin\'s address as operators open it, e.g. "https://ops.example.com/admin/"; '
                '"" links alerts with the admin\'s path only.',
            )
        )
    every = app_settings.ALERT_CHECK_SECONDS
    on = isinstance(every, int | float) and not isinstance(every, bool) and every > 0
    if on and not app_settings.ALERT_HANDLER and not settings.ADMINS:
        out.append(
            checks.Warning(
                "Failure-group alerts are on, but nobody would receive them: ALERT_HANDLER is "
                "None, so they go to mail_admins, and settings.ADMINS is empty. The consumers "
                "send none until one of them is set.",
                hint=f"Set settings.ADMINS, or {SETTING_NAME}['ALERT_HANDLER'] to a callable's "
                "dotted path (docs/howto/operators.md), or ALERT_CHECK_SECONDS = 0 to turn "
                "alerts off.",
                id=f"{ID}.W003",
            )
        )
    return out


def _dependencies() -> Messages:
    """Each DEPENDENCIES entry well formed, its exceptions importable exception classes, and
    every receiver's ``depends_on`` a name it defines."""
    from django.core.exceptions import ImproperlyConfigured
    from django.utils.module_loading import import_string

    from ..conf import dependency_limits
    from ..registry import default_registry

    try:
        limits = dependency_limits()
    except ImproperlyConfigured as exc:
        return [_err(18, str(exc), "docs/howto/dependencies.md lists each key and its default.")]
    out: Messages = []
    for name, dep in limits.items():
        for path in dep.exceptions:
            try:
                found = import_string(path)
            except ImportError as exc:
                found = exc
            if not (isinstance(found, type) and issubclass(found, BaseException)):
                out.append(
                    _err(
                        18,
                        f"{SETTING_NAME}['DEPENDENCIES'][{name!r}]['EXCEPTIONS']: {path!r} is "
                        f"not an exception class ({found}).",
                        "Give the dotted path of an exception class, e.g. "
                        "'builtins.ConnectionError' or 'requests.exceptions.Timeout'.",
                    )
                )
    for rec in default_registry.all():
        unknown = [n for n in rec.depends_on if n not in limits]
        if unknown:
            out.append(
                _err(
                    19,
                    f"Receiver {rec.name} depends_on {', '.join(map(repr, unknown))}, which "
                    f"{SETTING_NAME}['DEPENDENCIES'] does not define.",
                    f"Define it in {SETTING_NAME}['DEPENDENCIES'] (known: "
                    f"{', '.join(sorted(limits)) or 'none'}), or fix the name.",
                )
            )
    return out


def _ordering() -> Messages:
    """Per-key order: its two settings, and no ordered receiver where two of one
    partition's messages could run at once (they would finish in either order)."""
    from django.core.exceptions import ImproperlyConfigured

    from ..conf import ordering_partitions
    from ..core.ordering import ON_PARK_CHOICES
    from ..registry import default_registry

    out: Messages = []
    try:
        ordering_partitions()
    except ImproperlyConfigured as exc:
        out.append(_err(30, str(exc), "The default is 4; see docs/howto/ordering.md."))
    on_park = app_settings.ORDERING_ON_PARK
    if on_park not in ON_PARK_CHOICES:
        out.append(
            _err(
                30,
                f"{SETTING_NAME}['ORDERING_ON_PARK'] must be 'hold' or 'skip', got {on_park!r}.",
                "'hold' (the default) keeps a parked message's key held until an operator "
                "requeues or discards it; 'skip' lets the messages behind it go on.",
            )
        )
    ordered = [r for r in default_registry.all() if r.ordering_key is not None]
    threads = app_settings.THREADS
    if ordered and isinstance(threads, int) and threads > 1:
        out.append(
            _err(
                31,
                f"{SETTING_NAME}['THREADS'] is {threads}, and {ordered[0].name} has an "
                "ordering_key: two threads would run two messages of one key at once.",
                "Set THREADS to 1 and scale with consumer processes (`rmq_consume "
                "--processes N`): each partition queue has one active consumer at a time.",
            )
        )
    for rec in ordered:
        if inspect.iscoroutinefunction(rec.func):
            out.append(
                _err(
                    31,
                    f"Receiver {rec.name} is an async def with an ordering_key: the event "
                    "loop awaits several messages at once, so one key's could overlap.",
                    "Make it a plain def (it runs on the single receiver thread).",
                )
            )
    return out
