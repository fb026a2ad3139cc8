"""A retry schedule tested without RabbitMQ: the in-memory broker's clock is virtual."""

import pytest

from django_rmq_retry.models import ParkedMessage


@pytest.mark.django_db
def test_a_flaky_warehouse_is_retried_then_handled(shop, rmq_broker, monkeypatch):
    answers = iter([TimeoutError("down"), TimeoutError("down"), None])

    def reserve(sku):
        if (error := next(answers)) is not None:
            raise error

    monkeypatch.setattr(shop.warehouse, "reserve", reserve)
    shop.order_paid.send({"order_id": 42, "sku": "A1"})
    rmq_broker.run_until_idle()
    runs = rmq_broker.runs_of(shop.reserve_stock)
    assert [(r.attempt, r.outcome) for r in runs] == [
        (1, "retried"),
        (2, "retried"),
        (3, "handled"),
    ]
    assert rmq_broker.elapsed == pytest.approx(180)  # 60 s + 120 s of backoff, virtual


@pytest.mark.django_db
def test_an_order_without_sku_is_parked_at_once(shop, rmq_broker):
    shop.order_paid.send({"order_id": 43})
    rmq_broker.run_until_idle()
    row = ParkedMessage.objects.get()
    assert (row.reason, row.attempts) == ("rejected", 1)
    assert rmq_broker.runs_of(shop.reserve_stock)[-1].outcome == "parked"
