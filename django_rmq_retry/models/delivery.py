"""Delivery bookkeeping: retry policy overrides, delivery starts (the delivery limit),
the outbox and the inbox, task results, and the receiver queues a project declared."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.utils.translation import gettext_lazy as _

from ..core.backoff import Policy, policy_errors


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
