# Issue #16: park_key stays unique through a named constraint. unique=True also made Django
# create, on PostgreSQL, a second index (varchar_pattern_ops, for LIKE) that no query uses
# and every park INSERT paid for. The constraint comes first: never a moment without one.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rmq_retry", "0003_outbox_inbox"),
    ]

    operations = [
        migrations.AddConstraint(
            model_name="parkedmessage",
            constraint=models.UniqueConstraint(fields=("park_key",), name="rmqr_parked_park_key"),
        ),
        migrations.AlterField(
            model_name="parkedmessage",
            name="park_key",
            field=models.CharField(max_length=64, verbose_name="park key"),
        ),
    ]
