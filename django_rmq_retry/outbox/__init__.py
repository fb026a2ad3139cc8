"""The transactional outbox: ``store`` writes a message in the sender's transaction,
``relay`` publishes committed rows with confirms and deletes them only once confirmed."""

from .drain import publish_all
from .relay import (
    RelayRound,
    publish_pending,
    relay_wakeup,
    release_held,
    rows_written,
)
from .store import enqueue, enqueue_many

__all__ = [
    "RelayRound",
    "enqueue",
    "enqueue_many",
    "publish_all",
    "publish_pending",
    "relay_wakeup",
    "release_held",
    "rows_written",
]
