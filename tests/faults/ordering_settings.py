"""Test settings for the per-key order fault test: the ordered receiver's app."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.orderapp"]
