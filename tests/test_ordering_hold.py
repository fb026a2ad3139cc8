"""Per-key order through the consumer's own handler, on the in-memory broker: a failed
message holds its key only, later messages of the key wait in the database and run in
order once it succeeds; a parked blocker holds its key until a requeue or a discard."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from django.test import override_settings

from django_rmq_retry import Topic, receiver
from django_rmq_retry.consumer.actions import Ack, Delivery
from django_rmq_retry.consumer.gates import Pipeline
from django_rmq_retry.core.delays import DelayLevels
from django_rmq_retry.core.envelope import read_incoming
from django_rmq_retry.core.gate_outcome import Settled
from django_rmq_retry.core.names import Names
from django_rmq_retry.models import HeldMessage, KeyHold, ParkedMessage
from django_rmq_retry.parking import discard, requeue
from django_rmq_retry.registry import Receiver
from django_rmq_retry.testing import InMemoryBroker

events = Topic("ordering.account.changed")


class Book:
    """What the receiver applied, per key, and which (key, n) fail how many times."""

    def __init__(self) -> None:
        self.applied: dict[str, list[int]] = defaultdict(list)
        self.fail: dict[tuple[str, int], int] = {}

    def apply(self, message: Any, **kwargs: Any) -> None:
        key, n = message.body["account"], message.body["n"]
        left = self.fail.get((key, n), 0)
        if left:
            self.fail[(key, n)] = left - 1
            raise ConnectionError(f"{key}/{n} down")
        self.applied[key].append(n)


@pytest.fixture
def book(registry_snapshot: None) -> Book:
    b = Book()

    @receiver(
        events,
        ordering_key="account",
        retry={"max_attempts": 3, "initial_delay": 10, "jitter": "none"},
    )
    def apply(message: Any, **kwargs: Any) -> None:
        b.apply(message, **kwargs)

    return b


def _send(keys: list[str], per_key: int) -> None:
    for n in range(per_key):
        for key in keys:
            events.send({"account": key, "n": n})


@pytest.mark.django_db(transaction=True)
def test_a_retry_holds_its_key_only_and_releases_it_in_order(book: Book) -> None:
    book.fail[("a", 1)] = 1
    with InMemoryBroker() as broker:
        _send(["a", "b", "c"], 5)
        runs = broker.run_until_idle()
    assert book.applied == {k: [0, 1, 2, 3, 4] for k in "abc"}
    outcomes = [r.outcome for r in runs]
    assert outcomes.count("retried") == 1
    assert outcomes.count("set_aside") == 3  # a/2, a/3, a/4 waited behind a/1
    assert not KeyHold.objects.exists() and not HeldMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_other_keys_go_on_while_a_key_waits(book: Book) -> None:
    book.fail[("a", 0)] = 2
    with InMemoryBroker() as broker:
        _send(["a", "b"], 3)
        broker.run_ready()  # what is ready now: no retry is due yet
        assert book.applied == {"b": [0, 1, 2]}
        hold = KeyHold.objects.get()
        assert (hold.key, hold.state) == ("a", "retrying")
        assert HeldMessage.objects.filter(hold=hold).count() == 2
        broker.run_until_idle()
    assert book.applied == {"a": [0, 1, 2], "b": [0, 1, 2]}
    assert not KeyHold.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_released_message_that_fails_holds_the_key_again(book: Book) -> None:
    book.fail[("a", 0)] = 1
    book.fail[("a", 2)] = 1
    with InMemoryBroker() as broker:
        _send(["a"], 5)
        broker.run_until_idle()
    assert book.applied == {"a": [0, 1, 2, 3, 4]}
    assert not HeldMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_parked_blocker_holds_its_key_until_requeued(book: Book) -> None:
    book.fail[("a", 1)] = 3  # every attempt: parked
    with InMemoryBroker() as broker:
        _send(["a", "b"], 4)
        broker.run_until_idle()
        assert book.applied == {"a": [0], "b": [0, 1, 2, 3]}
        hold = KeyHold.objects.get()
        parked = ParkedMessage.objects.get()
        assert (hold.state, hold.parked_id) == ("parked", parked.pk)
        assert [m.message_id for m in HeldMessage.objects.filter(hold=hold)] == [
            r.message_id for r in broker.runs if r.outcome == "set_aside"
        ]
        book.fail.clear()
        requeue(ParkedMessage.objects.all())
        broker.run_until_idle()
    assert book.applied == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]}
    assert not KeyHold.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_discarding_a_parked_blocker_releases_its_key_in_order(book: Book) -> None:
    book.fail[("a", 0)] = 3
    with InMemoryBroker() as broker:
        _send(["a"], 3)
        broker.run_until_idle()
        assert book.applied == {}
        discard(ParkedMessage.objects.all())
        broker.run_until_idle()
    assert book.applied == {"a": [1, 2]}
    assert not KeyHold.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_skip_lets_the_messages_behind_a_parked_one_go_on(book: Book) -> None:
    book.fail[("a", 0)] = 3
    with override_settings(RMQ_RETRY={"ORDERING_ON_PARK": "skip"}), InMemoryBroker() as broker:
        _send(["a"], 3)
        broker.run_until_idle()
    assert book.applied == {"a": [1, 2]}
    assert ParkedMessage.objects.count() == 1
    assert not KeyHold.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_message_without_its_key_is_parked_with_the_reason(book: Book) -> None:
    with InMemoryBroker() as broker:
        rec = next(r for r in broker.receivers if r.ordering_key == "account")
        # A foreign publisher: right partition header, no key in the body.
        header = broker.names.partition_header(rec.queue_name(broker.names.prefix))
        broker.model.publish(
            broker.names.work_exchange,
            events.routing_key,
            b'{"n": 1}',
            {"content_type": "application/json", "headers": {header: "0"}},
        )
        broker.run_until_idle()
    row = ParkedMessage.objects.get()
    assert row.reason == "non_retryable"
    assert "no ordering key" in row.reason_detail and "'account'" in row.reason_detail


def test_a_settled_outcome_is_acked_without_running() -> None:
    pipeline = Pipeline(Names("p"), DelayLevels(100, 4), lambda: None, gates=[])  # type: ignore[arg-type,return-value]
    d = Delivery("p.q", None, "p.work", "rk", False, {"headers": {}}, b"{}")
    env = read_incoming({}, "p.work", "rk", Names("p"))

    def park(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a settled delivery is not parked")

    rec = Receiver(func=print, name="x", queue_suffix=None)
    action = pipeline.action(Settled("set aside"), d, rec, env, "start-1", park)
    assert action == Ack(kind="held", start_key="start-1")


def _retrying_hold(now: Any) -> KeyHold:
    """Key "k" of receiver "r" held by "m1", whose retry copy is on its way."""
    return KeyHold.objects.create(
        receiver="r",
        key="k",
        queue="p.r.p00",
        state="retrying",
        blocker="m1",
        since=now,
        changed_at=now,
    )


@pytest.mark.django_db(transaction=True)
def test_the_consumer_publishes_a_release_before_it_records_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.utils import timezone

    from django_rmq_retry.parking import holds

    now = timezone.now()
    hold = _retrying_hold(now)
    rows = [
        HeldMessage.objects.create(hold=hold, message_id=f"m{n}", body=b"{}", held_at=now)
        for n in (2, 3)
    ]
    published: list[list[int]] = []

    def broker_down(queue: str, held: Any) -> None:
        raise ConnectionError("broker away")

    monkeypatch.setattr(holds, "_publish", broker_down)
    with pytest.raises(ConnectionError):
        holds.release_next(hold.pk)
    hold.refresh_from_db()
    assert (hold.state, hold.blocker) == ("retrying", "m1")  # nothing recorded: runs again

    monkeypatch.setattr(holds, "_publish", lambda q, held: published.append([r.pk for r in held]))
    assert holds.release_next(hold.pk) == 2
    hold.refresh_from_db()
    assert (hold.state, hold.released_upto) == ("releasing", rows[-1].pk)
    later = HeldMessage.objects.create(hold=hold, message_id="m4", body=b"{}", held_at=now)
    holds.row_done(hold.pk, rows[0].pk)  # a copy of the round is still out: nothing new
    assert published == [[rows[0].pk, rows[1].pk]]
    holds.row_done(hold.pk, rows[1].pk)  # the round is over: the next one is published
    assert published[-1] == [later.pk]
    hold.refresh_from_db()
    assert hold.released_upto == later.pk
    holds.row_done(hold.pk, later.pk)
    assert not KeyHold.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_copy_ahead_of_its_turn_ends_the_round_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.utils import timezone

    from django_rmq_retry.parking import holds

    now = timezone.now()
    hold = _retrying_hold(now)
    r3, r4, r5 = (
        HeldMessage.objects.create(hold=hold, message_id=f"m{n}", body=b"{}", held_at=now)
        for n in (3, 4, 5)
    )
    published: list[list[int]] = []
    monkeypatch.setattr(holds, "_publish", lambda q, held: published.append([r.pk for r in held]))
    holds.release_next(hold.pk)
    holds.keep(hold.pk, r5.pk)  # r5's copy came first (a redelivery reordered them): acked
    holds.row_done(hold.pk, r3.pk)
    holds.row_done(hold.pk, r4.pk)  # the round (r3, r4) is over: r5 goes out again
    assert published == [[r3.pk, r4.pk, r5.pk], [r5.pk]]
    holds.row_done(hold.pk, r5.pk)
    assert not KeyHold.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_consumer_taking_over_a_partition_reads_the_holds_left_there(book: Book) -> None:
    from django.utils import timezone

    from django_rmq_retry.conf import current_names
    from django_rmq_retry.core.ordering import partition_of
    from django_rmq_retry.core.topology_plan import receiver_queues
    from django_rmq_retry.registry import default_registry

    rec = next(r for r in default_registry.all() if r.ordering_key == "account")
    queue = receiver_queues(rec, current_names().prefix, 4)[partition_of("a", 4)]
    now = timezone.now()
    # A hold a previous active consumer of the partition left (its blocker still retrying).
    KeyHold.objects.create(
        receiver=rec.name,
        key="a",
        queue=queue,
        state="retrying",
        blocker="elsewhere",
        since=now,
        changed_at=now,
    )
    with InMemoryBroker() as broker:
        _send(["a", "b"], 2)
        runs = broker.run_until_idle()
    assert book.applied == {"b": [0, 1]}
    assert [r.outcome for r in runs if r.outcome == "set_aside"] == ["set_aside"] * 2
    assert HeldMessage.objects.count() == 2
