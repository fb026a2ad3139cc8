"""Setting up Django tasks on our backend: which task API is used, and what a project on
Django 5.2 without the django-tasks backport is told (a check, never a traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import django
import pytest
from django.apps import apps
from django.test import override_settings

from django_rmq_retry.registry import task_api

OURS = {"default": {"BACKEND": "django_rmq_retry.tasks.RabbitMQBackend"}}
ROOT = Path(__file__).resolve().parent.parent


def test_no_check_message_without_our_backend():
    with override_settings(TASKS={"default": {"BACKEND": "x.Other"}}):
        assert task_api.check_task_api() == []


def test_missing_api_is_an_error_that_names_the_install(monkeypatch):
    monkeypatch.setattr(task_api, "task_api_module", lambda: None)
    with override_settings(TASKS=OURS):
        (error,) = task_api.check_task_api()
    assert error.id == "django_rmq_retry.E040"
    assert "pip install django-tasks" in error.msg and "INSTALLED_APPS" in error.msg


def test_backport_outside_installed_apps_is_an_error(monkeypatch):
    monkeypatch.setattr(task_api, "task_api_module", lambda: task_api.BACKPORT)
    with override_settings(TASKS=OURS):
        found = task_api.check_task_api()
    if apps.is_installed("django_tasks"):
        assert found == []
    else:
        assert [e.id for e in found] == ["django_rmq_retry.E041"]


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="Django 6 has django.tasks")
def test_without_the_backport_manage_py_says_what_to_install(tmp_path):
    """TASKS names our backend and an installed app has a tasks.py written for the
    backport, which is not installed (hidden here): ``check`` fails with E040 and the pip
    command, no traceback; importing the backend raises ImproperlyConfigured saying it."""
    (tmp_path / "no_backport_settings.py").write_text(
        textwrap.dedent(
            """
            from tests.settings import *  # noqa: F403
            from tests.settings import INSTALLED_APPS

            INSTALLED_APPS = [
                *[a for a in INSTALLED_APPS if a not in ("django_tasks", "tests.tasksproject")],
                "tests.tasksproject",
            ]
            TASKS = {"default": {"BACKEND": "django_rmq_retry.tasks.RabbitMQBackend"}}
            """
        )
    )
    hide = "import sys; sys.modules['django_tasks'] = None; "
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "no_backport_settings",
    }
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            hide + "from django.core.management import execute_from_command_line; "
            "execute_from_command_line(['manage.py', 'check'])",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 1, check.stdout + check.stderr
    assert "django_rmq_retry.E040" in check.stderr
    assert "pip install django-tasks" in check.stderr
    assert "Traceback" not in check.stderr
    backend = subprocess.run(
        [
            sys.executable,
            "-c",
            hide + "import django; django.setup()\n"
            "from django.core.exceptions import ImproperlyConfigured\n"
            "try:\n    import django_rmq_retry.tasks\n"
            "except ImproperlyConfigured as exc:\n    print('ImproperlyConfigured:', exc)",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert backend.returncode == 0, backend.stderr
    assert backend.stdout.startswith("ImproperlyConfigured: ")
    assert "pip install django-tasks" in backend.stdout
