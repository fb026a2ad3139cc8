from django.apps import AppConfig


class DbAppConfig(AppConfig):
    name = "tests.faults.dbapp"
    label = "faults_dbapp"
