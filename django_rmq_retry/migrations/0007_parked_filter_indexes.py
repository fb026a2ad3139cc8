# Issue #16: the indexes behind the admin's filters lead with the filtered column and go on
# with parked_at, the list's order, instead of status. The list asks for the newest 50 rows
# of a receiver (a queue, an error type, a failure group): with (receiver, status) PostgreSQL
# walked the parked_at index backwards past every newer row of other receivers (111,000 rows,
# 250 ms at a million rows, when a recent incident filled the newest rows); with
# (receiver, parked_at) it reads 50 index entries. Same number of indexes, same write cost.
# On PostgreSQL the new ones are built CONCURRENTLY before the old ones are dropped
# (CONCURRENTLY too): parking and requeues go on meanwhile.

from django.db import migrations, models

TABLE = "django_rmq_retry_parkedmessage"
CHANGES = [  # (old name, old fields, new name, new fields)
    (
        "rmqr_parked_receiver",
        ["receiver", "status"],
        "rmqr_parked_receiver_at",
        ["receiver", "parked_at"],
    ),
    ("rmqr_parked_queue", ["queue", "status"], "rmqr_parked_queue_at", ["queue", "parked_at"]),
    (
        "rmqr_parked_error",
        ["error_type", "status"],
        "rmqr_parked_error_at",
        ["error_type", "parked_at"],
    ),
    (
        "rmqr_parked_group",
        ["fingerprint", "status"],
        "rmqr_parked_group_at",
        ["fingerprint", "parked_at"],
    ),
]


def _swap(apps, schema_editor, forward):
    model = apps.get_model("django_rmq_retry", "ParkedMessage")
    postgres = schema_editor.connection.vendor == "postgresql"
    for old_name, old_fields, new_name, new_fields in CHANGES:
        if not forward:
            old_name, old_fields, new_name, new_fields = new_name, new_fields, old_name, old_fields
        if postgres:
            schema_editor.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {new_name} ON {TABLE} "
                f"({', '.join(new_fields)})"
            )
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {old_name}")
        else:
            schema_editor.add_index(model, models.Index(fields=new_fields, name=new_name))
            schema_editor.remove_index(model, models.Index(fields=old_fields, name=old_name))


def forwards(apps, schema_editor):
    _swap(apps, schema_editor, True)


def backwards(apps, schema_editor):
    _swap(apps, schema_editor, False)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_rmq_retry", "0006_parked_group_counts"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                *(
                    migrations.RemoveIndex(model_name="parkedmessage", name=old)
                    for old, _of, _n, _nf in CHANGES
                ),
                *(
                    migrations.AddIndex(
                        model_name="parkedmessage", index=models.Index(fields=nf, name=new)
                    )
                    for _o, _of, new, nf in CHANGES
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
        ),
    ]
