from django.apps import AppConfig


class OrderAppConfig(AppConfig):
    name = "tests.orderapp"
    label = "tests_orderapp"
