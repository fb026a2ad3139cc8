"""The order of a relay's rounds (``outbox.drain.Drain``): pure, no broker or database."""

from __future__ import annotations

from django_rmq_retry.outbox.drain import Drain
from django_rmq_retry.outbox.relay import RelayRound


def _round(last_id: int, *, full: bool, waiting: int = 0) -> RelayRound:
    return RelayRound(published=1, last_id=last_id, full=full, waiting=waiting)


def test_full_rounds_go_on_after_their_last_row_and_a_short_one_ends_the_drain():
    drain = Drain()
    assert drain.advance(_round(20, full=True)) == Drain.NEXT
    assert drain.after == 20
    assert drain.advance(_round(35, full=False)) == Drain.DONE
    assert drain.after is None


def test_rows_left_waiting_in_a_full_round_bring_the_drain_back_to_the_oldest_row():
    """The round that skipped rows was full, so the drain went on; the short round at the
    end had nothing waiting, but the skipped rows are still there: back to the oldest."""
    drain = Drain()
    assert drain.advance(_round(20, full=True, waiting=5)) == Drain.NEXT
    assert drain.advance(_round(40, full=True)) == Drain.NEXT
    assert drain.advance(_round(45, full=False)) == Drain.PAUSE
    assert drain.after is None
    assert drain.advance(_round(10, full=False)) == Drain.DONE  # the pass found them free


def test_a_restart_forgets_the_position_and_what_waited():
    drain = Drain()
    drain.advance(_round(20, full=True, waiting=3))
    drain.restart()
    assert drain.after is None
    assert drain.advance(RelayRound()) == Drain.DONE


def test_rows_left_waiting_before_an_overlap_are_looked_at_again_after_it():
    """The housekeeper's drain: a full round left rows waiting, overlapped rounds published
    the rest cleanly; the drain must still go back for the waiting rows (it ended here
    once, and ``rmq_relay --once`` with three relays left 4 of 3,000 rows unpublished)."""
    drain = Drain()
    assert drain.advance(_round(20, full=True, waiting=4)) == Drain.NEXT
    assert drain.after_overlap(_round(900, full=False), clean=True) == Drain.NEXT
    assert drain.after is None  # from the oldest row
    assert drain.advance(_round(10, full=False)) == Drain.DONE


def test_an_overlap_ends_the_drain_only_when_clean_and_nothing_waited():
    drain = Drain()
    drain.advance(_round(20, full=True))
    assert drain.after_overlap(_round(900, full=False), clean=True) == Drain.DONE
    drain.advance(_round(20, full=True))
    assert drain.after_overlap(_round(900, full=False), clean=False) == Drain.NEXT
    drain.advance(_round(20, full=True))
    assert drain.after_overlap(_round(900, full=False, waiting=2), clean=True) == Drain.NEXT
