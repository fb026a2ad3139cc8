"""The ack book (``consumer/acks.py``): pure tests, no broker.

The property tests replay every frame the book returns on a model of the broker's side of
one channel: the deliveries it still waits an answer for. An ack or nack of a tag it does
not wait for is the channel error RabbitMQ closes the channel with (406, unknown delivery
tag); a multiple ack answers every waiting tag up to its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from django_rmq_retry.consumer.acks import AckBook, Frame

ACK, REQUEUE, DROP = "ack", "requeue", "drop"


@dataclass
class Broker:
    """The broker's side of one channel, and what the client told it."""

    waiting: list[int] = field(default_factory=list)  # delivered, not answered, in order
    answers: dict[int, str] = field(default_factory=dict)  # tag -> how it was answered
    frames: list[Frame] = field(default_factory=list)

    def deliver(self, tag: int) -> None:
        self.waiting.append(tag)

    def receive(self, frame: Frame) -> list[int]:
        """Apply one frame; the tags it answered (AssertionError: a channel error)."""
        assert frame.tag in self.waiting, f"406 unknown delivery tag {frame.tag}"
        if frame.nack:
            answered = [frame.tag]
            how = REQUEUE if frame.requeue else DROP
        else:
            answered = (
                [t for t in self.waiting if t <= frame.tag] if frame.multiple else [frame.tag]
            )
            how = ACK
        for tag in answered:
            self.waiting.remove(tag)
            self.answers[tag] = how
        self.frames.append(frame)
        return answered


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, int, str]]:
    """A channel's life: deliveries arrive in tag order, settle in any order with any
    outcome (or never), and flushes fall anywhere between."""
    steps: list[tuple[str, int, str]] = []
    next_tag = 1
    open_tags: list[int] = []
    for _ in range(draw(st.integers(min_value=1, max_value=80))):
        move = draw(st.sampled_from(["deliver", "deliver", "settle", "settle", "flush"]))
        if move == "deliver" or (move == "settle" and not open_tags):
            steps.append(("deliver", next_tag, ""))
            open_tags.append(next_tag)
            next_tag += 1
        elif move == "settle":
            tag = draw(st.sampled_from(open_tags))
            open_tags.remove(tag)
            outcome = draw(st.sampled_from([ACK, ACK, ACK, REQUEUE, DROP]))
            steps.append(("settle", tag, outcome))
        else:
            steps.append(("flush", 0, ""))
    steps.append(("flush", 0, ""))
    return steps


def replay(steps: list[tuple[str, int, str]]) -> tuple[Broker, dict[int, str], list[list[Frame]]]:
    book, broker = AckBook(), Broker()
    settled: dict[int, str] = {}
    flushes: list[list[Frame]] = []
    for move, tag, outcome in steps:
        if move == "deliver":
            book.delivered(tag)
            broker.deliver(tag)
        elif move == "settle":
            assert book.ack(tag) if outcome == ACK else book.nack(tag, requeue=outcome == REQUEUE)
            settled[tag] = outcome
        else:
            frames = book.flush()
            flushes.append(frames)
            for frame in frames:
                for answered in broker.receive(frame):
                    # Never an open delivery, never a nack's tag before its nack went.
                    assert settled.get(answered) == broker.answers[answered], (answered, frame)
            # Everything settled so far is answered now, and nothing else is.
            assert set(broker.answers) == set(settled)
            assert not book.pending
    return broker, settled, flushes


@settings(max_examples=400)
@given(histories())
def test_every_settled_delivery_is_answered_once_as_settled_and_no_open_one_ever(steps):
    broker, settled, _ = replay(steps)
    assert broker.answers == settled
    assert sorted(broker.waiting) == sorted(
        t for m, t, _ in steps if m == "deliver" and t not in settled
    )


@settings(max_examples=400)
@given(histories())
def test_nacks_go_before_any_ack_whose_range_holds_their_tag(steps):
    broker, _, _ = replay(steps)
    for i, frame in enumerate(broker.frames):
        if frame.nack:
            earlier = broker.frames[:i]
            assert not any(
                not f.nack and (f.tag == frame.tag or (f.multiple and f.tag > frame.tag))
                for f in earlier
            ), (frame, earlier)


@settings(max_examples=400)
@given(histories())
def test_a_flush_sends_one_ack_at_the_head_and_single_ones_only_behind_an_open_delivery(steps):
    book, open_tags = AckBook(), set()
    for move, tag, outcome in steps:
        if move == "deliver":
            book.delivered(tag)
            open_tags.add(tag)
        elif move == "settle":
            book.ack(tag) if outcome == ACK else book.nack(tag, requeue=outcome == REQUEUE)
            open_tags.discard(tag)
        else:
            acks = [f for f in book.flush() if not f.nack]
            oldest_open = min(open_tags, default=None)
            behind = [f for f in acks if oldest_open is not None and f.tag > oldest_open]
            ahead = [f for f in acks if f not in behind]
            assert len(ahead) <= 1, acks  # the run at the head: one frame
            assert all(not f.multiple for f in behind), acks


def test_a_run_at_the_head_goes_out_as_one_multiple_ack():
    book = AckBook()
    for tag in (1, 2, 3):
        book.delivered(tag)
    for tag in (3, 1, 2):
        book.ack(tag)
    assert book.flush() == [Frame(3, multiple=True)]
    assert len(book) == 0 and book.flush() == []


def test_acks_behind_an_open_delivery_go_out_one_by_one():
    book = AckBook()
    for tag in (1, 2, 3):
        book.delivered(tag)
    book.ack(3)
    book.ack(2)
    assert book.flush() == [Frame(3), Frame(2)]
    book.ack(1)
    assert book.flush() == [Frame(1)]


def test_nacks_go_first_and_a_multiple_ack_may_then_reach_past_them():
    book = AckBook()
    for tag in (1, 2, 3, 4):
        book.delivered(tag)
    book.ack(3)
    book.nack(2)
    book.ack(1)
    book.nack(4, requeue=False)
    assert book.flush() == [
        Frame(2, nack=True),
        Frame(4, nack=True, requeue=False),
        Frame(3, multiple=True),
    ]


def test_a_tag_answered_already_or_never_delivered_is_never_answered():
    book = AckBook()
    book.delivered(1)
    assert book.ack(1)
    assert not book.ack(1) and not book.nack(1)  # settled twice: the first one counts
    assert not book.ack(7)  # not a delivery of this channel
    assert book.flush() == [Frame(1)]
    assert not book.nack(1)
    assert book.flush() == []


def test_a_delivery_open_for_long_keeps_the_book_small():
    book = AckBook()
    book.delivered(1)
    for tag in range(2, 5002):
        book.delivered(tag)
        book.ack(tag)
        assert book.flush() == [Frame(tag)]
    assert len(book) == 1 and len(book._order) < 200
    book.ack(1)
    assert book.flush() == [Frame(1)]
