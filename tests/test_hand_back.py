"""Finished jobs go back to the connection's thread in batches (``pool.HandBack``): pure
tests, no broker. The connection's thread is played by whoever calls ``take``."""

from __future__ import annotations

import threading

from django_rmq_retry.consumer.pool import HandBack, Job


def _job(n: int) -> Job:
    return Job(n)  # type: ignore[arg-type]  # a number stands for the delivery


def _jobs(n: int, start: int = 0) -> list[Job]:
    return [_job(i) for i in range(start, start + n)]


class Wakes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_a_busy_thread_wakes_the_loop_once_per_batch():
    wakes = Wakes()
    back = HandBack(3, wakes)
    for job in _jobs(2):
        back.put(job)
    assert wakes.count == 0 and back
    back.put(_job(2))
    assert wakes.count == 1
    for job in _jobs(4, 3):  # a wake-up is pending: it takes these too
        back.put(job)
    assert wakes.count == 1
    assert [job.delivery for job in back.take()] == list(range(7))
    assert not back


def test_a_thread_about_to_wait_sends_what_it_finished_now():
    wakes = Wakes()
    back = HandBack(5, wakes)
    back.idle()
    assert wakes.count == 0  # nothing finished: no wake-up
    back.put(_job(0))
    back.idle()
    back.idle()
    assert wakes.count == 1
    back.take()
    back.idle()
    assert wakes.count == 1


def test_outcomes_that_must_not_wait_wake_at_once_and_a_batch_wakes_once():
    wakes = Wakes()
    back = HandBack(5, wakes)
    back.put(_job(0), now=True)
    assert wakes.count == 1
    back.take()
    back.put_batch(_jobs(12))
    assert wakes.count == 2
    assert len(back.take()) == 12
    back.put_batch([])
    assert wakes.count == 2


def test_a_new_connection_forgets_a_wake_up_scheduled_on_the_old_one():
    wakes = Wakes()
    back = HandBack(1, wakes)
    back.put(_job(0))
    assert wakes.count == 1
    back.reset()  # that wake-up went with the old connection
    back.put(_job(1))
    assert wakes.count == 2


def test_no_job_is_left_behind_by_threads_racing_the_loop():
    """Four threads put 5,000 jobs each while a loop thread takes on every wake-up: once
    each thread has gone idle, the wake-ups took every job (none waits for a safety net)."""
    wake = threading.Semaphore(0)
    back = HandBack(7, wake.release)
    taken: list[Job] = []
    done = threading.Event()

    def loop() -> None:
        while True:
            if wake.acquire(timeout=0.01):
                taken.extend(back.take())
            elif done.is_set():  # every wake-up released before it was taken
                return

    def worker(start: int) -> None:
        for job in _jobs(5_000, start):
            back.put(job)
        back.idle()

    loop_thread = threading.Thread(target=loop)
    loop_thread.start()
    workers = [threading.Thread(target=worker, args=(n * 5_000,)) for n in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    done.set()
    loop_thread.join()
    assert not back
    assert sorted(job.delivery for job in taken) == list(range(20_000))
