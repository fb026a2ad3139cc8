"""Settings of the demo project. django-environ reads DATABASE_URL and RMQ_URL; SQLite and the
local broker are the defaults so the demo runs with no configuration."""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = env("DJANGO_SECRET_KEY", default="demo-only-not-secret")
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_rmq_retry",
    "testproject.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "testproject.wsgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'demo.sqlite3'}")}
# Consumers handle many messages per second: keep database connections between messages
# (close_old_connections() runs around each one, so a stale connection is still replaced).
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=300)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Consumers and the admin write concurrently: wait for locks instead of failing at once.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    DATABASES["default"]["TEST"] = {
        "NAME": env("SQLITE_TEST_NAME", default=str(BASE_DIR / "test.sqlite3"))
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

# Who gets the alerts on failure groups (django_rmq_retry.W003 warns when nobody would):
# in the demo, mail printed on the consumer's console.
ADMINS = [("Demo operator", "ops@example.com")]
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

RMQ_RETRY = {
    "BROKER_URL": env("RMQ_URL", default="amqp://guest:guest@127.0.0.1:5672/%2F"),
    "PREFIX": env("RMQ_PREFIX", default="rmq_retry"),
    "RETRY": {
        "max_attempts": 4,
        "initial_delay": 1.0,
        "multiplier": 2.0,
        "max_delay": 30.0,
        "jitter": "equal",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_rmq_retry": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "testproject": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
