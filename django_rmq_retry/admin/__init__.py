"""Admin for parked messages (view-only rows, permission-gated actions) and retry policies.

Every action calls the service functions in :mod:`django_rmq_retry.parking`, the same ones
``manage.py rmq_requeue`` uses; nothing here talks to the broker or decides anything itself.
Everything shown from a message (body, headers, errors) goes through Django's escaping.

One module per page: :mod:`.changelist` (list, filters, search), :mod:`.detail` (one
message and its history), :mod:`.operations` (requeue, discard), :mod:`.dashboard`
(failure groups), :mod:`.policies` (retry policy overrides); :mod:`.parked` puts the
parked-message admin together and registers it.
"""

from __future__ import annotations

from .. import admin_outbox  # noqa: F401  (the outbox's admin registers itself)
from .changelist import COUNT_CAP, CappedPaginator, IndexedValuesFilter
from .parked import ParkedMessageAdmin
from .policies import RetryPolicyAdmin, RetryPolicyForm
from .progress import RequeueOperationAdmin
from .tasks import TaskResultRecordAdmin

__all__ = [
    "COUNT_CAP",
    "CappedPaginator",
    "IndexedValuesFilter",
    "ParkedMessageAdmin",
    "RequeueOperationAdmin",
    "RetryPolicyAdmin",
    "RetryPolicyForm",
    "TaskResultRecordAdmin",
]
