"""Test settings plus an app whose receiver needs the database (scenario 3)."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.faults.dbapp"]
