"""Test settings plus the operator story's app (a receiver the operator can fix)."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.story"]
