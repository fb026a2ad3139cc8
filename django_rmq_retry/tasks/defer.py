"""Deferred tasks (``run_after``): held by the broker's delay levels, like retry copies.

``run_after`` is the earliest start, a promise kept three ways:

* the delay is rounded *up* to the levels' resolution, so the due time the message carries
  (``<prefix>-due-us``) is never before ``run_after``, and the consumer holds a message that
  lands early until that due time, as it does a retry copy;
* a ``run_after`` beyond what the levels hold (``DELAY_LEVELS``) comes back at the longest
  delay they hold and is sent round again for the rest (``runner``), as often as needed, each
  round a fresh publish without the broker's ``x-death`` headers: RabbitMQ silently drops a
  message that dead-letters through a queue its ``x-death`` says it already expired in;
* the rounds are reckoned from the due time the message carries, not from a consumer's
  clock, so they end (a consumer whose clock differs, or the in-memory broker's virtual
  clock, never sends a task round for ever).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from .. import broker
from ..conf import app_settings, current_levels, current_names
from ..core.delays import epoch_us, route
from ..core.envelope import build_properties, clean_headers
from ..publishing.per_thread import get_publisher
from ..publishing.publisher import encode_body


def publish_deferred(
    routing_key: str,
    body: Any,
    properties: dict[str, Any],
    run_after_us: int,
    *,
    now_us: int | None = None,
    base: dict[str, Any] | None = None,
) -> None:
    """Publish a task into the delay levels, due at ``run_after_us`` (epoch microseconds)
    or at the longest delay the levels hold if that is sooner, with a confirm.

    It travels as a retry copy does (same levels, same landing, so it starts as exactly as
    a retry), addressed to the task's queue; its headers say its own route. ``now_us``: the
    moment the wait is reckoned from (default: now; the runner passes the due time of the
    round that just ended). ``base``: the properties of a delivery sent round again (the
    runner's), else fresh ones.
    """
    names = current_names()
    levels = current_levels()
    if base is None:
        data, ctype = encode_body(body, None)
        props = build_properties(ctype, None, properties, names)
    else:
        data, props = body, dict(base)
    start_us = epoch_us(timezone.now()) if now_us is None else now_us
    res_us = levels.resolution_ms * 1000
    units = -(-max(0, run_after_us - start_us) // res_us)  # rounded up: never before
    delay_ms = min(units * levels.resolution_ms, levels.max_delay_ms)
    landing = int(app_settings.DELAY_LANDING_MS)
    way = route(levels, names, delay_ms / 1000, start_us, landing_ms=landing)
    h = names.header
    headers = clean_headers(props.get("headers"))
    headers.update(
        {
            h("original-exchange"): names.work_exchange,
            h("original-routing-key"): routing_key,
            h("due"): way.due_ms,
            h("due-us"): way.due_us,
            names.target_header: f"{names.prefix}.{routing_key}",
        }
    )
    props["headers"] = headers
    get_publisher().send_items([broker.Outgoing(way.exchange, way.routing_key, data, props)])
