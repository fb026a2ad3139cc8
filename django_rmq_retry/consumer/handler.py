"""The worker side of the consumer: one delivery in, one action out.

No broker, no threads, no connection management: the loop (or the in-memory test broker)
hands a :class:`~.actions.Delivery` to :meth:`Handler.handle` and carries out the action it
returns. Every decision is the core's (``read_incoming``, ``triage``, ``decide``, ``route``);
this module only runs the receiver between them and describes what must happen next.
"""

from __future__ import annotations

import inspect
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from asgiref.sync import async_to_sync

from .. import hooks as _hooks
from ..conf import app_settings, quorum_native
from ..core import history
from ..core.backoff import Policy
from ..core.delays import DelayLevels, epoch_us, landing_wait, route
from ..core.envelope import MAX_ATTEMPT, Envelope, read_incoming, retry_properties
from ..core.failure import (
    Failure,
    error_summary,
    error_type_name,
)
from ..core.header_budget import too_large_detail
from ..core.logfields import current_message, fields, message_fields
from ..core.message import Message
from ..core.names import Names
from ..core.native_retry import attempt as native_attempt
from ..core.outcome import Park, ParkReason, RetryLater, Run, decide, triage
from ..core.undecodable import without_headers
from ..parking import operations
from ..registry import Receiver
from ..registry.policies import policy_cache
from .actions import (
    HANDLED,
    Ack,
    Action,
    Delivery,
    PublishRetry,
    RetryInPlace,
    StorePark,
    retried_kwargs,
)
from .delivery_limit import DeliveryLimit
from .gates import Arrival, Gate, Pipeline
from .inbox import message_key, run_once
from .native_retry import counted_by_queue, past_last_attempt, retry_in_place
from .parks import Encoded, Parks, receiver_for_queue
from .schema_gate import undecodable_as_invalid

