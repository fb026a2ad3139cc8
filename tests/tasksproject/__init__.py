"""An app with Django tasks on ``RabbitMQBackend`` (``tests.settings`` declares ``TASKS``
and installs it on Django 6, or on Django 5.2 with the django-tasks backport)."""
