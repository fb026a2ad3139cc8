"""Settings of the ``tasks`` scenario (``bench/tasks.py``): one small project whose ``TASKS``
backend is the one ``BENCH_TASKS_BACKEND`` names, so every backend runs the same tasks
(``bench/tasksapp/tasks.py``) on its own PostgreSQL database (``DATABASE_URL``).

``ours``: ``django_rmq_retry.tasks.RabbitMQBackend`` (queues under ``RMQ_PREFIX``);
``db``: django-tasks-db; ``ox``: django-ox; ``celery``: django-tasks-celery, with Celery on
our broker and its results in the same PostgreSQL database through Celery's own database
result backend (SQLAlchemy): the bridge's ``get_result`` cannot read django-celery-results'
rows (it stores a task's kwargs as text, which the bridge passes to ``dict()``). Each
backend that retries gives a failed attempt one retry after 1 s.
"""

from __future__ import annotations

import django
import environ

env = environ.Env()
BACKEND = env("BENCH_TASKS_BACKEND", default="ours")
PREFIX = env("RMQ_PREFIX", default="rmq_bench")
BROKER_URL = env("RMQ_URL", default="amqp://guest:guest@127.0.0.1:5672/%2F")

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "bench.tasks_settings"
urlpatterns: list[object] = []

# Persistent connections for every backend (each worker keeps its connection between tasks).
DATABASES = {"default": env.db("DATABASE_URL")}
DATABASES["default"]["CONN_MAX_AGE"] = 300
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

# Django 5.2 runs the django-tasks backport (its app installed), Django 6 its own django.tasks.
_BACKPORT = ["django_tasks"] if django.VERSION < (6, 0) else []
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    *_BACKPORT,
    {
        "ours": "django_rmq_retry",
        "db": "django_tasks_db",
        "ox": "django_ox",
    }.get(BACKEND, "django.contrib.sessions"),
    "bench.tasksapp",
]

RETRY_DELAY = 1.0
if BACKEND == "ours":
    TASKS = {
        "default": {
            "BACKEND": "django_rmq_retry.tasks.RabbitMQBackend",
            "OPTIONS": {
                "retry": {"max_attempts": 3, "initial_delay": RETRY_DELAY, "jitter": "none"}
            },
        }
    }
    # Alerts off: no operator to mail in a benchmark.
    RMQ_RETRY = {
        "BROKER_URL": BROKER_URL,
        "PREFIX": PREFIX,
        "PREFETCH": 20,
        "ALERT_CHECK_SECONDS": 0,
    }
elif BACKEND == "db":
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
elif BACKEND == "ox":
    TASKS = {
        "default": {
            "BACKEND": "django_ox.backend.OxBackend",
            "OPTIONS": {
                "MAX_ATTEMPTS": 3,
                "BACKOFF_INITIAL": RETRY_DELAY,
                "BACKOFF_MAX": RETRY_DELAY,
            },
        }
    }
elif BACKEND == "celery":
    TASKS = {
        "default": {
            "BACKEND": "django_tasks_celery.CeleryBackend",
            "OPTIONS": {"CELERY_APP": "bench.tasksapp.celery_app.app"},
        }
    }
    CELERY_BROKER_URL = BROKER_URL
    CELERY_RESULT_BACKEND = "db+" + env.str("DATABASE_URL").replace(
        "postgres://", "postgresql+psycopg://", 1
    )
    CELERY_RESULT_EXTENDED = True
    CELERY_TASK_DEFAULT_QUEUE = f"{PREFIX}.tasks.celery"
    CELERY_IMPORTS = ["bench.tasksapp.tasks"]
    CELERY_WORKER_HIJACK_ROOT_LOGGER = False
    # No remote control: its exchanges are not the run's to clean up, and not on the path.
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
else:
    raise ValueError(f"BENCH_TASKS_BACKEND: unknown backend {BACKEND!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    # Django's task signals log a line per task at INFO: not in a benchmark of any backend.
    "loggers": {"django": {"level": "WARNING"}},
}
