# Issue #14: a requeue claims rows in a narrow table of its own (ParkedClaim) instead of
# setting the parked row's status to "requeuing" (and a token and a time on it): each claim
# and release was an UPDATE of a wide row with a dozen indexes. Rows an older version left
# "requeuing" (a requeue running during the upgrade, or killed) become "parked" again, as a
# stale claim would have; such a row may then be requeued twice.
# On SQLite, dropping the two columns may rebuild the table, which drops the triggers that
# keep the failure-group counts: they are put back, and the counts recomputed, at the end.

from django.db import migrations, models

from django_rmq_retry.parking import group_counts

STATUSES = [("parked", "Parked"), ("requeued", "Requeued"), ("discarded", "Discarded")]


def requeuing_to_parked(apps, schema_editor):
    apps.get_model("django_rmq_retry", "ParkedMessage").objects.using(
        schema_editor.connection.alias
    ).filter(status="requeuing").update(status="parked")


def keep_counting(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "sqlite":
        return
    for sql in group_counts.install_sql(connection.vendor):
        schema_editor.execute(sql, params=None)
    with connection.cursor() as cursor:
        group_counts.fill(cursor)


class Migration(migrations.Migration):
    dependencies = [
        ("django_rmq_retry", "0007_parked_filter_indexes"),
    ]

    operations = [
        migrations.RunPython(requeuing_to_parked, migrations.RunPython.noop, elidable=False),
        migrations.RemoveField(model_name="parkedmessage", name="claim_token"),
        migrations.RemoveField(model_name="parkedmessage", name="claimed_at"),
        migrations.AlterField(
            model_name="parkedgroupcount",
            name="status",
            field=models.CharField(choices=STATUSES, max_length=12, verbose_name="status"),
        ),
        migrations.AlterField(
            model_name="parkedmessage",
            name="status",
            field=models.CharField(
                choices=STATUSES, default="parked", max_length=12, verbose_name="status"
            ),
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
        migrations.RunPython(keep_counting, migrations.RunPython.noop, elidable=False),
    ]
