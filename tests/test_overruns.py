"""Overlapping deliveries of one message (``consumer/overruns.py``) and the taken-back tags
of the ack book (``consumer/acks.py``): pure, no broker. The broker's side is
``tests/test_consumer_timeout.py`` (RabbitMQ 4.3)."""

from __future__ import annotations

from django_rmq_retry.consumer.acks import AckBook, Frame
from django_rmq_retry.consumer.actions import HANDLED, Delivery
from django_rmq_retry.consumer.overruns import RUN, STAND_IN, WAIT, Overruns
from django_rmq_retry.consumer.pool import CANCELLED, Job


def delivery(tag: int, message_id: str = "m1", *, redelivered: bool = False, gen: int = 1):
    return Delivery(
        "p.q", None, "p.work", "k", redelivered, {"message_id": message_id}, b"{}", tag, gen
    )


def identity(d: Delivery) -> str:
    return f"{d.queue}/{d.properties['message_id']}"


def book_with(*tags: int) -> AckBook:
    book = AckBook()
    for tag in tags:
        book.delivered(tag)
    return book


# The ack book ------------------------------------------------------------------------------
def test_what_settles_a_taken_back_tag_settles_its_stand_in_and_nothing_else():
    book = book_with(1, 2, 3)
    book.stand_in(1, 3)
    assert book.ack(2)
    assert book.flush() == [Frame(2)]  # 1 is never covered by a multiple ack
    assert book.ack(1)  # the run of 1 ended: 3 is acked in its place
    assert book.flush() == [Frame(3)]
    assert not book.ack(1) and not book.nack(1)  # and 1 is never answered


def test_a_second_take_back_moves_the_stand_in_and_the_first_one_is_never_answered():
    book = book_with(1, 2, 3)
    book.stand_in(1, 2)
    book.stand_in(1, 3)
    assert book.nack(1)
    assert book.flush() == [Frame(3, nack=True)]
    assert not book.ack(2)


def test_a_tag_taken_back_for_good_sends_nothing_and_blocks_multiple_acks():
    book = book_with(1, 2, 3, 4)
    book.stand_in(1, 3)
    book.take_back(1)
    book.take_back(3)
    assert not book.ack(1)
    assert book.ack(2) and book.ack(4)
    assert book.flush() == [Frame(2), Frame(4)]


# Overruns ------------------------------------------------------------------------------------
def test_a_redelivery_of_a_running_message_from_a_cancelled_consumer_stands_in():
    overruns, book = Overruns(identity, limit=5), book_with(1, 2)
    overruns.new_channel(1)
    first = Job(delivery(1))
    assert overruns.arrived(first, "c1", book) == RUN
    overruns.cancelled("c1", book)
    assert overruns.arrived(Job(delivery(2, redelivered=True)), "c2", book) == STAND_IN
    assert overruns.ended(first) == ([], False)
    assert book.ack(1)
    assert book.flush() == [Frame(2)]


def test_other_overlaps_wait_for_the_run_to_end():
    overruns, book = Overruns(identity, limit=5), book_with(1, 2, 3)
    overruns.new_channel(1)
    first = Job(delivery(1))
    assert overruns.arrived(first, "c1", book) == RUN
    # Published twice: not redelivered, its consumer was never cancelled.
    twin = Job(delivery(2))
    assert overruns.arrived(twin, "c1", book) == WAIT
    # Redelivered, but the consumer that has the run was not cancelled (another died).
    again = Job(delivery(3, redelivered=True))
    assert overruns.arrived(again, "c1", book) == WAIT
    assert overruns.ended(first) == ([twin, again], False)
    assert overruns.arrived(Job(delivery(4)), "c1", book) == RUN  # nothing runs any more


def test_a_run_of_the_connection_before_holds_the_redelivery_on_the_new_one():
    overruns, book = Overruns(identity, limit=5), book_with(1)
    overruns.new_channel(1)
    old = Job(delivery(1))
    overruns.arrived(old, "c1", book)
    overruns.cancelled("c1", book)
    overruns.new_channel(2)
    new = Job(delivery(1, redelivered=True, gen=2))
    assert overruns.arrived(new, "c9", AckBook()) == WAIT  # tags of two channels: no stand-in
    assert overruns.ended(old) == ([new], False)


def test_a_cancelled_job_that_never_ran_holds_nothing():
    overruns, book = Overruns(identity, limit=5), book_with(1, 2)
    overruns.new_channel(1)
    job = Job(delivery(1))
    overruns.arrived(job, "c1", book)
    job.state = CANCELLED
    assert overruns.arrived(Job(delivery(2, redelivered=True)), "c1", book) == RUN


def test_taken_back_limit_times_while_one_run_goes_on_the_message_is_parked():
    overruns, book = Overruns(identity, limit=2), book_with(1, 2, 3, 4)
    overruns.new_channel(1)
    run = Job(delivery(1))
    overruns.arrived(run, "c1", book)
    overruns.cancelled("c1", book)
    assert overruns.arrived(Job(delivery(2, redelivered=True)), "c2", book) == STAND_IN
    overruns.cancelled("c2", book)
    assert overruns.arrived(Job(delivery(3, redelivered=True)), "c3", book) == 2  # park it
    # The run ends later: its outcome is dropped, and settling its tag sends nothing.
    assert overruns.ended(run) == ([], True)
    run.finish(HANDLED, None)
    assert not book.ack(1)
    # The parked delivery is acked on its own once its row is committed.
    assert book.ack(3)
    assert book.flush() == [Frame(3)]
    # A later delivery of it (its row could not be parked, say) waits for nothing.
    assert overruns.arrived(Job(delivery(4, redelivered=True)), "c3", book) == RUN


