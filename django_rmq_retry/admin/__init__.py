"""Admin for parked messages (view-only rows, permission-gated actions) and retry policies.

Every action calls the service functions in :mod:`django_rmq_retry.parking`, the same ones
``manage.py rmq_requeue`` uses; nothing here talks to the broker or decides anything itself.
Everything shown from a message (body, headers, errors) goes through Django's escaping.

One module per page: :mod:`.changelist` (list, filters, search), :mod:`.detail` (one
message and its history), :mod:`.parked_actions` (requeue, republish, discard),
:mod:`.edit_page` (edit once, then requeue), :mod:`.requeue_operations` (ramped and canary
requeues, with their progress), :mod:`.dashboard` (failure groups), :mod:`.retry_policies`
(retry policy overrides), :mod:`.outbox` (rows waiting to be published, and those held),
:mod:`.tasks` (task results), :mod:`.dependencies` (the dependency breakers),
:mod:`.holds` (per-key order: held keys and the messages behind them), :mod:`.periodic`
(periodic tasks' schedules);
:mod:`.parked` puts the parked-message admin together and registers it. :mod:`.preview`
shows a body to an operator.
"""

from __future__ import annotations

from . import holds, outbox  # noqa: F401  (the held keys' and the outbox's admins register)
from .changelist import COUNT_CAP, CappedPaginator, IndexedValuesFilter
from .dependencies import DependencyAdmin
from .parked import ParkedMessageAdmin
from .periodic import PeriodicTaskAdmin
from .requeue_operations import RequeueOperationAdmin
from .retry_policies import RetryPolicyAdmin, RetryPolicyForm
from .tasks import TaskResultRecordAdmin

__all__ = [
    "COUNT_CAP",
    "CappedPaginator",
    "DependencyAdmin",
    "IndexedValuesFilter",
    "ParkedMessageAdmin",
    "PeriodicTaskAdmin",
    "RequeueOperationAdmin",
    "RetryPolicyAdmin",
    "RetryPolicyForm",
    "TaskResultRecordAdmin",
]
