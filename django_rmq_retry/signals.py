"""Signals for alerts and metrics. All are sent after the fact they announce is durable.

* ``message_retried(receiver, message, attempt, delay, error)`` — retry copy confirmed.
* ``message_parked(receiver, parked, reason, created)`` — row committed.
* ``message_requeued(parked_ids, user, mode)`` — batch confirmed by the broker and marked.
* ``message_discarded(parked_ids, user)`` — rows marked discarded.

``sender`` is the receiver's dotted path for the first two and ``"django_rmq_retry"`` for the
operator actions. Receivers of these signals must not raise; errors are logged and ignored.
"""

from __future__ import annotations

from django.dispatch import Signal

message_retried = Signal()
message_parked = Signal()
message_requeued = Signal()
message_discarded = Signal()
