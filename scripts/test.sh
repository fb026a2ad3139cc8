#!/usr/bin/env bash
# Run the whole test suite: lint, migrations check, then pytest on SQLite and on PostgreSQL,
# against the real RabbitMQ. Starts what it needs; says what is missing otherwise.
# Extra arguments go to pytest (e.g. scripts/test.sh -k requeue).
source "$(dirname "$0")/_common.sh"
ensure_venv dev
ensure_debs
ensure_rabbitmq
PY="$VENV/bin/python"

say "ruff"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
say "layering (import-linter: layers, no cycles, pika only in broker/, a pure core)"
"$VENV/bin/lint-imports"
say "migrations are up to date"
DJANGO_SETTINGS_MODULE=tests.settings "$PY" -m django makemigrations --check --dry-run
DJANGO_SETTINGS_MODULE=tests.settings "$PY" -m django check --fail-level WARNING

say "mypy"
"$VENV/bin/mypy" django_rmq_retry

# Two runs keep the suite well under 15 minutes on 2 cores: every test but the fault
# injection on SQLite (the browser test included), then every test but the browser one on
# PostgreSQL (the fault-injection suite included: its database-down scenario needs it).
say "pytest on SQLite"
"$PY" -m pytest -m "not faults" "$@"

if ensure_postgres; then
  say "pytest on PostgreSQL (with the fault-injection suite)"
  DATABASE_URL="${PG_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}" "$PY" -m pytest -m "not browser" "$@"
elif [ -n "${CI:-}" ]; then
  die "PostgreSQL is not reachable on 127.0.0.1:5432 (CI needs it: apt-get install postgresql)"
else
  say "PostgreSQL not available: skipped the PostgreSQL run (install postgresql to run it)"
fi
