"""A generative adversary against one real consumer: random foreign input, broker events.

Each run draws a few hundred messages from a seeded generator (``gen.py``; the seed comes from
the checked-out commit, so one commit draws the same messages on every run; it is printed,
``ADV_SEED=<seed>`` replays or changes it, ``ADV_COUNT`` changes the size) and publishes them from clients
that are not ours. One ``rmq_consume`` subprocess handles them with three receivers whose
outcome the message decides. After the run, every message the broker accepted must be handled
or parked (lost = 0), no receiver may run more often than its policy allows, and the consumer
may reconnect only as often as the broker events explain.

* ``test_adversarial_messages``: adversarial input only; disturbs no one (shared broker lock).
* ``test_adversarial_broker_events``: the same, interleaved with queue deletes, connection
  kills, a memory alarm and a short ``consumer_timeout`` (marker ``faults``; run it under the
  exclusive lock ``flock -x /tmp/rmq310.lock``). The broker is always restored.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import pytest
from django.core.management import call_command

from tests.adversarial import harness as h
from tests.adversarial.advapp.receivers import register
from tests.adversarial.gen import Case, generate
from tests.conftest import start_consumer, wait_for
from tests.faults.conftest import queues_empty, stop
from tests.waiting import output_has

pytestmark = [
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.adversarial,
    pytest.mark.django_db(transaction=True),
]

DELIVERY_LIMIT = 5  # tests.settings' default (RMQ_DELIVERY_LIMIT)
SETTLE_SECONDS = 90


@pytest.fixture
def adv(registry_snapshot: None, rmq: Any) -> Any:
    """The adversarial receivers registered for this test (and declared), on ``rmq``'s prefix."""
    from django_rmq_retry.registry import default_registry

    register(default_registry)
    call_command("rmq_consume", setup_only=True, verbosity=0)
    return rmq


def _routes(rmq: Any) -> dict[str, tuple[str, str]]:
    return {
        "a": ("", rmq.queue("adv_a")),
        "g": ("", rmq.queue("adv_g")),
        "work": (rmq.names.work_exchange, "adv.work"),
        "other": (rmq.names.work_exchange, "adv.other"),
    }


def _consumer(rmq: Any) -> Any:
    child = start_consumer(
        rmq.prefix,
        rmq.log,
        "adv_a",
        "adv_b",
        "adv_g",
        "--verbosity",
        "2",  # INFO: the "consuming" line says when it is ready
        DJANGO_SETTINGS_MODULE="tests.adversarial.settings",
        RMQ_DELIVERY_LIMIT=str(DELIVERY_LIMIT),
    )
    output_has(child, "consuming")
    return child


