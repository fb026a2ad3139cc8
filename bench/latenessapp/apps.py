from django.apps import AppConfig


class LatenessAppConfig(AppConfig):
    name = "bench.latenessapp"
    label = "benchlateness"
