"""Background requeue operations (``parking.operations``) and their items, one per row
they send."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


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
