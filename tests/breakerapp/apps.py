from django.apps import AppConfig


class BreakerAppConfig(AppConfig):
    name = "tests.breakerapp"
    label = "tests_breakerapp"
