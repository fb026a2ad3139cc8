# Typed receivers: an invalid body's failing fields on its parked row, and the reason
# "invalid" among the choices.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rmq_retry", "0005_ordering_holds"),
    ]

    operations = [
        migrations.AddField(
            model_name="parkedmessage",
            name="field_errors",
            field=models.JSONField(
                blank=True,
                help_text='An invalid body\'s failing fields: [{"loc": [...], "msg": ...}].',
                null=True,
                verbose_name="field errors",
            ),
        ),
        migrations.AlterField(
            model_name="parkedmessage",
            name="reason",
            field=models.CharField(
                choices=[
                    ("exhausted", "Retries exhausted"),
                    ("rejected", "Rejected by receiver"),
                    ("non_retryable", "Non-retryable error"),
                    ("undecodable", "Undecodable body"),
                    ("delivery_limit", "Delivery limit (consumer kept dying)"),
                    ("orphaned", "Receiver queue missing"),
                    ("invalid", "Invalid (does not fit its schema)"),
                ],
                max_length=20,
                verbose_name="reason",
            ),
        ),
    ]
