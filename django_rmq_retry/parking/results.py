"""What a requeue run reports, and the ways it can send a row back."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import PublishError

MODE_RECEIVER = "receiver"  # back to the queue of the receiver it failed in
MODE_TOPIC = "topic"  # to the work exchange with the original routing key (all receivers)


#: Ids a result keeps of the rows requeued, and of those refused (a background operation's
#: step sends at most this many, so its result names every row).
IDS_KEPT = 1000


@dataclass
class RequeueResult:
    requeued: int = 0
    failed: int = 0
    skipped: int = 0
    matched: int = 0
    errors: list[str] = field(default_factory=list)  # for people: the first 20
    requeued_ids: list[int] = field(default_factory=list)
    #: Rows counted in ``failed``: refused by the broker, too large, unroutable or nacked.
    refused_ids: list[int] = field(default_factory=list)
    stopped: bool = False  # the deadline came first: matching rows may still be parked

    def add(self, other: RequeueResult) -> None:
        """Count ``other``'s run in this one (a step that sends in several runs)."""
        self.requeued += other.requeued
        self.failed += other.failed
        self.skipped += other.skipped
        self.matched += other.matched
        for text in other.errors:
            self.add_error(text)
        self.requeued_ids += other.requeued_ids[: max(0, IDS_KEPT - len(self.requeued_ids))]
        self.refused_ids += other.refused_ids[: max(0, IDS_KEPT - len(self.refused_ids))]
        self.stopped = self.stopped or other.stopped

    def add_error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)

    def add_refused(self, pk: int, text: str) -> None:
        """Row ``pk`` is not requeued (it stays parked) and counts as failed, because ``text``."""
        self.failed += 1
        if len(self.refused_ids) < IDS_KEPT:
            self.refused_ids.append(pk)
        self.add_error(f"#{pk}: {text}")


class RequeueInterrupted(PublishError):
    """The broker went away (or stopped answering) during a requeue.

    ``partial`` is what the run did before it stopped: the rows the broker confirmed are
    marked requeued and counted there, the others were released and stay parked (running
    the requeue again continues, and requeues none of them twice).
    """

    partial: RequeueResult

    def __init__(self, message: str, partial: RequeueResult) -> None:
        super().__init__(message)
        self.partial = partial
