"""Test settings plus the adversarial receivers (used by the suite's consumer subprocess)."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.adversarial.advapp"]
