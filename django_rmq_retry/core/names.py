"""Names of every broker object and header we own, derived from one prefix.

Pure: no Django, no pika. Everything on the wire goes through here so the prefix is the
only knob and two projects sharing a vhost never collide.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Names:
    prefix: str

    # Exchanges -------------------------------------------------------------------------
    @cached_property
    def work_exchange(self) -> str:
        """Topic exchange that ``Topic.send`` publishes to."""
        return f"{self.prefix}.work"

    @cached_property
    def deliver_exchange(self) -> str:
        """Headers exchange that addresses exactly one receiver queue (retries, requeues)."""
        return f"{self.prefix}.deliver"

    @cached_property
    def orphan_exchange(self) -> str:
        """Fanout alternate exchange of :attr:`deliver_exchange`: catches unroutable copies."""
        return f"{self.prefix}.orphans"

    @cached_property
    def dead_exchange(self) -> str:
        """Fanout dead-letter exchange of quorum queues: what the broker gives up on."""
        return f"{self.prefix}.dead"

    def delay_exchange(self, level: int) -> str:
        return f"{self.prefix}.delay.{level:02d}"

    # Queues -----------------------------------------------------------------------------
    @cached_property
    def orphan_queue(self) -> str:
        """Retries whose receiver queue vanished while they waited; the consumer parks them."""
        return f"{self.prefix}.orphans"

    @cached_property
    def dead_queue(self) -> str:
        """Messages a quorum queue dead-lettered (its delivery limit); the consumer parks them."""
        return f"{self.prefix}.dead"

    def delay_queue(self, level: int) -> str:
        return f"{self.prefix}.delay.{level:02d}"

    # Per-key order (``core.ordering``) ----------------------------------------------------
    @staticmethod
    def partition_queue(queue: str, partition: int) -> str:
        """Partition ``partition`` of an ordered receiver whose queue would be ``queue``."""
        return f"{queue}.p{partition:02d}"

    @staticmethod
    def partition_exchange(queue: str) -> str:
        """Headers exchange that sends an ordered receiver's messages to their partition."""
        return f"{queue}.partitions"

    def partition_header(self, queue: str) -> str:
        """The header a publisher sets to the partition of the ordered receiver of ``queue``
        (one per ordered receiver: two of them may order one topic by different keys)."""
        return f"{self.prefix}-partition:{queue}"

    # Headers (no ``x-``: RabbitMQ 4.x treats client ``x-`` headers specially) ----------
    def header(self, name: str) -> str:
        try:
            return self._headers[name]
        except KeyError:
            return self._headers.setdefault(name, f"{self.prefix}-{name}")

    @cached_property
    def _headers(self) -> dict[str, str]:
        """Header names already built (every delivery reads several of them)."""
        return {}

    @cached_property
    def delay_exchange_prefix(self) -> str:
        """What every delay level's exchange name starts with (``<prefix>.delay.``)."""
        return f"{self.prefix}.delay."

    @cached_property
    def target_header(self) -> str:
        return self.header("target")


#: Every header we own, by the part after ``<prefix>-``, with what it carries. The reference
#: documentation and the AsyncAPI document are written from this table, and a test fails when
#: the code names a header that is missing here.
OUR_HEADERS: dict[str, str] = {
    "attempt": "Attempt number of this delivery (absent: 1). Counted by us, never from x-death.",
    "first-failure": "ISO 8601 UTC time of the first failure.",
    "last-failure": "ISO 8601 UTC time of the latest failure.",
    "error-type": "Class of the latest exception (one line).",
    "error": "Message of the latest exception, one line, truncated to ERROR_HEADER_MAX.",
    "history": (
        "One short record per failed attempt (when, host:pid, run time, exception and frame, "
        "next delay); the first 2 and last 3 kept; the first header dropped when a copy is too big."
    ),
    "original-exchange": "The exchange the message was first published to.",
    "original-routing-key": "The routing key it was first published with.",
    "original-expiration": "The sender's expiration property, kept aside: a TTL would cut a delay short.",
    "original-user-id": "The sender's user_id property, kept aside: the broker checks it against the login.",
    "held": "Per-key order: the set-aside row a released copy was published from.",
    "partition:<queue>": (
        "For an ordered receiver (its queue named after the colon): the partition of the "
        "message's ordering key, set by the publisher."
    ),
    "target": "The receiver queue a retry or requeue copy is addressed to (deliver exchange).",
    "due": "When a retry is due: epoch milliseconds, rounded up.",
    "due-us": "When a retry is due: epoch microseconds (the landing waits for it).",
    "requeued": "How many times an operator requeued this message.",
    "parked-id": "The parked row a requeue copy came from.",
    "operation": "The background requeue operation a requeued copy belongs to (its outcome is reported to it).",
    "prev-span": "With TRACING: the W3C traceparent of the previous attempt's span (the next attempt links to it).",
}
