"""The demo's topics: routing keys on the work exchange."""

from django_rmq_retry import Topic

# Sent through the transactional outbox: committed with the order's own rows, published
# after the commit (README "Exactly-once effects").
order_paid = Topic("shop.order.paid", description="An order was paid.", outbox=True)
order_shipped = Topic("shop.order.shipped", description="An order left the warehouse.")
