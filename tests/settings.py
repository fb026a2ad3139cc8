"""Test settings: the demo project plus a test app whose receivers obey the message body."""

import os as _os

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES, INSTALLED_APPS, RMQ_RETRY, env

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

RMQ_RETRY = {
    **RMQ_RETRY,
    "PREFIX": env("RMQ_PREFIX", default="rmq_retry_test"),
    # A cluster's nodes, comma-separated (the cluster leg gives each consumer its own order).
    "BROKER_URLS": env.list("RMQ_URLS", default=[]),
    "RETRY": {
        "max_attempts": 3,
        "initial_delay": 0.1,
        "multiplier": 2.0,
        "max_delay": 1.0,
        "jitter": "none",
    },
    "HEARTBEAT": env.int("RMQ_HEARTBEAT", default=60),
    "SHUTDOWN_TIMEOUT": env.float("RMQ_SHUTDOWN_TIMEOUT", default=30),
    "DELIVERY_LIMIT": env.int("RMQ_DELIVERY_LIMIT", default=5),
    "OUTBOX_BATCH_SIZE": env.int("RMQ_OUTBOX_BATCH", default=2000),
    "QUEUE_TYPE": env("RMQ_QUEUE_TYPE", default="classic"),
    "POLICY_CACHE_SECONDS": 1,
    "ASYNC_CONCURRENCY": env.int("RMQ_ASYNC_CONCURRENCY", default=100),
    "ASYNC_ON_IO_LOOP": env.bool("RMQ_ASYNC_ON_IO_LOOP", default=False),
    # The default (False), as users run: tests/conftest.py's ``rmq`` fixture declares each
    # test's topology the way a deploy does (``rmq_consume --setup-only``). Tests whose
    # subject is declare-on-send set it themselves.
    "DECLARE_ON_SEND": env.bool("RMQ_DECLARE_ON_SEND", default=False),
}
# Someone to receive the failure-group alerts (check W003): mails stay in memory, in the
# consumer children too (no SMTP server in tests).
ADMINS = [("Tests", "tests@example.com")]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_rmq_retry": {"handlers": ["console"], "level": "INFO", "propagate": True}},
}

# One test database per pytest process, so parallel runs (tox envs, a developer's two
# terminals) never clobber each other; subprocesses get the name through DATABASE_URL.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["TEST"] = {"NAME": f"/tmp/rmq_retry_test_{_os.getpid()}.sqlite3"}
    # How long a connection waits for another's write lock (a test makes a child's short).
    DATABASES["default"]["OPTIONS"]["timeout"] = env.float("RMQ_TEST_SQLITE_TIMEOUT", default=20)
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_rmq_retry_{_os.getpid()}"}

# A consumer child can be started without time zones (the USE_TZ = False projects of #12).
USE_TZ = env.bool("RMQ_TEST_USE_TZ", default=True)

# Django tasks on our backend, with the tasks of tests.tasksproject (docs and tests of the
# backend): Django 6's django.tasks, or on Django 5.2 the django-tasks backport when it is
# installed (the oldest leg installs it); without either the tasks tests skip.
import importlib.util as _importlib_util  # noqa: E402

import django as _django  # noqa: E402

if _django.VERSION >= (6, 0) or _importlib_util.find_spec("django_tasks") is not None:
    _BACKPORT = [] if _django.VERSION >= (6, 0) else ["django_tasks"]
    INSTALLED_APPS = [*INSTALLED_APPS, *_BACKPORT, "tests.tasksproject"]
    TASKS = {
        "default": {
            "BACKEND": "django_rmq_retry.tasks.RabbitMQBackend",
            # One queue name: each adds a receiver per task (tests that list receivers
            # see 10 at most); the queue-name test declares a second one for itself.
            "QUEUES": ["default"],
            "OPTIONS": {"result_retention": 3600},
        },
    }
