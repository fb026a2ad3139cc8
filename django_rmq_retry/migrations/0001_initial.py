# The whole schema of django-rmq-retry 1.0, in one migration (nothing was released before it).
#
# Frozen: every statement it runs is written here, never imported from the package, so a
# later change of the package cannot change what this migration does on a new database.
# Beside the tables, on PostgreSQL and SQLite, it installs the triggers that keep
# ParkedGroupCount (per failure-group counts of parked rows; parking/group_counts.py holds
# the same SQL for `manage.py rmq_recount_parked`, and tests/test_group_counts.py checks the
# two agree). On PostgreSQL only, also:
# - a full-text index on the error message (GIN over to_tsvector('simple', error_message),
#   the expression the admin's search asks for), not declared in the model;
# - extended statistics on the failure-group columns, which depend on each other (a failure
#   group names its error type): without them the planner multiplies their selectivities
#   and reads a group again for every requeue batch. Gathered by the next (auto)ANALYZE.
# Warning for SQLite: a later migration that rebuilds the parked table drops its triggers
# (it must put them back, or `manage.py rmq_recount_parked` does).

import django.db.models.deletion
from django.db import migrations, models

PARKED = "django_rmq_retry_parkedmessage"

# PostgreSQL: one trigger per event, once per statement, each an upsert of the statement's
# changes by group (in key order, so two writers never deadlock over the count rows).
PG_UPSERT = """
    INSERT INTO django_rmq_retry_parkedgroupcount AS g
        (receiver, fingerprint, error_type, status, count, last_parked_at)
    SELECT receiver, fingerprint, error_type, status, sum(n), max(at) FROM ({rows}) AS d
    GROUP BY receiver, fingerprint, error_type, status HAVING sum(n) <> 0
    ORDER BY receiver, fingerprint, error_type, status
    ON CONFLICT (receiver, fingerprint, error_type, status) DO UPDATE
        SET count = g.count + EXCLUDED.count,
            last_parked_at = GREATEST(g.last_parked_at, EXCLUDED.last_parked_at);
"""
PG_TRIGGERS = {  # event: (the statement's changed rows, the transition tables)
    "insert": (
        "SELECT receiver, fingerprint, error_type, status, 1 AS n, parked_at AS at FROM new_rows",
        "REFERENCING NEW TABLE AS new_rows",
    ),
    "update": (
        "SELECT receiver, fingerprint, error_type, status, 1 AS n, parked_at AS at "
        "FROM new_rows UNION ALL "
        "SELECT receiver, fingerprint, error_type, status, -1, NULL FROM old_rows",
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
    ),
    "delete": (
        "SELECT receiver, fingerprint, error_type, status, -1 AS n, NULL::timestamptz AS at "
        "FROM old_rows",
        "REFERENCING OLD TABLE AS old_rows",
    ),
}

# SQLite: row triggers. A delete only lowers an existing count (never creates one).
SQLITE_ADD = """
    INSERT INTO django_rmq_retry_parkedgroupcount
        (receiver, fingerprint, error_type, status, count, last_parked_at)
    VALUES (NEW.receiver, NEW.fingerprint, NEW.error_type, NEW.status, 1, NEW.parked_at)
    ON CONFLICT (receiver, fingerprint, error_type, status) DO UPDATE SET count = count + 1,
        last_parked_at = max(coalesce(last_parked_at, excluded.last_parked_at),
                             excluded.last_parked_at);
"""
SQLITE_SUB = """
    UPDATE django_rmq_retry_parkedgroupcount SET count = count - 1
    WHERE receiver = OLD.receiver AND fingerprint = OLD.fingerprint
        AND error_type = OLD.error_type AND status = OLD.status;
"""
SQLITE_TRIGGERS = [
    f"CREATE TRIGGER rmqr_groups_insert AFTER INSERT ON {PARKED} BEGIN {SQLITE_ADD} END",
    f"CREATE TRIGGER rmqr_groups_update AFTER UPDATE OF receiver, fingerprint, error_type, "
    f"status ON {PARKED} WHEN OLD.status IS NOT NEW.status OR OLD.receiver IS NOT NEW.receiver "
    "OR OLD.fingerprint IS NOT NEW.fingerprint OR OLD.error_type IS NOT NEW.error_type "
    f"BEGIN {SQLITE_SUB} {SQLITE_ADD} END",
    f"CREATE TRIGGER rmqr_groups_delete AFTER DELETE ON {PARKED} BEGIN {SQLITE_SUB} END",
]


