#!/usr/bin/env python
"""What a typed receiver costs per message, in one process, without the broker.

    .venv/bin/python bench/typed_cost.py                  # untyped, msgspec, pydantic, dataclass
    .venv/bin/python bench/typed_cost.py --n 20000 --rounds 7
    .venv/bin/python bench/run.py typed                   # the same, as rows of the table

Drives the consumer's handler (``consumer.handler``: a delivery in, an action out, a no-op
receiver run in between) the way the I/O loop does, over the same ~375-byte order event,
first for an untyped receiver, then for one typed with each library's schema of the event
(``Topic(..., schema=...)``: the schema gate validates the decoded body into an instance,
``message.data``). Prints microseconds of this process's CPU per message (CPU time, not
wall time: other processes on a shared host take turns with it without being counted) and,
for each library, the cost above the untyped receiver: the medians of alternating rounds
(untyped and typed in turn, so a host whose speed drifts moves both). The target: msgspec
at most 5 µs above untyped.
"""

import argparse
import dataclasses
import datetime as dt
import decimal
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: ~375 bytes of JSON: an order paid, its customer and two lines.
EVENT = {
    "order_id": 123456,
    "customer": {"id": 987, "email": "ada@example.com", "name": "Ada Lovelace"},
    "amount": "149.90",
    "currency": "EUR",
    "paid_at": "2026-11-28T09:30:01.123456+00:00",
    "lines": [
        {"sku": "BOOK-0001", "quantity": 2, "unit_price": "49.95"},
        {"sku": "PEN-0042", "quantity": 10, "unit_price": "5.00"},
    ],
    "coupon": None,
    "gift": False,
    "note": "leave at the door, please; the dog is friendly",
}


def schemas() -> dict[str, type]:
    """The event's schema in each library (the same fields and types)."""
    import msgspec
    import pydantic

    class MCustomer(msgspec.Struct):
        id: int
        email: str
        name: str

    class MLine(msgspec.Struct):
        sku: str
        quantity: int
        unit_price: decimal.Decimal

    class MOrder(msgspec.Struct):
        order_id: int
        customer: MCustomer
        amount: decimal.Decimal
        currency: str
        paid_at: dt.datetime
        lines: list[MLine]
        coupon: str | None = None
        gift: bool = False
        note: str = ""

    class PCustomer(pydantic.BaseModel):
        id: int
        email: str
        name: str

    class PLine(pydantic.BaseModel):
        sku: str
        quantity: int
        unit_price: decimal.Decimal

    class POrder(pydantic.BaseModel):
        order_id: int
        customer: PCustomer
        amount: decimal.Decimal
        currency: str
        paid_at: dt.datetime
        lines: list[PLine]
        coupon: str | None = None
        gift: bool = False
        note: str = ""

    @dataclasses.dataclass
    class DCustomer:
        id: int
        email: str
        name: str

    @dataclasses.dataclass
    class DLine:
        sku: str
        quantity: int
        unit_price: decimal.Decimal

    @dataclasses.dataclass
    class DOrder:
        order_id: int
        customer: DCustomer
        amount: decimal.Decimal
        currency: str
        paid_at: dt.datetime
        lines: list[DLine]
        coupon: str | None = None
        gift: bool = False
        note: str = ""

    return {"msgspec": MOrder, "pydantic": POrder, "dataclass": DOrder}


def measure(n: int, rounds: int, only: str | None = None) -> dict[str, list[float]]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django_rmq_retry import Topic
    from django_rmq_retry.consumer.actions import Ack, Delivery
    from django_rmq_retry.consumer.handler import Handler
    from django_rmq_retry.core.backoff import Policy
    from django_rmq_retry.core.delays import DelayLevels
    from django_rmq_retry.core.names import Names
    from django_rmq_retry.registry import Registry

    body = json.dumps(EVENT).encode()
    names = Names("rmq_typed_cost")
    policy = Policy(max_attempts=5, initial_delay=1.0, multiplier=2.0, max_delay=60)
    handler = Handler(names, DelayLevels(100, 23), limits=None, policy_for=lambda r: policy)
    kinds: dict[str, Any] = {"untyped": None, **schemas()}
    runs: dict[str, list[Delivery]] = {}
    registry = Registry()
    for kind, schema in kinds.items():
        seen: list[Any] = []

        def noop(message: Any, _seen: list[Any] = seen, **kwargs: Any) -> None:
            _seen.append(message.data)

        noop.__module__, noop.__qualname__ = "bench.typed", kind
        topic = Topic(f"bench.typed.{kind}", schema=schema)
        rec = registry.register(noop, [topic])
        props = {"content_type": "application/json", "delivery_mode": 2, "headers": {}}
        runs[kind] = [
            Delivery(
                rec.queue_name(names.prefix),
                rec,
                "",
                topic.routing_key,
                False,
                {**props, "message_id": f"m{i}"},
                body,
                tag=i + 1,
            )
            for i in range(max(n, 1))
        ]
        action = handler.handle(runs[kind][0])  # the work is really done:
        assert isinstance(action, Ack), action  # a no-op receiver's ack, ...
        assert schema is None or isinstance(seen[-1], schema), seen[-1]  # ... an instance
    chosen = [only] if only else list(kinds)
    per: dict[str, list[float]] = {kind: [] for kind in chosen}
    for rnd in range(rounds):
        order = chosen if rnd % 2 == 0 else chosen[::-1]
        for kind in order:
            deliveries = runs[kind][:n]
            t0 = time.process_time()
            for d in deliveries:
                handler.handle(d)
            per[kind].append((time.process_time() - t0) / max(n, 1))
    return per


KINDS = ("untyped", "msgspec", "pydantic", "dataclass")


def instructions(n: int, only: str) -> int:
    """Instructions (valgrind's ``Ir``) of a process handling ``n`` messages of ``only``."""
    import re
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tool = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out"]
        this = [sys.executable, __file__, "--only", only, "--n", str(n), "--rounds", "1"]
        out = subprocess.run(
            [*tool, *this, "--json"], check=True, capture_output=True, text=True, cwd=ROOT
        ).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{out[-2000:]}")
    return int(found.group(1))


def count(n: int) -> int:
    """Instructions per message of each kind, start-up subtracted (one run at a time:
    counts do not move with other load on the machine, times do)."""
    start = instructions(0, "untyped")  # every kind's set-up is made in every run
    per = {kind: (instructions(n, kind) - start) / n for kind in KINDS}
    print(f"instructions per message (callgrind, {n:,} messages less start-up)")
    for kind, value in per.items():
        above = "" if kind == "untyped" else f"{value - per['untyped']:+12,.0f}"
        print(f"{kind:<12}{value:>12,.0f}{above:>14}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="each kind's rounds, as JSON")
    parser.add_argument("--only", choices=KINDS, help="one kind alone (for --instructions)")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions (valgrind): slow"
    )
    args = parser.parse_args(argv)
    if args.instructions:
        return count(args.n)
    per = measure(args.n, args.rounds, args.only)
    if args.json:
        print(json.dumps(per))
        return 0
    base = statistics.median(per["untyped"])
    print(f"{len(json.dumps(EVENT))}-byte event, {args.n} messages x {args.rounds} rounds")
    print(f"{'receiver':<12}{'us/message':>12}{'above untyped':>16}")
    for kind, values in per.items():
        median = statistics.median(values)
        above = "" if kind == "untyped" else f"{(median - base) * 1e6:+.1f} us"
        print(f"{kind:<12}{median * 1e6:>12.1f}{above:>16}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
