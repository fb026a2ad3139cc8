"""Database state: parked messages, retry policy overrides, delivery bookkeeping."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.utils.translation import gettext_lazy as _

from .breaker_models import Dependency as Dependency  # the breakers' tables, found here
from .breaker_models import DependencyEvent as DependencyEvent
from .breaker_models import DependencyFailure as DependencyFailure
from .core.backoff import Policy, policy_errors
from .core.outcome import ParkReason
from .ordering_models import HeldMessage as HeldMessage  # per-key order's tables, found here
from .ordering_models import KeyHold as KeyHold
from .periodic_models import PeriodicTask as PeriodicTask  # periodic tasks' schedules

#: What operators read for each of the core's park reasons. The values live in
#: ``outcome.ParkReason`` only (the core stays free of Django); a reason added there
#: without a label here fails at import time, not in front of an operator.
PARK_REASON_LABELS = {
    ParkReason.EXHAUSTED: _("Retries exhausted"),
    ParkReason.REJECTED: _("Rejected by receiver"),
    ParkReason.NON_RETRYABLE: _("Non-retryable error"),
    ParkReason.UNDECODABLE: _("Undecodable body"),
    ParkReason.DELIVERY_LIMIT: _("Delivery limit (consumer kept dying)"),
    ParkReason.ORPHANED: _("Receiver queue missing"),
    ParkReason.INVALID: _("Invalid (does not fit its schema)"),
}
PARK_REASON_CHOICES = [(reason.value, PARK_REASON_LABELS[reason]) for reason in ParkReason]


class ParkedStatus(models.TextChoices):
    PARKED = "parked", _("Parked")
    REQUEUED = "requeued", _("Requeued")
    DISCARDED = "discarded", _("Discarded")


class ParkedMessage(models.Model):
    """A message that ran out of attempts (or could not be handled), kept bit for bit.

    Everything needed to publish it again exactly is here (body bytes, every AMQP property,
    headers, route, receiver); so is its failure story and what operators did with it.
    """

    # Idempotency: the delivery that produced the latest parking of this row. Unique through
    # a constraint (Meta), not unique=True, which adds on PostgreSQL a second, LIKE-only index
    # (varchar_pattern_ops) that no query uses and every park pays for.
    park_key = models.CharField(_("park key"), max_length=64)

    receiver = models.CharField(_("receiver"), max_length=255)
    queue = models.CharField(_("queue"), max_length=255)
    exchange = models.CharField(_("exchange"), max_length=255, blank=True)
    routing_key = models.CharField(_("routing key"), max_length=255, blank=True)
    message_id = models.CharField(_("message id"), max_length=255, blank=True)
    correlation_id = models.CharField(_("correlation id"), max_length=255, blank=True)

    body = models.BinaryField(_("body"))
    body_size = models.PositiveBigIntegerField(_("body size (bytes)"), default=0)
    content_type = models.CharField(_("content type"), max_length=255, blank=True)
    properties = models.JSONField(_("AMQP properties"), default=dict, blank=True)
    headers = models.JSONField(_("headers"), default=dict, blank=True)

    reason = models.CharField(_("reason"), max_length=20, choices=PARK_REASON_CHOICES)
    reason_detail = models.TextField(_("reason detail"), blank=True)
    error_type = models.CharField(_("error type"), max_length=255, blank=True)
    error_message = models.TextField(_("error message"), blank=True)
    traceback = models.TextField(_("traceback"), blank=True)
    fingerprint = models.CharField(
        _("failure group"),
        max_length=255,
        blank=True,
        help_text=_("Exception class and the first frame in project code; groups alike failures."),
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    first_failure_at = models.DateTimeField(_("first failure"), null=True, blank=True)
    last_failure_at = models.DateTimeField(_("last failure"), null=True, blank=True)
    parked_at = models.DateTimeField(_("parked at"))
    park_count = models.PositiveIntegerField(
        _("times parked"), default=1, help_text=_("Parkings of this message (after requeues).")
    )

    status = models.CharField(
        _("status"), max_length=12, choices=ParkedStatus.choices, default=ParkedStatus.PARKED
    )
    status_changed_at = models.DateTimeField(_("status changed"), null=True, blank=True)
    status_changed_by = models.CharField(_("changed by"), max_length=150, blank=True)
    requeue_count = models.PositiveIntegerField(_("times requeued"), default=0)
    history = models.JSONField(_("history"), default=list, blank=True)
    field_errors = models.JSONField(
        _("field errors"),
        null=True,
        blank=True,
        help_text=_('An invalid body\'s failing fields: [{"loc": [...], "msg": ...}].'),
    )

    class Meta:
        verbose_name = _("parked message")
        verbose_name_plural = _("parked messages")
        ordering = ("-parked_at", "-id")
        permissions = [
            ("requeue_parkedmessage", _("Can requeue parked messages")),
            ("discard_parkedmessage", _("Can discard parked messages")),
            ("edit_parkedmessage", _("Can edit a parked message and requeue the edited copy")),
        ]
        indexes = [
            models.Index(fields=["status", "parked_at"], name="rmqr_parked_status_at"),
            # Each filter column with the list's order: "newest 50 rows of this receiver"
            # is an index range read backwards, however many rows the table holds, and the
            # sidebar reads the column's values from the same index.
            models.Index(fields=["receiver", "parked_at"], name="rmqr_parked_receiver_at"),
            models.Index(fields=["queue", "parked_at"], name="rmqr_parked_queue_at"),
            models.Index(fields=["error_type", "parked_at"], name="rmqr_parked_error_at"),
            models.Index(fields=["fingerprint", "parked_at"], name="rmqr_parked_group_at"),
            models.Index(fields=["reason", "status"], name="rmqr_parked_reason"),
            models.Index(fields=["parked_at"], name="rmqr_parked_at"),
            models.Index(fields=["message_id"], name="rmqr_parked_msgid"),
            models.Index(fields=["correlation_id"], name="rmqr_parked_corr"),
            # The changelist's range filters (last failed between, attempts >= N): a range
            # read on these, or the parked_at index walked backwards, whichever the planner
            # finds fewer rows in; see docs/howto/operators.md.
            models.Index(fields=["last_failure_at"], name="rmqr_parked_last_failure"),
            models.Index(fields=["attempts"], name="rmqr_parked_attempts"),
            # And on PostgreSQL only (migration 0001, not declared here): the full-text index
            # rmqr_parked_error_words on to_tsvector('simple', error_message).
        ]
        constraints = [
            models.UniqueConstraint(fields=["park_key"], name="rmqr_parked_park_key"),
        ]

    def __str__(self) -> str:
        return f"{self.receiver} · {self.message_id or self.pk} ({self.get_status_display()})"


class ParkedClaim(models.Model):
    """A requeue run's claim on one parked row while the run publishes it.

    Two runs (two operators, a double click) never publish one row twice: a row is published
    only by the run whose claim row was inserted (the primary key refuses a second), and
    marked requeued only while that claim stands. A narrow table of its own rather than a
    status on the parked row: a status would be an UPDATE of a wide row with a dozen indexes
    to claim and another to release; an INSERT here and its release cost PostgreSQL a
    fraction of that per row (see bench/README.md). Claims older than
    ``REQUEUE_CLAIM_TIMEOUT`` (a run killed mid-way) are deleted by the next run, which may
    then publish those rows again.
    """

    parked_id = models.BigIntegerField(_("parked message"), primary_key=True)
    token = models.CharField(_("requeue run"), max_length=32)
    claimed_at = models.DateTimeField(_("claimed at"))

    class Meta:
        verbose_name = _("requeue claim")
        verbose_name_plural = _("requeue claims")
        indexes = [models.Index(fields=["token"], name="rmqr_claim_token")]

    def __str__(self) -> str:
        return f"#{self.parked_id} claimed by {self.token}"


class ParkedGroupCount(models.Model):
    """How many parked-message rows each (receiver, failure group, error type, status) holds.

    Kept by the database itself, not computed: triggers on the parked-message table
    (migration 0001; PostgreSQL once per statement, SQLite once per row) add and subtract as
    rows are parked, requeued, discarded and purged, inside the transaction that changed
    them, so the counts are right under any concurrency and whatever wrote the rows.
    ``manage.py rmq_recount_parked`` recomputes them. The failure-groups page reads these
    rows instead of grouping millions of parked rows.
    """

    receiver = models.CharField(_("receiver"), max_length=255)
    fingerprint = models.CharField(_("failure group"), max_length=255, blank=True)
    error_type = models.CharField(_("error type"), max_length=255, blank=True)
    status = models.CharField(_("status"), max_length=12, choices=ParkedStatus.choices)
    count = models.BigIntegerField(_("rows"), default=0)
    #: The latest parked_at written into this group with this status (never lowered).
    last_parked_at = models.DateTimeField(_("last parked"), null=True, blank=True)

    class Meta:
        verbose_name = _("parked group count")
        verbose_name_plural = _("parked group counts")
        constraints = [
            models.UniqueConstraint(
                fields=["receiver", "fingerprint", "error_type", "status"], name="rmqr_group_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.receiver} · {self.fingerprint} · {self.status}: {self.count}"


class OperationState(models.TextChoices):
    RUNNING = "running", _("Running")
    PAUSED = "paused", _("Paused")
    CANCELLED = "cancelled", _("Cancelled")
    STOPPED = "stopped", _("Stopped at a new failure")
    DONE = "done", _("Done")


class RequeueOperation(models.Model):
    """A requeue that runs in the background: the consumers' housekeeping thread (or
    ``manage.py rmq_operations``) advances it a step at a time, never a web request.

    The selection is fixed when the operation is created: one :class:`RequeueItem` per
    parked row it covers (inserted by one ``INSERT ... SELECT``), so rows parked later do
    not join. The counters are kept by the statements that change the items (``F()``
    updates in the same transaction), so the admin's progress reads this one row.

    Several processes write it: an operator's pause, resume and cancel, the process
    stepping it (its lease), the consumers reporting outcomes. Each write is one
    conditional ``UPDATE`` (``parking.operations``): what an operator set always wins over
    a step in flight.
    """

    created_by = models.CharField(_("created by"), max_length=150)
    created_at = models.DateTimeField(_("created at"))
    description = models.TextField(_("selection"), blank=True)
    mode = models.CharField(_("mode"), max_length=12, default="receiver")

    canary = models.PositiveIntegerField(
        _("canary"), default=0, help_text=_("Send this many first, wait for their outcome.")
    )
    ramp = models.BooleanField(_("ramp"), default=False)
    rate = models.FloatField(_("rate (msg/s)"), null=True, blank=True)
    stop_on_failure = models.BooleanField(_("stop at the first new failure"), default=True)

    state = models.CharField(
        _("state"), max_length=12, choices=OperationState.choices, default=OperationState.RUNNING
    )
    state_reason = models.TextField(_("state reason"), blank=True)
    state_changed_by = models.CharField(_("state changed by"), max_length=150, blank=True)
    updated_at = models.DateTimeField(_("updated at"))
    #: Steps: the ramp's index, and when the next step may send (the rate's clock).
    step = models.PositiveIntegerField(_("step"), default=0)
    next_at = models.DateTimeField(_("next step at"))
    #: Which process advances it now (one at a time), and until when that holds.
    lease_owner = models.CharField(_("lease owner"), max_length=64, blank=True)
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    started_sending_at = models.DateTimeField(_("first sent at"), null=True, blank=True)
    last_sent_at = models.DateTimeField(_("last sent at"), null=True, blank=True)

    total = models.PositiveIntegerField(_("total"), default=0)
    sent = models.PositiveIntegerField(_("sent"), default=0)
    handled = models.PositiveIntegerField(_("handled"), default=0)
    failed_again = models.PositiveIntegerField(_("failed again"), default=0)
    refused = models.PositiveIntegerField(_("refused by the broker"), default=0)
    skipped = models.PositiveIntegerField(_("skipped"), default=0)
    #: Sent (or maybe sent, by a step that died) and no outcome reported in time: a part of
    #: ``sent``, no longer waited for.
    unknown = models.PositiveIntegerField(_("outcome unknown"), default=0)
    #: Failures counted before the last resume: a resume goes on past them.
    failed_baseline = models.PositiveIntegerField(_("failed before the last resume"), default=0)
    #: ``sent`` when the operation was last resumed after a stop: the canary starts again there.
    canary_from = models.PositiveIntegerField(_("canary from"), default=0)
    #: When a copy's outcome was last reported (or the operation resumed): waits time out.
    last_outcome_at = models.DateTimeField(_("last outcome at"), null=True, blank=True)

    class Meta:
        verbose_name = _("requeue operation")
        verbose_name_plural = _("requeue operations")
        ordering = ("-created_at", "-id")
        indexes = [models.Index(fields=["state", "next_at"], name="rmqr_op_state_next")]

    def __str__(self) -> str:
        return f"Requeue operation #{self.pk} ({self.get_state_display()})"


class ItemState(models.TextChoices):
    PENDING = "pending", _("Pending")
    #: Taken by a step (fenced by its lease) and being published now.
    SENDING = "sending", _("Sending")
    SENT = "sent", _("Sent")
    HANDLED = "handled", _("Handled")
    FAILED = "failed", _("Failed again")
    REFUSED = "refused", _("Refused by the broker")
    SKIPPED = "skipped", _("Skipped (no longer parked)")
    #: Sent, or maybe sent by a step that died, and no outcome reported in time: never sent
    #: again by the operation (a late report still counts it).
    UNKNOWN = "unknown", _("Outcome unknown")


class RequeueItem(models.Model):
    """One parked row of an operation's selection, and what became of it."""

    operation = models.ForeignKey(RequeueOperation, on_delete=models.CASCADE, related_name="items")
    parked_id = models.BigIntegerField(_("parked message"))
    state = models.CharField(
        _("state"), max_length=8, choices=ItemState.choices, default=ItemState.PENDING
    )
    #: An operator's edit (``parking.edit``): the body sent instead of the row's, which keeps
    #: the original. ``None``: the row's own body and headers.
    edit_body = models.BinaryField(_("edited body"), null=True, blank=True)
    #: Headers written over the copy's (``None`` removes one), with the edited body.
    edit_headers = models.JSONField(_("edited headers"), null=True, blank=True)
    #: What the edit changed, for the row's history once the copy is sent (a database
    #: default: an operation's items are written by ``INSERT ... SELECT``).
    edit_diff = models.TextField(_("edit diff"), blank=True, default="", db_default="")

    class Meta:
        verbose_name = _("requeue operation item")
        verbose_name_plural = _("requeue operation items")
        constraints = [
            models.UniqueConstraint(fields=["operation", "parked_id"], name="rmqr_op_item"),
            # Edit once: one edit of a row waits to be sent at a time, whoever submits it.
            models.UniqueConstraint(
                fields=["parked_id"],
                condition=models.Q(edit_body__isnull=False, state__in=["pending", "sending"]),
                name="rmqr_one_edit",
            ),
        ]
        indexes = [
            models.Index(fields=["operation", "state", "parked_id"], name="rmqr_op_item_state")
        ]

    def __str__(self) -> str:
        return f"#{self.parked_id} in operation {self.operation_id}: {self.state}"


