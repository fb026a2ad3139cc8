"""Database state of per-key order (``core.ordering``), shared by every consumer process:
one row per held key, and the messages set aside behind it in arrival order (their
``id``). A hold is only ever deleted once no message is set aside behind it
(``on_delete=PROTECT``).
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..core.ordering import HoldState

HOLD_STATE_LABELS = {
    HoldState.RETRYING: _("Retrying (its retry copy is on its way)"),
    HoldState.PARKED: _("Parked (an operator decides)"),
    HoldState.RELEASING: _("Releasing (the messages behind it run in order)"),
}
HOLD_STATE_CHOICES = [(state.value, HOLD_STATE_LABELS[state]) for state in HoldState]


class KeyHold(models.Model):
    """A key of an ordered receiver that is held: only ``blocker`` may run for it.

    Written by the consumer that reads the key's partition (one at a time: the partition
    queue has a single active consumer) and by an operator's discard, each transition one
    statement on a locked row (``parking.holds``).
    """

    receiver = models.CharField(_("receiver"), max_length=255)
    key = models.CharField(_("ordering key"), max_length=200)
    #: The partition queue the key's messages arrive on (released copies go back there).
    queue = models.CharField(_("queue"), max_length=255)
    state = models.CharField(_("state"), max_length=10, choices=HOLD_STATE_CHOICES)
    #: The message that alone may run (its message id); while releasing, the one that ran.
    blocker = models.CharField(_("blocker"), max_length=255)
    #: The blocker's parked row while the state is parked (a discard of it releases the key).
    parked_id = models.BigIntegerField(_("parked row"), null=True, blank=True)
    #: While releasing: the highest set-aside row published again in this round.
    released_upto = models.BigIntegerField(_("released up to row"), null=True, blank=True)
    since = models.DateTimeField(_("held since"))
    changed_at = models.DateTimeField(_("changed at"))

    class Meta:
        verbose_name = _("held key")
        verbose_name_plural = _("held keys")
        ordering = ("-since",)
        constraints = [
            models.UniqueConstraint(fields=["receiver", "key"], name="rmqr_hold_key"),
        ]
        indexes = [
            models.Index(fields=["receiver", "blocker"], name="rmqr_hold_blocker"),
            models.Index(fields=["parked_id"], name="rmqr_hold_parked"),
            models.Index(fields=["state", "changed_at"], name="rmqr_hold_state"),
        ]

    def __str__(self) -> str:
        return f"{self.receiver} · key {self.key} ({self.get_state_display()})"


class HeldMessage(models.Model):
    """A message set aside behind a held key, kept bit for bit; ``id`` is its place."""

    hold = models.ForeignKey(
        KeyHold, on_delete=models.PROTECT, related_name="messages", verbose_name=_("hold")
    )
    message_id = models.CharField(_("message id"), max_length=255, blank=True)
    exchange = models.CharField(_("exchange"), max_length=255, blank=True)
    routing_key = models.CharField(_("routing key"), max_length=255, blank=True)
    body = models.BinaryField(_("body"))
    properties = models.JSONField(_("AMQP properties"), default=dict, blank=True)
    headers = models.JSONField(_("headers"), default=dict, blank=True)
    held_at = models.DateTimeField(_("held at"))

    class Meta:
        verbose_name = _("held message")
        verbose_name_plural = _("held messages")
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.message_id or self.pk} (held)"