logger = logging.getLogger("django_rmq_retry.consumer")


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Handler:
    """Turns deliveries into actions (see the module docstring).

    ``policy_for`` gives a receiver's effective retry policy (database row > code >
    settings by default); ``limits`` counts starts of redelivered messages (``None``: no
    delivery limit); ``clock`` and ``rng`` are the time and the jitter source;
    ``landing_ms`` is the last stretch of a retry delay the consumer holds (0: none; the
    in-memory broker's levels take no time, so it needs none).

    A retry copy is fitted to the frame limit of the connection that publishes it
    (``core.header_budget``) once the loop sets :attr:`frame_max` and gave ``encode`` (a
    copy's properties as the wire carries them: measured, then published as they are);
    without them copies are not measured (the in-memory broker has no frames).
    """

    def __init__(
        self,
        names: Names,
        levels: DelayLevels,
        *,
        limits: DeliveryLimit | None,
        policy_for: Callable[[Receiver], Policy] = policy_cache.for_receiver,
        clock: Callable[[], datetime] = _now,
        rng: random.Random | None = None,
        landing_ms: int = 0,
        encode: Callable[[Mapping[str, Any]], Encoded] | None = None,
        gates: Iterable[Gate] | None = None,
    ) -> None:
        self.names = names
        #: The publishing connection's frame limit (0: none known, copies are not fitted).
        self.frame_max = 0
        self.encode = encode
        self.levels = levels
        self.landing_ms = landing_ms
        self._due_header = names.header("due")
        self._due_us_header = names.header("due-us")
        self._operation_header = names.header(operations.HEADER)
        self._parked_id_header = names.header("parked-id")
        self.limits = limits
        self.policy_for = policy_for
        self.clock = clock
        self.rng = rng or random.Random()
        self.error_header_max = int(app_settings.ERROR_HEADER_MAX)
        #: The parking side: rows to park, copies fitted to their frame (``consumer.parks``).
        self.parks = Parks(names, clock)
        self._history_header = self.parks.history_header
        #: The checks before a receiver runs (``consumer.gates``; ``None``: ``GATES``).
        self.gates = Pipeline(names, levels, clock, landing_ms=landing_ms, gates=gates)
        #: Observability (``django_rmq_retry.hooks``); ``None`` when it is off.
        self.hooks = _hooks.current
        #: The quorum-native delay engine (``consumer.native_retry``): a failed attempt is
        #: given back to its quorum queue, which holds it; False: the delay levels hold it.
        self.native_retry = quorum_native()

    def wait_before(self, d: Delivery) -> float:
        """Seconds ``d`` must wait before its receiver runs: a retry copy that landed early.

        At most the landing plus one resolution unit (what ``route`` leaves to the consumer),
        whatever the due header says.
        """
        if self.landing_ms <= 0:
            return 0.0
        headers = d.properties.get("headers")
        if not headers:
            return 0.0
        due = headers.get(self._due_header)
        if due is None:
            return 0.0
        most = self.landing_ms + self.levels.resolution_ms
        return landing_wait(due, time.time() * 1000, most, headers.get(self._due_us_header))

    def prepare(self, d: Delivery) -> Action | Attempt:
        """Everything before the receiver runs: an action when it must not run (park it),
        else the :class:`Attempt` to run. ``handle`` is ``prepare``, :meth:`observe`, the
        receiver, ``conclude``, then :meth:`observed`; the async pool (``consumer.aio``)
        awaits the receiver in between.

        The observability hooks are not called here nor in ``conclude``: the async pool
        runs those two on database threads, each in a copy of the job's context, while the
        hooks must start and end an attempt in the one context the receiver runs in (a
        tracing span made current in one context cannot be detached in another)."""
        headers = d.properties.get("headers") or {}
        if d.receiver is None and d.queue == self.names.dead_queue:
            return self.parks.dead_letter(d, headers)
        env = read_incoming(headers, d.exchange, d.routing_key, self.names)
        rec = d.receiver
        if rec is None:  # the orphans queue: a retry whose receiver queue vanished
            target = env.target or "?"
            verdict = triage(env, d.body, d.properties, orphaned=True)
            assert isinstance(verdict, Park)
            return self.parks.park(
                replace(d, queue=target), receiver_for_queue(target, self.names), env, verdict
            )
        if self.native_retry:  # the queue counts the failed attempts given back to it
            env = replace(env, attempt=native_attempt(env.attempt, headers, MAX_ATTEMPT))
        if env.warning:
            logger.warning(
                "%s: message %s: %s",
                rec.name,
                d.properties.get("message_id"),
                env.warning,
                extra=fields(rec.name, d.queue, d.properties, env.attempt),
            )
        counted = self.native_retry and counted_by_queue(headers)
        start_key, over_limit = (
            self.limits.check(d, headers)
            if self.limits is not None and not counted and self.limits.applies(d, headers)
            else (None, None)
        )
        if counted:  # the queue's count bounds its give-backs: past the last attempt, park
            over_limit = past_last_attempt(env, self.policy_for(rec), headers)
        verdict = triage(env, d.body, d.properties, over_limit=over_limit)
        if isinstance(verdict, Park):
            if env.undecodable is not None:
                d = replace(d, properties=without_headers(d.properties))
            verdict = undecodable_as_invalid(verdict, rec, env)  # a typed receiver's: invalid
            return self.parks.park(d, rec.name, env, verdict, start_key=start_key)
        passed = self.gates.run(d, rec, env, verdict.body)
        if not isinstance(passed, Arrival):  # a gate parks, holds or gives it back
            return self.gates.action(passed, d, rec, env, start_key, self.parks.park)
        verdict = Run(verdict.body, passed.data)
        return Attempt(d, rec, env, self._message(d, rec, env, headers, verdict), start_key)

    def prepares_on_loop(self, d: Delivery) -> bool:
        """Whether :meth:`prepare` of ``d`` never touches the database, so an event loop may
        run it itself (the async pool then does, with no thread switch): a receiver's
        delivery the delivery limit does not count, with no gate that may use it."""
        rec = d.receiver
        headers = d.properties.get("headers") or {}
        if rec is None or (self.limits is not None and self.limits.applies(d, headers)):
            return False
        if self.native_retry and counted_by_queue(headers):  # reads its retry policy
            return False
        return not self.gates.uses_database(rec)

    def concludes_on_loop(self, step: Attempt, error: BaseException | None) -> bool:
        """As :meth:`prepares_on_loop`, for :meth:`conclude`: a receiver that returned (a
        failure reads its retry policy, maybe from the database), of a message no requeue
        operation waits for, with no gate that may use the database."""
        headers = step.delivery.properties.get("headers") or {}
        return (
            error is None
            and self._operation_header not in headers
            and not self.gates.uses_database(step.receiver)
        )

    def observe(self, step: Attempt) -> None:
        """The hooks' start of an attempt, in the context its receiver runs in, just before
        it runs."""
        if self.hooks is not None:
            step.token = self.hooks.attempt_started(step.message)
        step.started = time.perf_counter()

    def observed(self, step: Attempt, error: BaseException | None, action: Action) -> None:
        """The hooks' end of an attempt, in the context :meth:`observe` ran in."""
        if self.hooks is not None:
            self.hooks.attempt_ended(step.token, error, action)

    def handle(self, d: Delivery) -> Action:
        step = self.prepare(d)
        if not isinstance(step, Attempt):
            return step
        self.observe(step)
        running = current_message.set(step.message)  # the receiver's log lines name it
        try:
            error = self.attempt(step.receiver, step.message)
        finally:
            current_message.reset(running)
        action = self.conclude(step, error)
        self.observed(step, error, action)
        return action

    def conclude(self, step: Attempt, error: BaseException | None) -> Action:
        """What to do after the receiver ran (``prepare`` -> the receiver -> this)."""
        # The delivery-limit row (start_key) is deleted only once the delivery is settled:
        # a give-back between here and the ack (a refused retry copy, a lost channel) counts.
        action: Action
        start_key = step.start_key
        back = self.gates.after(step.delivery, step.receiver, error)
        if back is not None:  # e.g. a dependency's breaker that is open: nothing counted
            d, rec = step.delivery, step.receiver
            return self.gates.action(back, d, rec, step.env, start_key, self.parks.park)
        if error is not None:
            took_ms = (time.perf_counter() - step.started) * 1000 if step.started else 0.0
            action = self._after_failure(
                step.delivery, step.receiver, step.env, step.message, error, start_key, took_ms
            )
        else:
            headers = step.delivery.properties.get("headers") or {}
            if self._operation_header in headers:  # a copy a requeue operation waits for
                operations.report_handled(headers, self._operation_header, self._parked_id_header)
            action = Ack(start_key=start_key) if start_key is not None else HANDLED
        return action

    def attempt(self, rec: Receiver, message: Message) -> BaseException | None:
        """Run the receiver once; what it raised, if anything.

        The one place every receiver attempt goes through: per-attempt instrumentation
        (metrics, traces, an attempt history) belongs around this call, not in the loop.
        """
        topic = rec.topic_for(message.routing_key)
        try:
            if is_async(rec):  # the in-memory broker, or a pool without an event loop
                async_to_sync(rec.func)(message, receiver=rec, topic=topic)
            elif not rec.idempotent:
                rec.func(message, receiver=rec, topic=topic)
            elif not run_once(
                rec.name,
                message_key(message.message_id, message.routing_key, message.raw),
                lambda: rec.func(message, receiver=rec, topic=topic),
            ):
                logger.info(
                    "%s: message %s was handled before (its transaction committed): "
                    "acked without running the receiver again",
                    rec.name,
                    message.message_id,
                    extra=message_fields(message),
                )
        except BaseException as exc:  # sys.exit() in a receiver is a failure, not our exit
            return exc
        return None

    async def aattempt(self, rec: Receiver, message: Message) -> BaseException | None:
        """:meth:`attempt` of an ``async def`` receiver, awaited on the consumer's event
        loop (``consumer.aio``); never idempotent (the registry refuses it)."""
        topic = rec.topic_for(message.routing_key)
        current_message.set(message)  # this coroutine's own context: its log lines name it
        try:
            await rec.func(message, receiver=rec, topic=topic)
        except BaseException as exc:  # as attempt(): a failure, not our exit
            return exc
        return None

    def _message(
        self, d: Delivery, rec: Receiver, env: Envelope, headers: dict[str, Any], run: Run
    ) -> Message:
        return Message(
            body=run.body,
            raw=d.body,
            headers=dict(headers),
            routing_key=env.routing_key,
            exchange=env.exchange,
            queue=d.queue,
            receiver=rec.name,
            message_id=d.properties.get("message_id"),
            correlation_id=d.properties.get("correlation_id"),
            content_type=d.properties.get("content_type"),
            timestamp=_timestamp(d.properties.get("timestamp")),
            attempt=env.attempt,
            redelivered=d.redelivered,
            requeued=env.requeued,
            properties=d.properties,
            data=run.body if run.data is None else run.data,
        )

    def _after_failure(
        self,
        d: Delivery,
        rec: Receiver,
        env: Envelope,
        message: Message,
        exc: BaseException,
        start_key: str | None,
        took_ms: float = 0.0,
    ) -> PublishRetry | RetryInPlace | StorePark:
        policy = self.policy_for(rec)
        if self.native_retry:
            return retry_in_place(
                self.parks,
                policy,
                self.rng,
                self.error_header_max,
                d,
                rec,
                env,
                message,
                exc,
                start_key,
                took_ms,
            )
        decision = decide(
            env.attempt, exc, policy, max_delay=self.levels.max_delay_ms / 1000, rng=self.rng
        )
        if isinstance(decision, Park):
            return self.parks.park(
                d, rec.name, env, decision, exc=exc, start_key=start_key, took_ms=took_ms
            )
        assert isinstance(decision, RetryLater)
        now = self.clock()
        failure = Failure(error_type_name(exc), error_summary(exc, self.error_header_max), now)
        way = route(
            self.levels,
            self.names,
            decision.delay,
            epoch_us(now),
            landing_ms=self.landing_ms,
        )
        props = retry_properties(
            d.properties,
            names=self.names,
            attempt=decision.next_attempt,
            failure=failure,
            exchange=env.exchange,
            routing_key=env.routing_key,
            target_queue=d.queue,
            due_us=way.due_us,
            first_failure=env.first_failure,
        )
        props["headers"][self._history_header] = history.add(
            props["headers"].get(self._history_header),
            self.parks.attempt_record(env, exc, now, took_ms, way.delay_ms / 1000),
        )
        if self.hooks is not None:  # e.g. this attempt's trace context, for the next one
            self.hooks.retry_copy(props["headers"])
        fitted, wire = self.parks.fit_to_frame(props, self.frame_max, self.encode)
        if fitted is None:  # not even without our optional headers: park now, never loop
            needed = wire  # (then the bytes the copy would need)
            park = Park(ParkReason.NON_RETRYABLE, too_large_detail(self.frame_max, needed))
            return self.parks.park(d, rec.name, env, park, exc=exc, start_key=start_key)
        props = fitted
        log_line = (
            f"retry {rec.name} message {message.message_id} attempt "
            f"{decision.next_attempt}/{policy.max_attempts} in {way.delay_ms / 1000:.1f}s "
            f"after {failure.error_type}: {failure.error_message}"
        )
        return PublishRetry(
            wire=wire,
            exchange=way.exchange,
            routing_key=way.routing_key,
            body=d.body,
            properties=props,
            log_line=log_line,
            log_extra=message_fields(message),
            signal_kwargs=retried_kwargs(rec.name, message, env.attempt, way.delay_ms / 1000, exc),
            start_key=start_key,
        )

    def park_refused_copy(self, d: Delivery, why: str, start_key: str | None) -> StorePark:
        """The broker refuses ``d``'s retry copy for what it carries: park the original now
        (``Parks.refused_copy``; the consumer's settling side calls this)."""
        return self.parks.refused_copy(d, why, start_key)


@dataclass(slots=True)
class Attempt:
    """A delivery whose receiver is to run now (``Handler.prepare``)."""

    delivery: Delivery
    receiver: Receiver
    env: Envelope
    message: Message
    start_key: str | None
    token: Any = None  # the observability hooks' token of this attempt (``observe``)
    started: float = 0.0  # time.perf_counter() as the receiver was about to run


def is_async(rec: Receiver) -> bool:
    """Whether ``rec`` is an ``async def`` receiver (run on the event loop: ``aio``)."""
    return inspect.iscoroutinefunction(rec.func)


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            return None
    return None
