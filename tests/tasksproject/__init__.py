"""A Django 6 app with ``django.tasks`` tasks on ``RabbitMQBackend`` (``tests.settings``
declares ``TASKS`` and installs it when Django 6 is present)."""
