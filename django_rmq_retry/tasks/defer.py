"""Deferred tasks (``run_after``): held by the broker's delay levels, like retry copies."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from .. import broker
from ..conf import app_settings, current_levels, current_names
from ..core.delays import epoch_us, route
from ..core.envelope import build_properties
from ..publishing.per_thread import get_publisher
from ..publishing.publisher import encode_body


def publish_deferred(
    routing_key: str,
    body: Any,
    properties: dict[str, Any],
    delay_s: float,
    *,
    base: dict[str, Any] | None = None,
) -> None:
    """Publish a task into the delay levels, due in ``delay_s`` seconds, with a confirm.

    It travels as a retry copy does (same levels, same landing, so it starts as exactly as
    a retry), addressed to the task's queue; its headers say attempt 1 and its own route.
    ``base``: the properties of a delivery sent on again (the runner's), else fresh ones.
    """
    names = current_names()
    levels = current_levels()
    if base is None:
        data, ctype = encode_body(body, None)
        props = build_properties(ctype, None, properties, names)
    else:
        data, props = body, dict(base)
    landing = int(app_settings.DELAY_LANDING_MS)
    way = route(levels, names, delay_s, epoch_us(timezone.now()), landing_ms=landing)
    h = names.header
    headers = dict(props.get("headers") or {})
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
