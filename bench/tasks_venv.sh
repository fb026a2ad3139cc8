#!/usr/bin/env bash
# The second venv of the `tasks` scenario (bench/tasks.py): django-ox and django-tasks-celery
# need Python >= 3.12 and (the Celery bridge) Django 6, so they run from bench/.venv-tasks,
# made here from the newest pyenv Python >= 3.12 (or TASKS_PYTHON), with this package installed
# beside them: ours runs there too, as the control row those two are compared with.
# Idempotent: re-run to update.
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv-tasks
PY=${TASKS_PYTHON:-$(pyenv root)/versions/$(pyenv versions --bare | grep -E '^3\.1[2-9]' | sort -V | tail -1)/bin/python}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
echo '*' > "$VENV/.gitignore"
"$VENV/bin/python" -m pip install -q --upgrade pip
# The versions the bench/README.md table was measured with.
"$VENV/bin/python" -m pip install -q \
    "django>=6.0,<6.1" "django-tasks-db==0.13.0" "django-ox==1.9.1" \
    "django-tasks-celery[celery]==0.1.1" "sqlalchemy>=2" "psycopg[binary]>=3.2" "django-environ" \
    -e ..
"$VENV/bin/python" -c "import django, django_ox, django_tasks_celery, celery; print('bench/.venv-tasks: Django', django.__version__, '· Celery', celery.__version__)"