class FailureGroupAlert(models.Model):
    """When a failure group last gave an alert, and at which size: one alert per group per
    window, whatever the number of messages or processes (``parking.alerts``)."""

    receiver = models.CharField(_("receiver"), max_length=255)
    fingerprint = models.CharField(_("failure group"), max_length=255, blank=True)
    error_type = models.CharField(_("error type"), max_length=255, blank=True)
    alerted_at = models.DateTimeField(_("alerted at"))
    count = models.BigIntegerField(_("rows then"), default=0)

    class Meta:
        verbose_name = _("failure group alert")
        verbose_name_plural = _("failure group alerts")
        constraints = [
            models.UniqueConstraint(
                fields=["receiver", "fingerprint", "error_type"], name="rmqr_alert_group"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.receiver} · {self.fingerprint}: alerted at {self.count}"


class ParkedGroupSnapshot(models.Model):
    """A failure group's parked and requeued counts at one hour (``parking.snapshots``):
    copied from :class:`ParkedGroupCount` by the consumers, kept eight days, read by the
    dashboard's charts (never the parked rows)."""

    hour = models.DateTimeField(_("hour"))
    receiver = models.CharField(_("receiver"), max_length=255)
    fingerprint = models.CharField(_("failure group"), max_length=255, blank=True)
    error_type = models.CharField(_("error type"), max_length=255, blank=True)
    parked = models.BigIntegerField(_("parked"), default=0)
    requeued = models.BigIntegerField(_("requeued"), default=0)

    class Meta:
        verbose_name = _("failure group snapshot")
        verbose_name_plural = _("failure group snapshots")
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "receiver", "fingerprint", "error_type"], name="rmqr_snapshot_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.receiver}: {self.parked} parked"


