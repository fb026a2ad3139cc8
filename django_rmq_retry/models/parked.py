"""Parked messages and what the operator's views keep about them: the parked rows, the
claims a requeue run holds while it publishes, the failure groups' counts, alerts and
hourly snapshots."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..core.outcome import ParkReason

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
