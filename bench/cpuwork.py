"""The CPU-bound receiver work of the scaling benchmark, shared by ours and the raw twin.

Pure Python, so it holds the GIL: threads cannot run two of these at once, processes can.
That is the case ``rmq_consume --processes`` exists for; a no-op receiver measures the
broker instead (on 2 cores RabbitMQ itself takes most of one).
"""

from __future__ import annotations

#: Loop length: about 0.5 ms of one core on the machine the README's table comes from.
ROUNDS = 10_000


def burn(rounds: int = ROUNDS) -> int:
    total = 0
    for i in range(rounds):
        total += i * i % 7
    return total
