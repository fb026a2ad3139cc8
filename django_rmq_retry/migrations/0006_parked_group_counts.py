# Issue #16: per-group counts of the parked table, kept by triggers (PostgreSQL: once per
# statement; SQLite: once per row), filled from the rows already there. On PostgreSQL the
# trigger creation locks the parked table against writes until this migration commits, so
# no row is missed between the fill and the triggers (the fill is one GROUP BY: seconds at
# millions of rows). Warning for SQLite: a later migration that rebuilds the parked table
# drops its triggers; `manage.py rmq_recount_parked` puts them back.
# Also on PostgreSQL: extended statistics on the failure-group columns. A group's link
# filters on receiver, failure group and error type, which depend on each other (a failure
# group names its error type); without these the planner multiplies their selectivities,
# expects a handful of rows where there are 100,000 and picks plans that read the group
# again for every requeue batch. They are gathered by the next (auto)ANALYZE.

from django.db import migrations, models

from django_rmq_retry.parking import group_counts


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for sql in group_counts.install_sql(vendor):
        schema_editor.execute(sql, params=None)
    if vendor in group_counts.VENDORS:
        with schema_editor.connection.cursor() as cursor:
            group_counts.fill(cursor)


STATISTICS = "rmqr_parked_group_stats"


def statistics(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE STATISTICS IF NOT EXISTS {STATISTICS} (ndistinct, dependencies) "
            "ON receiver, fingerprint, error_type, status FROM django_rmq_retry_parkedmessage"
        )


def no_statistics(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")


def backwards(apps, schema_editor):
    for sql in group_counts.uninstall_sql(schema_editor.connection.vendor):
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("django_rmq_retry", "0005_parked_search_indexes"),
    ]

    operations = [
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
                            ("requeuing", "Requeue in progress"),
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
        migrations.RunPython(forwards, backwards, elidable=False),
        migrations.RunPython(statistics, no_statistics, elidable=False),
    ]