def install(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        for event, (rows, referencing) in PG_TRIGGERS.items():
            name = f"rmqr_groups_{event}"
            schema_editor.execute(
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN {PG_UPSERT.format(rows=rows)} RETURN NULL; END $$",
                params=None,
            )
            schema_editor.execute(
                f"CREATE TRIGGER {name} AFTER {event.upper()} ON {PARKED} {referencing} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {name}()",
                params=None,
            )
        schema_editor.execute(
            f"CREATE INDEX rmqr_parked_error_words ON {PARKED} "
            "USING gin (to_tsvector('simple'::regconfig, error_message))"
        )
        schema_editor.execute(
            "CREATE STATISTICS rmqr_parked_group_stats (ndistinct, dependencies) "
            f"ON receiver, fingerprint, error_type, status FROM {PARKED}"
        )
    elif vendor == "sqlite":
        for sql in SQLITE_TRIGGERS:
            schema_editor.execute(sql, params=None)


def uninstall(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute("DROP STATISTICS IF EXISTS rmqr_parked_group_stats")
        schema_editor.execute("DROP INDEX IF EXISTS rmqr_parked_error_words")
        for event in PG_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS rmqr_groups_{event} ON {PARKED}")
            schema_editor.execute(f"DROP FUNCTION IF EXISTS rmqr_groups_{event}()")
    elif vendor == "sqlite":
        for event in PG_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS rmqr_groups_{event}")


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="DeliveryStart",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=64, unique=True)),
                ("queue", models.CharField(max_length=255)),
                ("message_id", models.CharField(blank=True, max_length=255)),
                ("starts", models.PositiveIntegerField(default=0)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "verbose_name": "delivery start",
                "verbose_name_plural": "delivery starts",
            },
        ),
        migrations.CreateModel(
            name="RetryPolicy",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "receiver",
                    models.CharField(
                        help_text="Dotted path of the receiver function, as `rmq_consume --list` shows it.",
                        max_length=255,
                        unique=True,
                        verbose_name="receiver",
                    ),
                ),
                ("enabled", models.BooleanField(default=True, verbose_name="enabled")),
                (
                    "max_attempts",
                    models.PositiveIntegerField(default=5, verbose_name="max attempts"),
                ),
                ("initial_delay", models.FloatField(default=1.0, verbose_name="initial delay (s)")),
                ("multiplier", models.FloatField(default=2.0, verbose_name="multiplier")),
                ("max_delay", models.FloatField(default=3600.0, verbose_name="max delay (s)")),
                (
                    "jitter",
                    models.CharField(
                        choices=[
                            ("none", "None: base delay"),
                            ("full", "Full: uniform(0, base)"),
                            ("equal", "Equal: base/2 + uniform(0, base/2)"),
                        ],
                        default="full",
                        max_length=8,
                        verbose_name="jitter",
                    ),
                ),
                (
                    "dont_retry",
                    models.TextField(
                        blank=True,
                        help_text="Dotted exception class paths, one per line, that park at once.",
                        verbose_name="never retry",
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True, verbose_name="updated")),
            ],
            options={
                "verbose_name": "retry policy",
                "verbose_name_plural": "retry policies",
                "ordering": ("receiver",),
            },
        ),
        migrations.CreateModel(
            name="InboxEntry",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("receiver", models.CharField(max_length=255, verbose_name="receiver")),
                ("key", models.CharField(max_length=255, verbose_name="message key")),
                ("handled_at", models.DateTimeField(db_index=True, verbose_name="handled at")),
            ],
            options={
                "verbose_name": "handled message",
                "verbose_name_plural": "handled messages (idempotent receivers)",
                "constraints": [
                    models.UniqueConstraint(fields=("receiver", "key"), name="rmqr_inbox_once")
                ],
            },
        ),
        migrations.CreateModel(
            name="OutboxMessage",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("group", models.CharField(max_length=32, verbose_name="transaction")),
                ("exchange", models.CharField(blank=True, max_length=255, verbose_name="exchange")),
                ("routing_key", models.CharField(max_length=255, verbose_name="routing key")),
                (
                    "message_id",
                    models.CharField(blank=True, max_length=255, verbose_name="message id"),
                ),
                ("body", models.BinaryField(verbose_name="body")),
                (
                    "properties",
                    models.JSONField(blank=True, default=dict, verbose_name="AMQP properties"),
                ),
                (
                    "wire_properties",
                    models.BinaryField(null=True, verbose_name="encoded properties"),
                ),
                ("created_at", models.DateTimeField(verbose_name="created")),
                (
                    "status",
                    models.CharField(
                        choices=[("pending", "Pending"), ("held", "Held (needs an operator)")],
                        default="pending",
                        max_length=8,
                        verbose_name="status",
                    ),
                ),
                (
                    "attempts",
                    models.PositiveIntegerField(default=0, verbose_name="publish attempts"),
                ),
                ("available_at", models.DateTimeField(verbose_name="next attempt")),
                ("last_error", models.TextField(blank=True, verbose_name="last error")),
            ],
            options={
                "verbose_name": "outbox message",
                "verbose_name_plural": "outbox messages",
                "ordering": ("id",),
                "indexes": [
                    models.Index(fields=["status", "id"], name="rmqr_outbox_status"),
                    models.Index(fields=["group", "id"], name="rmqr_outbox_group"),
                ],
            },
        ),
        migrations.CreateModel(
            name="ParkedClaim",
            fields=[
                (
                    "parked_id",
                    models.BigIntegerField(
                        primary_key=True, serialize=False, verbose_name="parked message"
                    ),
                ),
                ("token", models.CharField(max_length=32, verbose_name="requeue run")),
                ("claimed_at", models.DateTimeField(verbose_name="claimed at")),
            ],
            options={
                "verbose_name": "requeue claim",
                "verbose_name_plural": "requeue claims",
                "indexes": [models.Index(fields=["token"], name="rmqr_claim_token")],
            },
        ),
        migrations.CreateModel(
            name="ParkedGroupCount",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("receiver", models.CharField(max_length=255, verbose_name="receiver")),
                (
                    "fingerprint",
                    models.CharField(blank=True, max_length=255, verbose_name="failure group"),
                ),
                (
                    "error_type",
                    models.CharField(blank=True, max_length=255, verbose_name="error type"),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("parked", "Parked"),
                            ("requeued", "Requeued"),
                            ("discarded", "Discarded"),
                        ],
                        max_length=12,
                        verbose_name="status",
                    ),
                ),
                ("count", models.BigIntegerField(default=0, verbose_name="rows")),
                (
                    "last_parked_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="last parked"),
                ),
            ],
            options={
                "verbose_name": "parked group count",
                "verbose_name_plural": "parked group counts",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("receiver", "fingerprint", "error_type", "status"),
                        name="rmqr_group_key",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="ParkedMessage",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("park_key", models.CharField(max_length=64, verbose_name="park key")),
                ("receiver", models.CharField(max_length=255, verbose_name="receiver")),
                ("queue", models.CharField(max_length=255, verbose_name="queue")),
                ("exchange", models.CharField(blank=True, max_length=255, verbose_name="exchange")),
                (
                    "routing_key",
                    models.CharField(blank=True, max_length=255, verbose_name="routing key"),
                ),
                (
                    "message_id",
                    models.CharField(blank=True, max_length=255, verbose_name="message id"),
                ),
                (
                    "correlation_id",
                    models.CharField(blank=True, max_length=255, verbose_name="correlation id"),
                ),
                ("body", models.BinaryField(verbose_name="body")),
                (
                    "body_size",
                    models.PositiveBigIntegerField(default=0, verbose_name="body size (bytes)"),
                ),
                (
                    "content_type",
                    models.CharField(blank=True, max_length=255, verbose_name="content type"),
                ),
                (
                    "properties",
                    models.JSONField(blank=True, default=dict, verbose_name="AMQP properties"),
                ),
                ("headers", models.JSONField(blank=True, default=dict, verbose_name="headers")),
                (
                    "reason",
                    models.CharField(
                        choices=[
                            ("exhausted", "Retries exhausted"),
                            ("rejected", "Rejected by receiver"),
                            ("non_retryable", "Non-retryable error"),
                            ("undecodable", "Undecodable body"),
                            ("delivery_limit", "Delivery limit (consumer kept dying)"),
                            ("orphaned", "Receiver queue missing"),
                        ],
                        max_length=20,
                        verbose_name="reason",
                    ),
                ),
                ("reason_detail", models.TextField(blank=True, verbose_name="reason detail")),
                (
                    "error_type",
                    models.CharField(blank=True, max_length=255, verbose_name="error type"),
                ),
                ("error_message", models.TextField(blank=True, verbose_name="error message")),
                ("traceback", models.TextField(blank=True, verbose_name="traceback")),
                (
                    "fingerprint",
                    models.CharField(
                        blank=True,
                        help_text="Exception class and the first frame in project code; groups alike failures.",
                        max_length=255,
                        verbose_name="failure group",
                    ),
                ),
                ("attempts", models.PositiveIntegerField(default=0, verbose_name="attempts")),
                (
                    "first_failure_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="first failure"),
                ),
                (
                    "last_failure_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="last failure"),
                ),
                ("parked_at", models.DateTimeField(verbose_name="parked at")),
                (
                    "park_count",
                    models.PositiveIntegerField(
                        default=1,
                        help_text="Parkings of this message (after requeues).",
                        verbose_name="times parked",
                    ),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("parked", "Parked"),
                            ("requeued", "Requeued"),
                            ("discarded", "Discarded"),
                        ],
                        default="parked",
                        max_length=12,
                        verbose_name="status",
                    ),
                ),
                (
                    "status_changed_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="status changed"),
                ),
                (
                    "status_changed_by",
                    models.CharField(blank=True, max_length=150, verbose_name="changed by"),
                ),
                (
                    "requeue_count",
                    models.PositiveIntegerField(default=0, verbose_name="times requeued"),
                ),
                ("history", models.JSONField(blank=True, default=list, verbose_name="history")),
            ],
            options={
                "verbose_name": "parked message",
                "verbose_name_plural": "parked messages",
                "ordering": ("-parked_at", "-id"),
                "permissions": [
                    ("requeue_parkedmessage", "Can requeue parked messages"),
                    ("discard_parkedmessage", "Can discard parked messages"),
                ],
                "indexes": [
                    models.Index(fields=["status", "parked_at"], name="rmqr_parked_status_at"),
                    models.Index(fields=["receiver", "parked_at"], name="rmqr_parked_receiver_at"),
                    models.Index(fields=["queue", "parked_at"], name="rmqr_parked_queue_at"),
                    models.Index(fields=["error_type", "parked_at"], name="rmqr_parked_error_at"),
                    models.Index(fields=["fingerprint", "parked_at"], name="rmqr_parked_group_at"),
                    models.Index(fields=["reason", "status"], name="rmqr_parked_reason"),
                    models.Index(fields=["parked_at"], name="rmqr_parked_at"),
                    models.Index(fields=["message_id"], name="rmqr_parked_msgid"),
                    models.Index(fields=["correlation_id"], name="rmqr_parked_corr"),
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("park_key",), name="rmqr_parked_park_key")
                ],
            },
        ),
        migrations.RunPython(install, uninstall, elidable=False),
        # The models this release added beside the parked table (task results, requeue
        # operations, declared queues, alerts, snapshots) and the parked table's new options.
        migrations.CreateModel(
            name="DeclaredQueue",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=255, unique=True, verbose_name="queue")),
                ("prefix", models.CharField(db_index=True, max_length=255, verbose_name="prefix")),
                ("receiver", models.CharField(max_length=255, verbose_name="receiver")),
                ("declared_at", models.DateTimeField(verbose_name="last declared")),
            ],
            options={
                "verbose_name": "declared queue",
                "verbose_name_plural": "declared queues",
            },
        ),
        migrations.CreateModel(
            name="FailureGroupAlert",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("receiver", models.CharField(max_length=255, verbose_name="receiver")),
                (
                    "fingerprint",
                    models.CharField(blank=True, max_length=255, verbose_name="failure group"),
                ),
                (
                    "error_type",
                    models.CharField(blank=True, max_length=255, verbose_name="error type"),
                ),
                ("alerted_at", models.DateTimeField(verbose_name="alerted at")),
                ("count", models.BigIntegerField(default=0, verbose_name="rows then")),
            ],
            options={
                "verbose_name": "failure group alert",
                "verbose_name_plural": "failure group alerts",
            },
        ),
        migrations.CreateModel(
            name="ParkedGroupSnapshot",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("hour", models.DateTimeField(verbose_name="hour")),
                ("receiver", models.CharField(max_length=255, verbose_name="receiver")),
                (
                    "fingerprint",
                    models.CharField(blank=True, max_length=255, verbose_name="failure group"),
                ),
                (
                    "error_type",
                    models.CharField(blank=True, max_length=255, verbose_name="error type"),
                ),
                ("parked", models.BigIntegerField(default=0, verbose_name="parked")),
                ("requeued", models.BigIntegerField(default=0, verbose_name="requeued")),
            ],
            options={
                "verbose_name": "failure group snapshot",
                "verbose_name_plural": "failure group snapshots",
            },
        ),
        migrations.CreateModel(
            name="RequeueItem",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("parked_id", models.BigIntegerField(verbose_name="parked message")),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("sent", "Sent"),
                            ("handled", "Handled"),
                            ("failed", "Failed again"),
                            ("refused", "Refused by the broker"),
                            ("skipped", "Skipped (no longer parked)"),
                        ],
                        default="pending",
                        max_length=8,
                        verbose_name="state",
                    ),
                ),
            ],
            options={
                "verbose_name": "requeue operation item",
                "verbose_name_plural": "requeue operation items",
            },
        ),
        migrations.CreateModel(
            name="RequeueOperation",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("created_by", models.CharField(max_length=150, verbose_name="created by")),
                ("created_at", models.DateTimeField(verbose_name="created at")),
                ("description", models.TextField(blank=True, verbose_name="selection")),
                ("mode", models.CharField(default="receiver", max_length=12, verbose_name="mode")),
                (
                    "canary",
                    models.PositiveIntegerField(
                        default=0,
                        help_text="Send this many first, wait for their outcome.",
                        verbose_name="canary",
                    ),
                ),
                ("ramp", models.BooleanField(default=False, verbose_name="ramp")),
                ("rate", models.FloatField(blank=True, null=True, verbose_name="rate (msg/s)")),
                (
                    "stop_on_failure",
                    models.BooleanField(default=True, verbose_name="stop at the first new failure"),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("running", "Running"),
                            ("paused", "Paused"),
                            ("cancelled", "Cancelled"),
                            ("stopped", "Stopped at a new failure"),
                            ("done", "Done"),
                        ],
                        default="running",
                        max_length=12,
                        verbose_name="state",
                    ),
                ),
                ("state_reason", models.TextField(blank=True, verbose_name="state reason")),
                (
                    "state_changed_by",
                    models.CharField(blank=True, max_length=150, verbose_name="state changed by"),
                ),
                ("updated_at", models.DateTimeField(verbose_name="updated at")),
                ("step", models.PositiveIntegerField(default=0, verbose_name="step")),
                ("next_at", models.DateTimeField(verbose_name="next step at")),
                (
                    "lease_owner",
                    models.CharField(blank=True, max_length=64, verbose_name="lease owner"),
                ),
                (
                    "lease_until",
                    models.DateTimeField(blank=True, null=True, verbose_name="lease until"),
                ),
                (
                    "started_sending_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="first sent at"),
                ),
                (
                    "last_sent_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="last sent at"),
                ),
                ("total", models.PositiveIntegerField(default=0, verbose_name="total")),
                ("sent", models.PositiveIntegerField(default=0, verbose_name="sent")),
                ("handled", models.PositiveIntegerField(default=0, verbose_name="handled")),
                (
                    "failed_again",
                    models.PositiveIntegerField(default=0, verbose_name="failed again"),
                ),
                (
                    "refused",
                    models.PositiveIntegerField(default=0, verbose_name="refused by the broker"),
                ),
                ("skipped", models.PositiveIntegerField(default=0, verbose_name="skipped")),
            ],
            options={
                "verbose_name": "requeue operation",
                "verbose_name_plural": "requeue operations",
                "ordering": ("-created_at", "-id"),
            },
        ),
        migrations.CreateModel(
            name="TaskResultRecord",
            fields=[
                (
                    "id",
                    models.CharField(
                        max_length=64, primary_key=True, serialize=False, verbose_name="result id"
                    ),
                ),
                ("backend", models.CharField(max_length=100, verbose_name="backend alias")),
                ("task_path", models.CharField(max_length=255, verbose_name="task")),
                ("queue_name", models.CharField(max_length=100, verbose_name="queue name")),
                ("priority", models.SmallIntegerField(default=0, verbose_name="priority")),
                ("status", models.CharField(db_index=True, max_length=20, verbose_name="status")),
                ("args", models.JSONField(default=list, verbose_name="arguments")),
                ("kwargs", models.JSONField(default=dict, verbose_name="keyword arguments")),
                (
                    "run_after",
                    models.DateTimeField(blank=True, null=True, verbose_name="run after"),
                ),
                (
                    "enqueued_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="enqueued"),
                ),
                ("started_at", models.DateTimeField(blank=True, null=True, verbose_name="started")),
                (
                    "last_attempted_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="last attempted"),
                ),
                (
                    "finished_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="finished"),
                ),
                (
                    "return_value",
                    models.JSONField(blank=True, null=True, verbose_name="return value"),
                ),
                ("errors", models.JSONField(default=list, verbose_name="errors")),
                ("worker_ids", models.JSONField(default=list, verbose_name="worker ids")),
                ("updated_at", models.DateTimeField(verbose_name="updated")),
            ],
            options={
                "verbose_name": "task result",
                "verbose_name_plural": "task results",
            },
        ),
        migrations.AlterModelOptions(
            name="parkedmessage",
            options={
                "ordering": ("-parked_at", "-id"),
                "permissions": [
                    ("requeue_parkedmessage", "Can requeue parked messages"),
                    ("discard_parkedmessage", "Can discard parked messages"),
                    ("edit_parkedmessage", "Can edit a parked message and requeue the edited copy"),
                ],
                "verbose_name": "parked message",
                "verbose_name_plural": "parked messages",
            },
        ),
        migrations.AddIndex(
            model_name="parkedmessage",
            index=models.Index(fields=["last_failure_at"], name="rmqr_parked_last_failure"),
        ),
        migrations.AddIndex(
            model_name="parkedmessage",
            index=models.Index(fields=["attempts"], name="rmqr_parked_attempts"),
        ),
        migrations.AddConstraint(
            model_name="failuregroupalert",
            constraint=models.UniqueConstraint(
                fields=("receiver", "fingerprint", "error_type"), name="rmqr_alert_group"
            ),
        ),
        migrations.AddConstraint(
            model_name="parkedgroupsnapshot",
            constraint=models.UniqueConstraint(
                fields=("hour", "receiver", "fingerprint", "error_type"), name="rmqr_snapshot_key"
            ),
        ),
        migrations.AddIndex(
            model_name="requeueoperation",
            index=models.Index(fields=["state", "next_at"], name="rmqr_op_state_next"),
        ),
        migrations.AddField(
            model_name="requeueitem",
            name="operation",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="items",
                to="django_rmq_retry.requeueoperation",
            ),
        ),
        migrations.AddIndex(
            model_name="taskresultrecord",
            index=models.Index(fields=["updated_at"], name="rmqr_taskresult_updated"),
        ),
        migrations.AddIndex(
            model_name="requeueitem",
            index=models.Index(
                fields=["operation", "state", "parked_id"], name="rmqr_op_item_state"
            ),
        ),
        migrations.AddConstraint(
            model_name="requeueitem",
            constraint=models.UniqueConstraint(
                fields=("operation", "parked_id"), name="rmqr_op_item"
            ),
        ),
    ]
