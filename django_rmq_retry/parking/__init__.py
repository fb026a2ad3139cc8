"""Parked messages: park (``park``), put back to work (``requeue``), discard and purge
(``retention``), and the row codec (``rows``). The admin and the management commands call
these functions; neither holds logic of its own."""

from . import holds  # noqa: F401  (per-key order listens for parked and discarded rows)
from .group_counts import counts_kept, recount
from .intake import ParkRequest, park, park_key, park_many, stripped_request
from .queries import WordsMatch, distinct_values
from .requeuing import (
    MODE_RECEIVER,
    MODE_TOPIC,
    REQUEUE_WINDOW,
    RequeueInterrupted,
    RequeueResult,
    requeue,
    requeue_target,
)
from .retention import discard, parked_total, purge, summary
from .rows import row_properties

__all__ = [
    "MODE_RECEIVER",
    "MODE_TOPIC",
    "REQUEUE_WINDOW",
    "ParkRequest",
    "RequeueInterrupted",
    "RequeueResult",
    "WordsMatch",
    "counts_kept",
    "discard",
    "distinct_values",
    "park",
    "park_key",
    "park_many",
    "parked_total",
    "purge",
    "recount",
    "requeue",
    "requeue_target",
    "row_properties",
    "stripped_request",
    "summary",
]
