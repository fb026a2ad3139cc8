"""The demo's topics: routing keys on the work exchange."""

from django_rmq_retry import Topic

order_paid = Topic("shop.order.paid", description="An order was paid.")
order_shipped = Topic("shop.order.shipped", description="An order left the warehouse.")
