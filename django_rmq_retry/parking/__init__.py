"""Parked messages: park (``park``), put back to work (``requeue``), discard and purge
(``retention``), and the row codec (``rows``). The admin and the management commands call
these functions; neither holds logic of its own."""

from .park import ParkRequest, park, park_key, park_many, stripped_request
from .requeue import (
    MODE_RECEIVER,
    MODE_TOPIC,
    REQUEUE_WINDOW,
    RequeueResult,
    requeue,
    requeue_target,
)
from .retention import discard, purge, summary
from .rows import row_properties

__all__ = [
    "MODE_RECEIVER",
    "MODE_TOPIC",
    "REQUEUE_WINDOW",
    "ParkRequest",
    "RequeueResult",
    "discard",
    "park",
    "park_key",
    "park_many",
    "purge",
    "requeue",
    "requeue_target",
    "row_properties",
    "stripped_request",
    "summary",
]
