"""The receivers the documentation's examples test (shown on the retry-policy page)."""

from django_rmq_retry import Reject, Topic, receiver

order_paid = Topic("docs.order.paid")


class Warehouse:
    """Stands in for a service the receiver calls; the tests make it fail."""

    def reserve(self, sku: str) -> None:
        pass


warehouse = Warehouse()


@receiver(order_paid, retry={"max_attempts": 4, "initial_delay": 60, "jitter": "none"})
def reserve_stock(message, **kwargs):
    if "sku" not in message.body:
        raise Reject("no sku")
    warehouse.reserve(message.body["sku"])  # raises while the warehouse is down
