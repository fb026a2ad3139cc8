"""Argument parsing shared by the management commands (filters, durations)."""

from __future__ import annotations

import os
import re
from argparse import ArgumentParser
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandError
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from ..conf import app_settings
from ..core.outcome import ParkReason
from ..core.spread import Share
from ..models import ParkedMessage
from ..registry import Receiver, default_registry

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    m = _DURATION.match(text or "")
    if not m:
        raise ValueError(f"cannot read duration {text!r}: use e.g. 30d, 12h, 90m, 45s")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def parse_when(text: str) -> datetime:
    """An ISO date/datetime, or an age like '2h' meaning that long ago."""
    value = parse_datetime(text)
    if value is None:
        d = parse_date(text)
        if d is not None:
            value = datetime(d.year, d.month, d.day)
    if value is None:
        try:
            return timezone.now() - parse_duration(text)
        except ValueError:
            raise ValueError(
                f"cannot read time {text!r}: use 2026-01-31, 2026-01-31T10:00 or 2h"
            ) from None
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return value


def add_filter_arguments(parser: ArgumentParser) -> None:
    """The admin list's selections as options (each a filter on an indexed column; several
    values of one option are alternatives, several options all apply)."""
    parser.add_argument(
        "--receiver", action="append", default=[], help="Receiver dotted path (repeatable)."
    )
    parser.add_argument("--queue", action="append", default=[], help="Queue name (repeatable).")
    parser.add_argument(
        "--error-type",
        action="append",
        default=[],
        help="Exception type, e.g. ValueError (repeatable).",
    )
    parser.add_argument(
        "--fingerprint",
        "--group",
        dest="fingerprint",
        action="append",
        default=[],
        metavar="FINGERPRINT",
        help="Failure group, exactly as the admin's Failure groups page shows it, e.g. "
        "'KeyError at shop/receipts.py:send' (repeatable).",
    )
    parser.add_argument(
        "--reason",
        action="append",
        default=[],
        choices=[reason.value for reason in ParkReason],
        metavar="REASON",
        help=f"Park reason: {', '.join(reason.value for reason in ParkReason)} (repeatable).",
    )
    parser.add_argument("--since", help="Parked at or after (ISO date/datetime or an age like 2h).")
    parser.add_argument("--until", help="Parked before (ISO date/datetime or an age like 2h).")
    parser.add_argument(
        "--failed-since", help="Last failed at or after (ISO date/datetime or an age like 2h)."
    )
    parser.add_argument(
        "--failed-until", help="Last failed before (ISO date/datetime or an age like 2h)."
    )
    parser.add_argument(
        "--min-attempts", type=int, metavar="N", help="Receiver runs at least N (attempts)."
    )
    parser.add_argument(
        "--id",
        dest="ids",
        action="append",
        default=[],
        help="Parked row id(s), comma separated (repeatable).",
    )
    parser.add_argument(
        "--message-id", action="append", default=[], help="AMQP message id (repeatable)."
    )


def filtered_queryset(options: dict[str, Any]) -> QuerySet[ParkedMessage]:
    qs = ParkedMessage.objects.all()
    if options.get("receiver"):
        qs = qs.filter(receiver__in=options["receiver"])
    if options.get("queue"):
        qs = qs.filter(queue__in=options["queue"])
    if options.get("error_type"):
        q = Q()
        for et in options["error_type"]:
            q |= Q(error_type=et) | Q(error_type__endswith="." + et)
        qs = qs.filter(q)
    if options.get("fingerprint"):
        qs = qs.filter(fingerprint__in=options["fingerprint"])
    if options.get("reason"):
        qs = qs.filter(reason__in=options["reason"])
    if options.get("since"):
        qs = qs.filter(parked_at__gte=parse_when(options["since"]))
    if options.get("until"):
        qs = qs.filter(parked_at__lt=parse_when(options["until"]))
    if options.get("failed_since"):
        qs = qs.filter(last_failure_at__gte=parse_when(options["failed_since"]))
    if options.get("failed_until"):
        qs = qs.filter(last_failure_at__lt=parse_when(options["failed_until"]))
    if options.get("min_attempts") is not None:
        qs = qs.filter(attempts__gte=options["min_attempts"])
    if options.get("ids"):
        ids = [int(x) for chunk in options["ids"] for x in str(chunk).split(",") if x.strip()]
        qs = qs.filter(pk__in=ids)
    if options.get("message_id"):
        qs = qs.filter(message_id__in=options["message_id"])
    return qs


def select_receivers(wanted: list[str]) -> list[Receiver]:
    """The receivers a command was asked for by dotted path or queue name (all when none).

    One reading for ``rmq_consume`` and ``rmq_setup``, so both name an unknown receiver
    the same way, with the receivers this process knows."""
    if not wanted:
        return default_registry.all()
    chosen = []
    for name in wanted:
        rec = default_registry.find(name, app_settings.PREFIX)
        if rec is None:
            known = ", ".join(r.name for r in default_registry.all()) or "none"
            raise CommandError(f"Unknown receiver {name!r}. Known receivers: {known}.")
        chosen.append(rec)
    return chosen


def refuse_overlapping_order(receivers: list[Receiver], threads: int) -> None:
    """Refuse ``rmq_consume`` threads that could run two messages of one key at once, before
    any process starts: the system check (E031) reads only the ``THREADS`` setting, and the
    consumer's own refusal would come from each child of ``--processes``, which the
    supervisor restarts for ever."""
    ordered = [r.name for r in receivers if r.ordering_key is not None]
    if ordered and threads > 1:
        raise CommandError(
            f"{', '.join(ordered)} keep(s) per-key order (ordering_key=), which one receiver "
            f"thread per process guarantees; --threads {threads} could run two messages of "
            "one key at once. Consume ordered receivers with --threads 1 (name the others "
            "to run them with more threads in another rmq_consume) and scale with --processes."
        )


def process_share() -> Share | None:
    """``rmq_consume``'s place among its peers, from the environment (``core.spread``):
    which partitions of the ordered receivers it consumes first."""
    try:
        return Share.from_environ(os.environ)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