class Run:
    """One run's bookkeeping: what was published, what the broker refused, the events."""

    def __init__(self, name: str, seed: int, rmq: Any) -> None:
        self.name, self.seed, self.rmq = name, seed, rmq
        self.tally = h.Tally()
        self.refused: dict[str, str] = {}
        self.cases: dict[str, Case] = {}
        self.events: list[str] = []
        self.allowed_reconnects = 0
        self.notes: list[str] = []
        self.publishers = h.Publishers(_routes(rmq))

    def publish(self, case: Case) -> None:
        self.cases[case.token] = case
        result = self.publishers.publish(case)
        if result == "ack":
            for rec in case.receivers:
                self.tally.expected[(rec, case.token)] = case
        else:
            self.refused[case.token] = result

    def settle(self, child: Any) -> bool:
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            if self.tally.refresh(self.rmq.log).complete() and queues_empty(self.rmq):
                return True
            if child.poll() is not None:
                return False
            time.sleep(0.5)
        return self.tally.refresh(self.rmq.log).complete() and queues_empty(self.rmq)

    def check(self, child: Any, settled: bool) -> None:
        """Stop the consumer, print the count table row, fail with every invariant broken."""
        alive = child.poll() is None
        out = stop(child)
        tally = self.tally.refresh(self.rmq.log)
        self.report(tally, out)
        problems = [] if alive else ["the consumer exited"]
        if not settled:
            problems.append(f"not settled within {SETTLE_SECONDS}s: {_depths(self.rmq)}")
        problems += self.problems(tally, out)
        arrived_anyway = sorted(
            t for t in self.refused if any(k[1] == t for k in [*tally.done, *tally.parked])
        )
        if arrived_anyway:
            self.notes.append(f"refused at publish yet arrived: {arrived_anyway[:5]}")
        for note in self.notes:
            print("note:", note)
        if problems:
            tail = "\n".join(out.splitlines()[-60:])
            pytest.fail(
                f"seed {self.seed} ({self.name}):\n"
                + "\n".join(problems)
                + "\n--- consumer:\n"
                + tail,
                pytrace=False,
            )
        self.check_duplicates(tally)

    def report(self, tally: h.Tally, out: str) -> None:
        _over, most = tally.over_runs(DELIVERY_LIMIT)
        h.record(
            {
                "test": self.name,
                "seed": self.seed,
                "published": len(self.cases) - len(self.refused),
                "handled": tally.handled,
                "parked": tally.parked_count,
                "dups": tally.duplicates,
                "lost": len(tally.lost),
                "refused": len(self.refused),
                "runs max": most,
                "reconnects/events": f"{h.reconnects(out)}/{len(self.events)}",
            }
        )
        print(f"replay: ADV_SEED={self.seed} pytest tests/adversarial -k {self.name}")
        print(f"events: {self.events}; allowed reconnects {self.allowed_reconnects}")
        print(f"internal errors logged: {out.count('internal error')}")
        for token, why in sorted(self.refused.items())[:15]:
            print(f"  refused {token}: {why} [{', '.join(self.cases[token].kind)}]")

    def problems(self, tally: h.Tally, out: str) -> list[str]:
        """Lost pairs (with what the consumer said about them), runs over policy, reconnects."""
        problems = []
        for rec, token in tally.lost[:10]:
            runs = [(e["attempt"], e["redelivered"]) for e in tally.starts.get((rec, token), [])]
            said = [line[:300] for line in out.splitlines() if token in line][:5]
            said += _rows_of(token)
            problems.append(
                f"LOST {rec}: {self.cases[token].describe()}\n    runs (attempt, redelivered): "
                f"{runs}; consumer lines: {said}"
            )
        if len(tally.lost) > 10:
            problems.append(f"... {len(tally.lost) - 10} more lost")
        over, _most = tally.over_runs(DELIVERY_LIMIT)
        problems += [f"RUNS {line}: {self.cases[_tok(line)].describe()}" for line in over[:10]]
        problems += h.unreadable_rows(tally)[:10]
        internal = out.count("internal error") + out.count("Traceback")
        if internal:
            problems.append(f"INTERNAL {internal} internal error / traceback line(s) in the log")
        reconnects = h.reconnects(out)
        if reconnects > self.allowed_reconnects:
            problems.append(
                f"RECONNECTS {reconnects} > {self.allowed_reconnects} explained by events {self.events}"
            )
        return problems

    def check_duplicates(self, tally: h.Tally) -> None:
        """Without broker events at-least-once has no reason to run anything twice."""
        if not self.events and tally.duplicates:
            dup = [k for k, n in tally.done.items() if n > 1] + [
                k for k in tally.parked if k in tally.done
            ]
            pytest.fail(
                f"seed {self.seed}: {tally.duplicates} duplicate(s) without any broker event: "
                + "; ".join(self.cases[t].describe() for _r, t in dup[:5] if t in self.cases),
                pytrace=False,
            )


def _rows_of(token: str) -> list[str]:
    """Every row that mentions ``token`` anywhere (a lost pair's row may sit under another key)."""
    from django_rmq_retry.models import ParkedMessage

    out = []
    for row in ParkedMessage.objects.all().iterator():
        text = f"{bytes(row.body or b'')!r}{row.message_id}{row.headers}{row.history}"
        if token in text:
            out.append(
                f"row {row.pk} {h.short(row.receiver)} {row.status} {row.reason} "
                f"count {row.park_count} message_id {row.message_id[:40]!r}"
            )
    return out


def _tok(line: str) -> str:
    return next(w for w in line.split() if w.startswith("AV"))


def _depths(rmq: Any) -> dict[str, Any]:
    from tests.faults.conftest import depths

    return depths(rmq)


def _count(default: int) -> int:
    return int(os.environ.get("ADV_COUNT", default))


def test_adversarial_messages(adv: Any) -> None:
    seed = h.seed_from_env()
    print(f"\nADV_SEED={seed}")
    run = Run("messages", seed, adv)
    cases = generate(
        seed, _count(300), adv.names, {"a": adv.queue("adv_a"), "g": adv.queue("adv_g")}
    )
    child = _consumer(adv)
    try:
        for case in cases:
            run.publish(case)
        settled = run.settle(child)
    finally:
        run.publishers.close()
    run.check(child, settled)


