#!/usr/bin/env bash
# The demo, end to end on SQLite: install the package and Django (nothing else the demo does
# not run), migrate, start RabbitMQ if needed, publish demo orders, run the consumer until
# it is idle. Orders ending in 7 retry with growing delays and end up parked; the admin
# (admin / admin) shows them and can requeue them. In a terminal it ends by serving the
# admin (DEMO_SERVE=0: it prints the commands instead); DEMO_PORT picks the port (8000).
source "$(dirname "$0")/_common.sh"
ensure_venv demo
ensure_rabbitmq
PY="$VENV/bin/python"
PORT="${DEMO_PORT:-8000}"
export DJANGO_SETTINGS_MODULE=testproject.settings

say "migrating the demo database (SQLite: testproject/../demo.sqlite3)"
"$PY" manage.py migrate -v0
"$PY" manage.py shell -v 0 -c "
from django.contrib.auth import get_user_model
U = get_user_model()
U.objects.filter(username='admin').exists() or U.objects.create_superuser('admin', 'admin@example.com', 'admin')
"
"$PY" manage.py rmq_consume --list
say "publishing ${DEMO_COUNT:-20} demo orders"
"$PY" manage.py publish_demo --count "${DEMO_COUNT:-20}"
say "consuming until idle for 12 s (watch retries grow: 1 s, 2 s, 4 s, then parking)"
"$PY" manage.py rmq_consume --max-idle-time 12
"$PY" manage.py shell -v 0 -c "
import json
from django_rmq_retry.models import ParkedMessage
from testproject.shop.models import Invoice
print(f'invoices written: {Invoice.objects.count()}')
for p in ParkedMessage.objects.filter(status='parked'):
    order = json.loads(bytes(p.body))['order_id']
    print(f'parked #{p.pk}: {p.receiver}, order {order}, after {p.attempts} attempts: {p.error_message}')
"
URL="http://127.0.0.1:$PORT/admin/django_rmq_retry/parkedmessage/"
if [ -t 0 ] && [ -t 1 ] && [ "${DEMO_SERVE:-1}" != 0 ]; then
  say "the parked messages in the admin: $URL  (user admin, password admin; Ctrl-C stops the server)"
  exec "$PY" manage.py runserver "127.0.0.1:$PORT"
fi
say "done. To see the parked messages in the admin (user admin, password admin), run:"
printf '  cd %q && %q manage.py runserver 127.0.0.1:%s\n' "$ROOT" "$PY" "$PORT"
printf '  then open %s\n' "$URL"
say "requeue them from the admin or with: $PY manage.py rmq_requeue"
