from django.db import models


class Invoice(models.Model):
    """Written by the demo's receiver so the demo shows real work being done."""

    order_id = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Invoice for order {self.order_id}"
