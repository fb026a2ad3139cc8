"""Test settings for the dependency outage: the breaker app's receivers, and a "payments"
dependency with short windows from the environment (an outage of seconds, not minutes)."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, RMQ_RETRY, env

INSTALLED_APPS = [*INSTALLED_APPS, "tests.breakerapp"]
PAYMENTS = {
    "EXCEPTIONS": ["builtins.ConnectionError"],
    "TRIP_FAILURES": env.int("RMQ_TRIP_FAILURES", default=3),
    "TRIP_WINDOW": env.float("RMQ_TRIP_WINDOW", default=10),
    "PROBE_AFTER": env.float("RMQ_PROBE_AFTER", default=5),
    "PROBE_BACKOFF_MAX": env.float("RMQ_PROBE_BACKOFF_MAX", default=5),
    "REPLAY_PARKED": True,
}
RMQ_RETRY = {**RMQ_RETRY, "DEPENDENCIES": {"payments": PAYMENTS}}
