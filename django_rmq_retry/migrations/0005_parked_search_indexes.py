# Issue #16: the admin's search uses an index for each of its parts. The correlation id gets
# a b-tree (message ids had one); on PostgreSQL the error message gets a full-text index
# (GIN over to_tsvector('simple', error_message), the expression parking.WordsMatch asks
# for). On PostgreSQL both are built CONCURRENTLY, so parking goes on while they are built
# over a big table (minutes at ten million rows); hence a migration outside a transaction.

from django.db import migrations, models

TABLE = "django_rmq_retry_parkedmessage"
CORRELATION = models.Index(fields=["correlation_id"], name="rmqr_parked_corr")
WORDS_SQL = (
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS rmqr_parked_error_words ON {TABLE} "
    "USING gin (to_tsvector('simple'::regconfig, error_message))"
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS rmqr_parked_corr ON {TABLE} (correlation_id)"
        )
        schema_editor.execute(WORDS_SQL)
    else:
        schema_editor.add_index(apps.get_model("django_rmq_retry", "ParkedMessage"), CORRELATION)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS rmqr_parked_error_words")
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS rmqr_parked_corr")
    else:
        schema_editor.remove_index(apps.get_model("django_rmq_retry", "ParkedMessage"), CORRELATION)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_rmq_retry", "0004_parked_park_key_constraint"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="parkedmessage", index=CORRELATION)],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        ),
    ]
