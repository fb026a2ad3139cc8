"""The dependency breakers in the in-memory broker, on its virtual clock.

As ``rmq_consume`` does (``consumer.dependency_consumers``), a queue whose receiver depends
on a breaker that is open is not consumed; the watch claims the probe when it is due; and
when nothing else is ready, the virtual clock jumps to the next probe. A test trips a
breaker by making its receiver raise a listed exception, then closes it by letting the
probe succeed: ``broker.run_until_idle()`` goes through the whole outage in milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ..consumer import dependency_gate
from ..registry import Receiver


class MemoryBreakers:
    """The breakers the in-memory broker's receivers depend on."""

    def __init__(self, receivers: Iterable[Receiver]) -> None:
        self.needs = {r.name: r.depends_on for r in receivers if r.depends_on}
        self.names = list(dict.fromkeys(n for needs in self.needs.values() for n in needs))
        dependency_gate.forget()  # a copy of another test's rows must not leak in

    def tick(self, now: datetime) -> None:
        """Read the breakers, claim a due probe (each round of deliveries)."""
        if self.names:
            dependency_gate.watch().tick(self.names, now)

    def consumed(self, receiver: Receiver | None) -> bool:
        """Whether the queue of ``receiver`` is consumed now (not while its breaker is open)."""
        if receiver is None or receiver.name not in self.needs:
            return True
        return dependency_gate.watch().mode(self.needs[receiver.name]) != "off"

    def next_probe_ms(self) -> int | None:
        """When the next probe is due, in the virtual clock's ms (``None``: none open)."""
        due = dependency_gate.next_probe(self.names) if self.names else None
        return None if due is None else int(due.timestamp() * 1000) + 1
