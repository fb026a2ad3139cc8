"""A row per receiver effect, for counting effects (not deliveries) in the exactly-once tests.

Deliberately no unique constraint: a duplicate effect must be countable, not refused.
"""

from django.db import models


class Effect(models.Model):
    receiver = models.CharField(max_length=100)
    key = models.CharField(max_length=100)
    attempt = models.PositiveIntegerField(default=1)
    pid = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.receiver} {self.key} (attempt {self.attempt})"
