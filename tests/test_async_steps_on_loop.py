"""Which steps around an ``async def`` attempt its event loop may run itself
(``Handler.prepares_on_loop`` / ``concludes_on_loop``, ``Pipeline.uses_database``).

A step that may touch the database runs on the async pool's database threads; one that
cannot runs on the loop, with no thread switch. The answer is conservative: a gate that
does not say is taken to use the database, and so is anything the delivery limit counts, a
failure (its retry policy may be a row) and a copy a requeue operation waits for. Plain
data, no broker, no database.
"""

from __future__ import annotations

import random
from typing import Any

from django_rmq_retry.consumer.actions import Delivery
from django_rmq_retry.consumer.gates import GATES, Arrival
from django_rmq_retry.consumer.handler import Attempt, Handler
from django_rmq_retry.core.delays import DelayLevels
from django_rmq_retry.core.names import Names
from django_rmq_retry.parking import operations
from django_rmq_retry.registry import Receiver, Registry, TopicKey

NAMES = Names("p")
LEVELS = DelayLevels(100, 23)


class Silent:
    """A gate that never says whether it uses the database."""

    def check(self, arrival: Arrival) -> None:
        return None


class Redelivered:
    """The delivery limit counts redelivered deliveries only (as ``DeliveryLimit``)."""

    def applies(self, d: Delivery, headers: Any) -> bool:
        return d.redelivered


def _receiver(**options: Any) -> Receiver:
    async def notify(message: Any, **kwargs: Any) -> None:
        return None

    return Registry().register(notify, [TopicKey("shop.order.paid")], **options)


def _handler(gates: Any = None) -> Handler:
    return Handler(NAMES, LEVELS, limits=Redelivered(), rng=random.Random(0), gates=gates)  # type: ignore[arg-type]


def _delivery(rec: Receiver | None, *, redelivered: bool = False, **headers: Any) -> Delivery:
    props = {"content_type": "application/json", "headers": headers}
    queue = rec.queue_name("p") if rec is not None else NAMES.orphan_queue
    return Delivery(queue, rec, "p.work", "shop.order.paid", redelivered, props, b"{}")


def test_a_plain_receivers_first_delivery_and_success_stay_on_the_loop():
    handler, rec = _handler(), _receiver()  # the gates every consumer runs (GATES)
    assert len(handler.gates.gates) == len(GATES)
    d = _delivery(rec)
    assert handler.prepares_on_loop(d)
    step = handler.prepare(d)
    assert isinstance(step, Attempt)
    assert handler.concludes_on_loop(step, None)


def test_what_may_touch_the_database_goes_to_the_database_threads():
    handler, rec = _handler(), _receiver()
    assert not handler.prepares_on_loop(_delivery(rec, redelivered=True))  # counted
    assert not handler.prepares_on_loop(_delivery(None))  # the orphans' parks
    step = handler.prepare(_delivery(rec))
    assert isinstance(step, Attempt)
    assert not handler.concludes_on_loop(step, ValueError("boom"))  # its retry policy
    waited = handler.prepare(_delivery(rec, **{NAMES.header(operations.HEADER): "op-1"}))
    assert isinstance(waited, Attempt)
    assert not handler.concludes_on_loop(waited, None)  # a requeue operation's copy


def test_a_gate_that_may_use_the_database_for_a_receiver_keeps_its_steps_off_the_loop():
    handler = _handler()
    for rec in (
        _receiver(depends_on=["payments"]),  # the breaker's rows
        _receiver(ordering_key=lambda message: "k"),  # the holds' rows
    ):
        d = _delivery(rec)
        assert not handler.prepares_on_loop(d)
    quiet = _receiver()
    assert handler.prepares_on_loop(_delivery(quiet))


def test_a_gate_that_does_not_say_is_taken_to_use_the_database():
    handler, rec = _handler([Silent()]), _receiver()
    assert not handler.prepares_on_loop(_delivery(rec))
    assert handler.gates.uses_database(rec)