# Broker events ---------------------------------------------------------------------------------
class Events:
    """The broker events of one run; each restores the broker before it returns."""

    def __init__(self, run: Run, child: Any, rng: random.Random) -> None:
        self.run, self.child, self.rng = run, child, rng
        self.rmq = run.rmq
        self.background: h.Background | None = None
        self.extra = 0

    def fire(self, name: str) -> None:
        self.join()
        self.run.events.append(name)
        getattr(self, name.split(":")[0])(*name.split(":")[1:])

    def join(self) -> None:
        if self.background is not None:
            self.background.join()
            self.background = None

    def _reconnected(self, before: set[str]) -> bool:
        return wait_for(lambda: bool(set(h.consumer_connections(self.child.pid)) - before), 30, 0.2)

    def kill(self) -> None:
        if not wait_for(lambda: h.consumer_connections(self.child.pid), 15, 0.2):
            self.run.notes.append("kill: the consumer had no connection for 15 s (nothing killed)")
            return
        before = set(h.consumer_connections(self.child.pid))
        h.kill_connections(self.child.pid)
        self.run.allowed_reconnects += 1
        if not self._reconnected(before):
            self.run.notes.append("kill: the consumer did not reconnect within 30s")

    def delete(self, which: str) -> None:
        """Delete a receiver queue at a quiet moment (so the delete itself drops nothing)."""
        queue = self.rmq.queue(which)
        quiet = wait_for(lambda: queues_empty(self.rmq) and _unacked(queue) == 0, 30, 0.2)
        dropped = self.rmq.ch().queue_delete(queue).method.message_count
        self.run.allowed_reconnects += 1
        if not quiet or dropped:
            self.run.notes.append(f"delete {which}: quiet={quiet}, dropped {dropped}")

        def exists() -> bool:
            try:
                self.rmq.depth(queue)
                return True
            except Exception:
                return False

        if not wait_for(exists, 15, 0.5):
            self.run.notes.append(f"delete {which}: the consumer did not re-declare its queue")
            call_command("rmq_consume", setup_only=True, verbosity=0)

    def alarm(self) -> None:
        """A memory alarm for 3 s while publishing goes on (the publisher blocks).

        It explains no reconnect: the consumer's own connection only acks (retry copies and
        parks must not stall them), so a blocked connection is no reason to drop it.
        """

        def hold() -> None:
            with h.memory_alarm(3):
                pass

        self.background = h.Background(hold)

    def timeout(self) -> None:
        """A 1 s consumer_timeout on the consumer's channel, then a receiver that sleeps 3 s.

        RabbitMQ 3.10 reads consumer_timeout when a channel opens and checks it on the
        channel's tick (``channel_tick_interval``, 60 s, re-read at every tick). So: short
        timeout and a 0.5 s tick, kill the consumer's connection so its new channel reads
        them, put the timeout back at once (the channel that follows the close must not
        time out again), keep the short tick until the broker has closed the channel.
        """
        old_timeout = h.get_env("consumer_timeout")
        old_tick = h.get_env("channel_tick_interval")
        before = set(h.consumer_connections(self.child.pid))
        self.run.allowed_reconnects += 2  # the kill, and the channel the broker closes
        try:
            try:
                h.set_env("consumer_timeout", "1000")
                h.set_env("channel_tick_interval", "500")
                h.kill_connections(self.child.pid)
                self._reconnected(before)
            finally:
                h.set_env("consumer_timeout", old_timeout)
            current = set(h.consumer_connections(self.child.pid))
            self.extra += 1
            token = f"AV{self.run.seed}N{900000 + self.extra}Z"
            body = json.dumps({"id": token, "sleep": 3}).encode()
            props = {"content_type": "application/json", "message_id": token, "delivery_mode": 2}
            self.run.publish(
                Case(900000 + self.extra, token, "g", "raw", body, props, None, ["sleeper"])
            )
            if not self._reconnected(current):
                self.run.notes.append("timeout: the broker closed no channel within 30 s")
        finally:
            h.set_env("channel_tick_interval", old_tick)


def _unacked(queue: str) -> int:
    out = h.rabbitmqctl("list_queues", "name", "messages_unacknowledged", check=False)
    for line in out.splitlines():
        parts = line.split("\t")
        if parts[0] == queue:
            return int(parts[1])
    return 0


@pytest.mark.faults
def test_adversarial_broker_events(adv: Any) -> None:
    seed = h.seed_from_env()
    print(f"\nADV_SEED={seed}")
    rng = random.Random(seed ^ 0x5EED)
    run = Run("broker_events", seed, adv)
    cases = generate(
        seed, _count(240), adv.names, {"a": adv.queue("adv_a"), "g": adv.queue("adv_g")}, cli=False
    )
    names = ["kill", "kill", "delete:adv_a", "delete:adv_g", "alarm", "timeout"]
    rng.shuffle(names)
    step = len(cases) // (len(names) + 1)
    at = {step * (i + 1) + rng.randint(-step // 3, step // 3): n for i, n in enumerate(names)}
    original_timeout = h.get_consumer_timeout()
    original_tick = h.get_env("channel_tick_interval")
    child = _consumer(adv)
    events = Events(run, child, rng)
    try:
        for i, case in enumerate(cases):
            if i in at:
                events.fire(at[i])
            run.publish(case)
        events.join()
        settled = run.settle(child)
    finally:
        events.join()
        run.publishers.close()
        h.rabbitmqctl("set_vm_memory_high_watermark", "0.4", check=False)
        h.set_consumer_timeout(original_timeout)
        h.set_env("channel_tick_interval", original_tick)
    run.check(child, settled)
