from django.apps import AppConfig


class AdvAppConfig(AppConfig):
    name = "tests.adversarial.advapp"
    label = "adversarial_advapp"

    def ready(self) -> None:
        from .receivers import register

        register()
