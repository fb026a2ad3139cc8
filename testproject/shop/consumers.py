"""The demo's receivers, found automatically because this module is called consumers.py."""

import logging
import random

from django_rmq_retry import Reject, receiver

from .events import order_paid, order_shipped
from .models import Invoice

logger = logging.getLogger("testproject.shop")


class WarehouseUnavailable(Exception):
    pass


@receiver(order_paid, idempotent=True)
def send_invoice(message, **kwargs):
    """Always succeeds: writes an invoice row, once per message even if it is delivered
    twice (idempotent: the row commits with an inbox row for the message)."""
    Invoice.objects.create(order_id=message.body["order_id"])
    logger.info("invoice written for order %s", message.body["order_id"])


@receiver(
    [order_paid, order_shipped], retry={"max_attempts": 4, "initial_delay": 1.0, "jitter": "none"}
)
def notify_warehouse(message, **kwargs):
    """Fails sometimes: orders whose id ends in 7 never get through (they retry with
    growing delays, then park); others fail on their first attempt one time in three."""
    order_id = message.body.get("order_id") if isinstance(message.body, dict) else None
    if order_id is None:
        raise Reject("message has no order_id")
    if order_id % 10 == 7:
        raise WarehouseUnavailable(f"warehouse refused order {order_id}")
    if message.attempt == 1 and random.random() < 1 / 3:
        raise WarehouseUnavailable(f"warehouse timed out for order {order_id}")
    logger.info("warehouse notified of order %s (attempt %d)", order_id, message.attempt)
