"""The first gate (``consumer.gates``): a typed receiver's body validated into its schema.

A receiver with a schema (its own, ``@receiver(..., schema=)``, else its topic's) gets the
body as an instance of it (``message.data``). Before validation, a body of an older
``schema_version`` is upcast to the topic's (``schemas.upcasting``). A body that does not
fit is parked at once, reason *invalid*, its failing fields on the row: before the
receiver runs, before any transaction, at its first delivery, never retried, and never
counted as a failure of anything (a dependency's breaker comes after this gate).
"""

from __future__ import annotations

from ..core.envelope import Envelope
from ..core.errors import ValidationError
from ..core.gate_outcome import GateOutcome, Proceed
from ..core.outcome import Park, ParkReason
from ..registry import Receiver
from ..schemas import Plan, plan_for, schema_of
from .gates import Arrival, GateContext


class SchemaGate:
    """Validates the body of a receiver that has a schema (nothing to say otherwise).

    What to validate with is worked out once per receiver and routing key (a
    :class:`~django_rmq_retry.schemas.Plan`, or ``None`` for an untyped receiver): per
    message, one dictionary lookup, then the library's validation.
    """

    def __init__(self, context: GateContext) -> None:
        self.context = context
        self._plans: dict[tuple[int, str], tuple[Receiver, Plan | None]] = {}

    def uses_database(self, rec: Receiver) -> bool:
        """A schema's validators are user code and may (``gates``); an untyped receiver's
        deliveries, never."""
        return any(plan_for(rec, key) is not None for key in rec.routing_keys)

    def check(self, arrival: Arrival) -> GateOutcome | None:
        rec, routing_key = arrival.receiver, arrival.envelope.routing_key
        known = self._plans.get((id(rec), routing_key))
        if known is None or known[0] is not rec:  # (a receiver registered again: anew)
            known = self._plans[(id(rec), routing_key)] = (rec, plan_for(rec, routing_key))
        plan = known[1]
        if plan is None:  # most receivers: nothing to say
            return None
        try:
            data = plan.validate(arrival.delivery.properties.get("headers"), arrival.body)
        except ValidationError as exc:
            return Park(ParkReason.INVALID, str(exc), field_errors=exc.errors)
        return Proceed(data)


def undecodable_as_invalid(verdict: Park, rec: Receiver, env: Envelope) -> Park:
    """A typed receiver's body that does not even decode (not JSON) is *invalid* too, the
    decoder's complaint as its field error; an untyped receiver's stays *undecodable*, and
    so does a header table nobody could read."""
    if verdict.reason is not ParkReason.UNDECODABLE or env.undecodable is not None:
        return verdict
    schema = schema_of(rec, env.routing_key)
    if schema is None:
        return verdict
    errors = [{"loc": [], "msg": verdict.detail}]
    return Park(ParkReason.INVALID, str(ValidationError(errors, schema.__name__)), errors)
