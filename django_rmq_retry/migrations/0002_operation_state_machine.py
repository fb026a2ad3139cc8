# Requeue operations as a state machine: incremental counters of copies with no outcome,
# the failures and canary a resume goes on from, and two item states (a step's fenced
# chunk, and copies whose outcome never came). Additive: no existing column changes.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rmq_retry", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="requeueoperation",
            name="canary_from",
            field=models.PositiveIntegerField(default=0, verbose_name="canary from"),
        ),
        migrations.AddField(
            model_name="requeueoperation",
            name="failed_baseline",
            field=models.PositiveIntegerField(
                default=0, verbose_name="failed before the last resume"
            ),
        ),
        migrations.AddField(
            model_name="requeueoperation",
            name="last_outcome_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="last outcome at"),
        ),
        migrations.AddField(
            model_name="requeueoperation",
            name="unknown",
            field=models.PositiveIntegerField(default=0, verbose_name="outcome unknown"),
        ),
        migrations.AlterField(
            model_name="requeueitem",
            name="state",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("sending", "Sending"),
                    ("sent", "Sent"),
                    ("handled", "Handled"),
                    ("failed", "Failed again"),
                    ("refused", "Refused by the broker"),
                    ("skipped", "Skipped (no longer parked)"),
                    ("unknown", "Outcome unknown"),
                ],
                default="pending",
                max_length=8,
                verbose_name="state",
            ),
        ),
    ]
