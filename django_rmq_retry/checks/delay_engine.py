"""The system check of ``DELAY_ENGINE``: the quorum-native engine only where the broker can
give exactly what each receiver's policy asks for.

A quorum queue's delayed retry (``core.native_retry``) is linear, capped, one pair of values
per queue and without jitter; a policy it cannot reproduce would silently get other delays.
So "quorum-native" is refused unless the queues are quorum queues and every receiver's
policy (its own, else ``RETRY``) fits; an ordered receiver needs the cascade (a retry held
in its partition queue would let the key's later messages pass it). The broker's version
(4.3 or later) is ``rmq_doctor``'s to check: a check does no I/O.
"""

from __future__ import annotations

from ..conf import SETTING_NAME, app_settings, code_policy
from ..core.native_retry import ENGINES, MAX_ARG_MS, QUORUM_NATIVE, problems
from ..core.topology_plan import is_ordered
from .base import Messages, _err


def check_delay_engine() -> Messages:
    """``DELAY_ENGINE``'s value, then (quorum-native) the queue type and each receiver."""
    from ..registry import default_registry

    engine = app_settings.DELAY_ENGINE
    if engine not in ENGINES:
        return [
            _err(
                51,
                f"{SETTING_NAME}['DELAY_ENGINE'] is {engine!r}.",
                'Set "cascade" (the default) or "quorum-native" (RabbitMQ 4.3+ quorum queues).',
            )
        ]
    if engine != QUORUM_NATIVE:
        return []
    out: Messages = []
    if app_settings.QUEUE_TYPE != "quorum":
        out.append(
            _err(
                51,
                f'{SETTING_NAME}["DELAY_ENGINE"] is "quorum-native" but QUEUE_TYPE is '
                f"{app_settings.QUEUE_TYPE!r}: only quorum queues hold retries themselves.",
                'Set QUEUE_TYPE = "quorum" (new queues: drain and delete the old ones), or '
                'DELAY_ENGINE = "cascade".',
            )
        )
    for rec in default_registry.all():
        if is_ordered(rec):
            out.append(
                _err(
                    51,
                    f"Receiver {rec.name} keeps per-key order: the quorum-native engine would "
                    "hold its retries in a partition queue while later messages of the key "
                    "go on.",
                    'Use DELAY_ENGINE = "cascade" for projects with ordered receivers.',
                )
            )
            continue
        why = problems(code_policy(rec))
        if why:
            out.append(
                _err(
                    51,
                    f"Receiver {rec.name}'s retry policy cannot be held by its quorum queue "
                    f"(linear backoff, no jitter): {'; '.join(why)}.",
                    'Give it a policy with jitter "none" and multiplier 1 (a fixed delay), or '
                    f"at most two retries with multiplier 2, delays up to {MAX_ARG_MS // 1000} s; "
                    'or set DELAY_ENGINE = "cascade".',
                )
            )
    return out
