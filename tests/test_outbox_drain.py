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