def test_taken_back_after_the_run_ended_before_its_outcome_is_answered():
    overruns, book = Overruns(identity, limit=5), book_with(1, 2)
    overruns.new_channel(1)
    run = Job(delivery(1))
    overruns.arrived(run, "c1", book)
    overruns.ended(run)  # e.g. its retry copy waits for the broker's confirm
    overruns.cancelled("c1", book)
    assert overruns.arrived(Job(delivery(2, redelivered=True)), "c2", book) == STAND_IN
    assert book.ack(1)  # the copy is confirmed: the stand-in is acked
    assert book.flush() == [Frame(2)]


def test_taken_back_after_the_outcome_is_settled_but_not_yet_sent():
    overruns, book = Overruns(identity, limit=5), book_with(1, 2)
    overruns.new_channel(1)
    run = Job(delivery(1))
    overruns.arrived(run, "c1", book)
    overruns.ended(run)
    assert book.ack(1)  # settled, waiting for the next flush
    overruns.cancelled("c1", book)
    assert overruns.arrived(Job(delivery(2, redelivered=True)), "c2", book) == STAND_IN
    assert book.flush() == [Frame(2)]  # the ack goes to the delivery the broker holds now


def test_once_its_outcome_is_sent_a_new_delivery_runs():
    overruns, book = Overruns(identity, limit=5), book_with(1, 2)
    overruns.new_channel(1)
    run = Job(delivery(1))
    overruns.arrived(run, "c1", book)
    overruns.ended(run)
    book.ack(1)
    assert book.flush() == [Frame(1)]
    overruns.cancelled("c1", book)
    assert overruns.arrived(Job(delivery(2, redelivered=True)), "c2", book) == RUN
    assert overruns.running() == 1  # the ended run is forgotten


def test_cancelled_while_it_runs_its_outcome_waits_for_the_redelivery():
    # The consumer timeout fires, the run ends, and only then (the consumer resumed) does the
    # broker deliver the message again: the outcome must go to that delivery, never to the
    # taken-back tag.
    overruns, book = Overruns(identity, limit=5), book_with(1, 2, 3)
    overruns.new_channel(1)
    run = Job(delivery(1))
    overruns.arrived(run, "c1", book)
    overruns.cancelled("c1", book)
    overruns.ended(run)
    assert book.ack(1)
    assert book.flush() == []  # nothing to the taken-back tag
    assert overruns.arrived(Job(delivery(3, redelivered=True)), "c2", book) == STAND_IN
    assert book.flush() == [Frame(3)]


def test_cancelled_after_the_outcome_is_settled_but_not_sent():
    overruns, book = Overruns(identity, limit=5), book_with(1, 2)
    overruns.new_channel(1)
    run = Job(delivery(1))
    overruns.arrived(run, "c1", book)
    overruns.ended(run)
    assert book.nack(1)
    overruns.cancelled("c1", book)
    assert book.flush() == []
    assert overruns.arrived(Job(delivery(2, redelivered=True)), "c2", book) == STAND_IN
    assert book.flush() == [Frame(2, nack=True)]


def test_a_cancel_spares_deliveries_of_other_consumers():
    overruns, book = Overruns(identity, limit=5), book_with(1)
    overruns.new_channel(1)
    run = Job(delivery(1))
    overruns.arrived(run, "c1", book)
    overruns.cancelled("c9", book)  # another queue's consumer
    overruns.ended(run)
    assert book.ack(1)
    assert book.flush() == [Frame(1)]


def test_without_consumer_timeouts_a_cancel_holds_no_outcome_back():
    # Classic queues: a cancel means a deleted queue or a node gone, nothing delivered again.
    overruns, book = Overruns(identity, limit=5, timeouts=False), book_with(1)
    overruns.new_channel(1)
    run = Job(delivery(1))
    overruns.arrived(run, "c1", book)
    overruns.cancelled("c1", book)
    overruns.ended(run)
    assert book.ack(1)
    assert book.flush() == [Frame(1)]


def test_a_run_still_awaiting_its_stand_in_never_keeps_others_from_being_forgotten():
    overruns, book = Overruns(identity, limit=5), book_with(1, 2, 3)
    overruns.new_channel(1)
    waiting, done = Job(delivery(1, "a")), Job(delivery(2, "b"))
    overruns.arrived(waiting, "c1", book)
    overruns.arrived(done, "c2", book)
    overruns.cancelled("c1", book)  # a's outcome now waits for a redelivery
    overruns.ended(waiting)
    overruns.ended(done)
    book.ack(1)
    book.ack(2)
    assert book.flush() == [Frame(2)]
    overruns.arrived(Job(delivery(3, "c")), "c2", book)
    assert overruns.running() == 2  # a (awaiting) and c; b is forgotten
