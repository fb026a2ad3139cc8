"""Django settings for building the docs: the demo project's apps, no I/O at start-up.

autodoc imports our modules, the reference pages call our commands (``--help``,
``rmq_asyncapi``), and those need a configured Django; the demo shop's receivers give the
AsyncAPI page something to show.
"""

SECRET_KEY = "docs-only"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_rmq_retry",
    "testproject.shop",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
RMQ_RETRY = {"BROKER_URL": "amqp://app:secret@rabbit.example.com:5672/%2F", "PREFIX": "shop"}
