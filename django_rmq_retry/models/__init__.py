"""Database state: parked messages, requeue operations, delivery bookkeeping, and the
tables of the features a project turns on (dependency breakers, per-key order, periodic
tasks). One module per concern; every model is imported here, where Django and our code
find them (``from django_rmq_retry.models import ParkedMessage``)."""

from __future__ import annotations

from .breakers import (
    STATE_CHOICES as STATE_CHOICES,
)
from .breakers import (
    STATE_LABELS as STATE_LABELS,
)
from .breakers import (
    Dependency as Dependency,
)
from .breakers import (
    DependencyEvent as DependencyEvent,
)
from .breakers import (
    DependencyFailure as DependencyFailure,
)
from .delivery import (
    DeclaredQueue as DeclaredQueue,
)
from .delivery import (
    DeliveryStart as DeliveryStart,
)
from .delivery import (
    InboxEntry as InboxEntry,
)
from .delivery import (
    OutboxMessage as OutboxMessage,
)
from .delivery import (
    OutboxStatus as OutboxStatus,
)
from .delivery import (
    RetryPolicy as RetryPolicy,
)
from .delivery import (
    TaskResultRecord as TaskResultRecord,
)
from .operations import (
    ItemState as ItemState,
)
from .operations import (
    OperationState as OperationState,
)
from .operations import (
    RequeueItem as RequeueItem,
)
from .operations import (
    RequeueOperation as RequeueOperation,
)
from .ordering import (
    HOLD_STATE_CHOICES as HOLD_STATE_CHOICES,
)
from .ordering import (
    HOLD_STATE_LABELS as HOLD_STATE_LABELS,
)
from .ordering import (
    HeldMessage as HeldMessage,
)
from .ordering import (
    KeyHold as KeyHold,
)
from .parked import (
    PARK_REASON_CHOICES as PARK_REASON_CHOICES,
)
from .parked import (
    PARK_REASON_LABELS as PARK_REASON_LABELS,
)
from .parked import (
    FailureGroupAlert as FailureGroupAlert,
)
from .parked import (
    ParkedClaim as ParkedClaim,
)
from .parked import (
    ParkedGroupCount as ParkedGroupCount,
)
from .parked import (
    ParkedGroupSnapshot as ParkedGroupSnapshot,
)
from .parked import (
    ParkedMessage as ParkedMessage,
)
from .parked import (
    ParkedStatus as ParkedStatus,
)
from .periodic import (
    PeriodicTask as PeriodicTask,
)
