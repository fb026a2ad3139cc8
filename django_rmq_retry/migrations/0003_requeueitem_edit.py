"""Operators' edits ride on a one-row operation: the edited copy is sent by its step."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rmq_retry", "0002_operation_state_machine"),
    ]

    operations = [
        migrations.AddField(
            model_name="requeueitem",
            name="edit_body",
            field=models.BinaryField(blank=True, null=True, verbose_name="edited body"),
        ),
        migrations.AddField(
            model_name="requeueitem",
            name="edit_diff",
            field=models.TextField(blank=True, db_default="", default="", verbose_name="edit diff"),
        ),
        migrations.AddField(
            model_name="requeueitem",
            name="edit_headers",
            field=models.JSONField(blank=True, null=True, verbose_name="edited headers"),
        ),
        migrations.AddConstraint(
            model_name="requeueitem",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("edit_body__isnull", False), ("state__in", ["pending", "sending"])
                ),
                fields=("parked_id",),
                name="rmqr_one_edit",
            ),
        ),
    ]
