"""Test settings for children that step background operations, with a short lease and
outcome timeout from the environment (a takeover within seconds, not half a minute)."""

from tests.settings import *  # noqa: F403
from tests.settings import RMQ_RETRY, env

RMQ_RETRY = {
    **RMQ_RETRY,
    "OPERATION_LEASE_SECONDS": env.float("RMQ_OPERATION_LEASE", default=30),
    "OPERATION_OUTCOME_TIMEOUT": env.float("RMQ_OPERATION_OUTCOME_TIMEOUT", default=600),
    "BATCH_SIZE": env.int("RMQ_BATCH_SIZE", default=1000),
}