class RetryPolicy(models.Model):
    """Overrides a receiver's retry policy at run time; consumers pick it up within
    ``POLICY_CACHE_SECONDS`` without a restart."""

    class Jitter(models.TextChoices):
        NONE = "none", _("None: base delay")
        FULL = "full", _("Full: uniform(0, base)")
        EQUAL = "equal", _("Equal: base/2 + uniform(0, base/2)")

    receiver = models.CharField(
        _("receiver"),
        max_length=255,
        unique=True,
        help_text=_("Dotted path of the receiver function, as `rmq_consume --list` shows it."),
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    max_attempts = models.PositiveIntegerField(_("max attempts"), default=5)
    initial_delay = models.FloatField(_("initial delay (s)"), default=1.0)
    multiplier = models.FloatField(_("multiplier"), default=2.0)
    max_delay = models.FloatField(_("max delay (s)"), default=3600.0)
    jitter = models.CharField(_("jitter"), max_length=8, choices=Jitter.choices, default="full")
    dont_retry = models.TextField(
        _("never retry"),
        blank=True,
        help_text=_("Dotted exception class paths, one per line, that park at once."),
    )
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        verbose_name = _("retry policy")
        verbose_name_plural = _("retry policies")
        ordering = ("receiver",)

    def __str__(self) -> str:
        return self.receiver

    def dont_retry_list(self) -> tuple[str, ...]:
        return tuple(line.strip() for line in self.dont_retry.splitlines() if line.strip())

    def clean(self) -> None:
        errors = policy_errors(
            self.max_attempts, self.initial_delay, self.multiplier, self.max_delay, self.jitter
        )
        if errors:
            raise ValidationError(errors)

    def to_policy(self) -> Policy:
        return Policy(
            max_attempts=self.max_attempts,
            initial_delay=self.initial_delay,
            multiplier=self.multiplier,
            max_delay=self.max_delay,
            jitter=self.jitter,  # type: ignore[arg-type]
            dont_retry=self.dont_retry_list(),
        )


class DeliveryStart(models.Model):
    """Receiver starts of a redelivered message that never finished (the consumer died).

    Written only for redelivered messages and deleted once the receiver returns, so it costs
    nothing on the happy path and lets classic queues park a process-killing message.
    """

    key = models.CharField(max_length=64, unique=True)
    queue = models.CharField(max_length=255)
    message_id = models.CharField(max_length=255, blank=True)
    starts = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("delivery start")
        verbose_name_plural = _("delivery starts")

    def __str__(self) -> str:
        return f"{self.queue} {self.message_id} ({self.starts} starts)"


class OutboxStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    HELD = "held", _("Held (needs an operator)")


class OutboxMessage(models.Model):
    """A message written in the sender's database transaction, published by the relay.

    The row commits or rolls back with the transaction that sent it, so a committed event is
    never lost between the commit and the broker (and a rolled-back one never leaves). The
    relay deletes it only once the broker confirmed it.
    """

    id = models.BigAutoField(primary_key=True)
    #: The transaction that wrote the row: its rows are published in ``id`` order.
    group = models.CharField(_("transaction"), max_length=32)
    exchange = models.CharField(_("exchange"), max_length=255, blank=True)
    routing_key = models.CharField(_("routing key"), max_length=255)
    message_id = models.CharField(_("message id"), max_length=255, blank=True)
    body = models.BinaryField(_("body"))
    properties = models.JSONField(_("AMQP properties"), default=dict, blank=True)
    #: The same properties AMQP-encoded by the sender (``broker.wire``): the relay publishes
    #: these bytes as they are. Empty for a message id the ``message_id`` column cannot hold
    #: exactly: the relay encodes the JSON then.
    wire_properties = models.BinaryField(_("encoded properties"), null=True)
    created_at = models.DateTimeField(_("created"))
    status = models.CharField(
        _("status"), max_length=8, choices=OutboxStatus.choices, default=OutboxStatus.PENDING
    )
    attempts = models.PositiveIntegerField(_("publish attempts"), default=0)
    available_at = models.DateTimeField(_("next attempt"))
    last_error = models.TextField(_("last error"), blank=True)

    class Meta:
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        ordering = ("id",)
        indexes = [
            # The relay's scan (pending, oldest first) and its in-order check per transaction.
            models.Index(fields=["status", "id"], name="rmqr_outbox_status"),
            models.Index(fields=["group", "id"], name="rmqr_outbox_group"),
        ]

    def __str__(self) -> str:
        return f"{self.routing_key} · {self.message_id or self.pk} ({self.get_status_display()})"


class InboxEntry(models.Model):
    """A message an idempotent receiver handled: written in the receiver's own transaction,
    so a redelivery after a crash between that commit and the ack is acked without a rerun."""

    receiver = models.CharField(_("receiver"), max_length=255)
    #: The message id, or ``sha256:`` of routing key and body when it has none.
    key = models.CharField(_("message key"), max_length=255)
    handled_at = models.DateTimeField(_("handled at"), db_index=True)

    class Meta:
        verbose_name = _("handled message")
        verbose_name_plural = _("handled messages (idempotent receivers)")
        constraints = [
            models.UniqueConstraint(fields=["receiver", "key"], name="rmqr_inbox_once"),
        ]

    def __str__(self) -> str:
        return f"{self.receiver} · {self.key}"


class TaskResultRecord(models.Model):
    """One ``django.tasks`` result of ``django_rmq_retry.tasks.RabbitMQBackend``.

    Written only by a backend whose results are on (``OPTIONS["results"]``): at enqueue,
    then at each attempt's start and end. ``errors`` holds one entry per failed attempt and
    ``worker_ids`` one per attempt (``TaskContext.attempt`` counts them, as Django does).
    Rows older than the backend's retention are deleted by its workers.
    """

    id = models.CharField(_("result id"), max_length=64, primary_key=True)
    backend = models.CharField(_("backend alias"), max_length=100)
    task_path = models.CharField(_("task"), max_length=255)
    queue_name = models.CharField(_("queue name"), max_length=100)
    priority = models.SmallIntegerField(_("priority"), default=0)
    status = models.CharField(_("status"), max_length=20, db_index=True)
    args = models.JSONField(_("arguments"), default=list)
    kwargs = models.JSONField(_("keyword arguments"), default=dict)
    run_after = models.DateTimeField(_("run after"), null=True, blank=True)
    enqueued_at = models.DateTimeField(_("enqueued"), null=True, blank=True)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)
    last_attempted_at = models.DateTimeField(_("last attempted"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)
    return_value = models.JSONField(_("return value"), null=True, blank=True)
    errors = models.JSONField(_("errors"), default=list)
    worker_ids = models.JSONField(_("worker ids"), default=list)
    updated_at = models.DateTimeField(_("updated"))

    class Meta:
        verbose_name = _("task result")
        verbose_name_plural = _("task results")
        indexes = [models.Index(fields=["updated_at"], name="rmqr_taskresult_updated")]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id} {self.status}"


class DeclaredQueue(models.Model):
    """A receiver queue this project declared (``rmq_setup``, ``rmq_consume`` at start).

    RabbitMQ's AMQP cannot list queues, so the app remembers the names it declared: a queue
    remembered here that no registered receiver owns any more (a receiver renamed or moved,
    without ``queue=``) is an orphan, still bound to its routing keys and filling for ever.
    ``rmq_orphans`` (and ``rmq_consume`` at start, and ``--list``) name them; only
    ``rmq_orphans --delete`` deletes one. See docs/howto/orphan-queues.md.
    """

    name = models.CharField(_("queue"), max_length=255, unique=True)
    prefix = models.CharField(_("prefix"), max_length=255, db_index=True)
    receiver = models.CharField(_("receiver"), max_length=255)
    declared_at = models.DateTimeField(_("last declared"))

    class Meta:
        verbose_name = _("declared queue")
        verbose_name_plural = _("declared queues")

    def __str__(self) -> str:
        return self.name
