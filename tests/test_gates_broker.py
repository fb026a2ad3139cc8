"""The gates' outcomes carried out by the real consumer against the real broker: a give-back
goes back to its queue after its wait, uncounted; a hold waits in the delay levels and comes
back at the same attempt. Lost: none."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from django_rmq_retry import Topic
from django_rmq_retry.consumer import gates as gates_module
from django_rmq_retry.consumer.gates import Arrival, GateContext
from django_rmq_retry.core.gate_outcome import GateOutcome, GiveBack, Hold
from django_rmq_retry.models import DeliveryStart, ParkedMessage

pytestmark = [pytest.mark.broker, pytest.mark.django_db(transaction=True)]

gated = Topic("test.gated")


class BackThenHold:
    """Gives each message back once, then holds it once, then lets it run."""

    seen: dict[Any, int] = {}

    def __init__(self, context: GateContext) -> None:
        self.context = context

    def check(self, arrival: Arrival) -> GateOutcome | None:
        n = arrival.body["n"]
        BackThenHold.seen[n] = BackThenHold.seen.get(n, 0) + 1
        if BackThenHold.seen[n] == 1:
            return GiveBack("the first time", wait=0.2)
        if BackThenHold.seen[n] == 2:
            return Hold(0.5, "the second time")
        return None


def test_a_give_back_and_a_hold_reach_the_receiver_once_uncounted(
    rmq, registry_snapshot, monkeypatch
):
    monkeypatch.setattr(gates_module, "GATES", [f"{__name__}.BackThenHold"])
    BackThenHold.seen = {}
    ran: list[tuple[int, int, bool]] = []

    @gated.connect
    def gated_receiver(message, **kwargs):
        ran.append((message.body["n"], message.attempt, message.redelivered))

    rmq.setup()
    for n in range(3):
        gated.send({"n": n})
    # Each message: its hold copy (counted as a copy published) and its run: 6 settled.
    call_command("rmq_consume", "gated_receiver", max_messages=6, max_idle_time=60, verbosity=0)
    assert sorted(ran) == [(0, 1, False), (1, 1, False), (2, 1, False)]
    assert BackThenHold.seen == {0: 3, 1: 3, 2: 3}
    assert ParkedMessage.objects.count() == 0
    assert DeliveryStart.objects.count() == 0  # the give-back counted no start
    assert rmq.depth(rmq.queue("gated_receiver")) == 0
