from django.apps import AppConfig


class StoryAppConfig(AppConfig):
    name = "tests.story"
    label = "tests_story"
