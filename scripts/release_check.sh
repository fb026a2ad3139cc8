#!/usr/bin/env bash
# The release as a new user meets it, at both ends of the support matrix.
#
# Builds the sdist, then the wheel from the sdist (so a file the sdist forgot fails here),
# and checks that both carry LICENSE. Then, for Python 3.10 + Django 5.2 and for Python 3.13
# + the newest Django 6.x, in a new virtualenv with nothing but the wheel installed:
#   1. a new project (django-admin startproject, apps shop and billing) set up the way
#      README.md and docs/tutorial/first-consumer.md say, reading its broker URL from RMQ_URL
#      as docs/howto/permissions.md says;
#   2. three RabbitMQ users with exactly the permissions that page gives: setup (configure),
#      consumer (read + write), web (write only);
#   3. migrate; rmq_setup as setup; the web user sends orders 41 and 47; rmq_consume as the
#      consumer handles 41, retries 47 twice and parks it (the tutorial's receiver);
#   4. the receiver fixed, rmq_requeue as the consumer, and 47 handled;
#   5. the receiver renamed: rmq_setup and rmq_consume --list name the old queue as an
#      orphan, rmq_orphans --delete --force (setup user) removes it, and none is left.
# Every step's output is checked; the first that differs from the docs stops the run.
#
# Needs the system RabbitMQ (started if installed), rabbitmqctl (root or sudo), Python 3.10
# and 3.13 (pyenv, PATH, or installed with pyenv) and PyPI. Work files in a temporary
# directory, removed at the end; the users and the broker objects are removed too.
source "$(dirname "$0")/_common.sh"

ensure_rabbitmq
WORK="$(mktemp -d "${TMPDIR:-/tmp}/rmq-release.XXXXXX")"
# The run's own names: each project's PREFIX and RabbitMQ users start with it.
RUN="rel$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
PASSWORD="pw-$RUN"
BROKER="${RMQ_RELEASE_HOST:-127.0.0.1:5672}"
PREFIX=""  # the current project's
url() { echo "amqp://${PREFIX}_$1:$PASSWORD@$BROKER/%2F"; }
ctl() { as_root rabbitmqctl -q "$@"; }

cleanup() {
  local user
  if [ -x "$WORK/venv-3.10/bin/python" ]; then
    # Whatever is left under the run's prefixes (rabbitmqctl lists, the project's pika deletes).
    ctl list_queues name 2>/dev/null | grep "^$RUN" >"$WORK/queues" || true
    ctl list_exchanges name 2>/dev/null | grep "^$RUN" >"$WORK/exchanges" || true
    "$WORK/venv-3.10/bin/python" - "$WORK" <<'EOF' || true
import sys
import pika

work = sys.argv[1]
conn = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2F"))
ch = conn.channel()
for q in open(f"{work}/queues").read().split():
    ch.queue_delete(q)
for x in open(f"{work}/exchanges").read().split():
    ch.exchange_delete(x)
conn.close()
EOF
  fi
  ctl list_users 2>/dev/null | awk '{print $1}' | grep "^${RUN}" | while read -r user; do
    ctl delete_user "$user" </dev/null >/dev/null 2>&1 || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Output of a command, also shown, checked to contain each of the given lines (grep -E).
expect() {  # expect OUTPUT_FILE PATTERN...
  local out="$1" pattern
  shift
  sed 's/^/    | /' "$out"
  for pattern in "$@"; do
    grep -Eq -- "$pattern" "$out" || die "expected /$pattern/ in the output above"
  done
}

say "building the sdist, and the wheel from it"
"$PYTHON_BIN" -m venv "$WORK/build"
"$WORK/build/bin/python" -m pip install -q --upgrade pip build
"$WORK/build/bin/python" -m build -q --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 \
  || { cat "$WORK/build.log"; die "python -m build failed"; }
SDIST="$(ls "$WORK"/dist/*.tar.gz)"
WHEEL="$(ls "$WORK"/dist/*.whl)"
# (Listed to files first: grep -q stopping early would fail the pipe under pipefail.)
tar -tzf "$SDIST" >"$WORK/sdist.txt"
"$WORK/build/bin/python" -m zipfile -l "$WHEEL" >"$WORK/wheel.txt"
grep -q '/LICENSE$' "$WORK/sdist.txt" || die "LICENSE is not in $SDIST"
grep -q 'licenses/LICENSE' "$WORK/wheel.txt" || die "LICENSE is not in $WHEEL"
say "$(basename "$SDIST") and $(basename "$WHEEL"): LICENSE in both"

try_project() {  # try_project PYTHON_VERSION DJANGO_REQUIREMENT
  local version="$1" django="$2" dir venv project py out user P
  dir="$(python_dir "$version")" || return
  PREFIX="${RUN}p${version//./}"
  say "RabbitMQ users ${PREFIX}_{setup,consumer,web}, as docs/howto/permissions.md gives them"
  P="^${PREFIX}\\."
  for user in setup consumer web; do ctl add_user "${PREFIX}_$user" "$PASSWORD" >/dev/null; done
  ctl set_permissions -p / "${PREFIX}_setup" "$P" "$P" "$P"
  ctl set_permissions -p / "${PREFIX}_consumer" '^$' "$P" "$P"
  ctl set_permissions -p / "${PREFIX}_web" '^$' "$P" '^$'
  venv="$WORK/venv-$version"
  project="$WORK/project-$version"
  say "Python $version, $django: a new virtualenv with the wheel"
  "$dir/python$version" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$WHEEL" "$django"
  "$venv/bin/python" -c "import django, pika; print('    Django', django.get_version(), 'pika', pika.__version__)"
  mkdir -p "$project"
  cd "$project"
  "$venv/bin/django-admin" startproject mysite .
  py="$venv/bin/python"
  "$py" manage.py startapp shop
  "$py" manage.py startapp billing
  cat >>mysite/settings.py <<EOF

# django-rmq-retry, as README.md and docs/howto/permissions.md say
import os

INSTALLED_APPS += ["shop", "billing", "django_rmq_retry"]
RMQ_RETRY = {"BROKER_URL": os.environ["RMQ_URL"], "PREFIX": "$PREFIX"}
EOF
  cat >shop/events.py <<'EOF'
from django_rmq_retry import Topic

order_paid = Topic("shop.order.paid")
EOF
  cat >billing/receivers.py <<'EOF'
from django_rmq_retry import receiver

from shop.events import order_paid


@receiver(order_paid, retry={"max_attempts": 3, "initial_delay": 1.0, "jitter": "none"})
def send_invoice(message, **kwargs):
    order_id = message.body["order_id"]
    if order_id % 10 == 7:
        raise RuntimeError(f"the invoicing service refused order {order_id}")
    print(f"invoice sent for order {order_id} (attempt {message.attempt})")
EOF
  out="$WORK/out"
  manage() {  # manage USER ARGS...: manage.py as that RabbitMQ user, output in $out
    local user="$1"
    shift
    RMQ_URL="$(url "$user")" "$py" manage.py "$@" >"$out" 2>&1 || { cat "$out"; return 1; }
  }

  say "migrate, then rmq_setup as the setup user"
  RMQ_URL="$(url web)" "$py" manage.py migrate -v 0
  manage setup rmq_setup
  expect "$out" "$PREFIX\.billing\.receivers\.send_invoice "

  say "the write-only web user sends orders 41 and 47"
  manage web shell -c "
from shop.events import order_paid
order_paid.send({'order_id': 41})
order_paid.send({'order_id': 47})
print('sent 2')"
  expect "$out" "^sent 2$"

  say "the read+write consumer: 41 handled, 47 retried twice and parked"
  manage consumer rmq_consume --max-messages 4 --max-idle-time 30
  expect "$out" "invoice sent for order 41 \(attempt 1\)" \
    "Stopped: 1 handled, 2 retried, 1 parked"
  manage web shell -c "
from django_rmq_retry.models import ParkedMessage
print([(bytes(r.body), r.reason, r.attempts) for r in ParkedMessage.objects.all()])"
  expect "$out" "^\[\(b'\{\"order_id\": ?47\}', 'exhausted', 3\)\]$"

  say "the receiver fixed, rmq_requeue as the consumer, 47 handled"
  sed -i 's/if order_id % 10 == 7:/if order_id % 10 == 9:/' billing/receivers.py
  manage consumer rmq_requeue --receiver billing.receivers.send_invoice
  expect "$out" "[Rr]equeued 1"
  manage consumer rmq_consume --max-messages 1 --max-idle-time 30
  expect "$out" "invoice sent for order 47 \(attempt 1\)" "Stopped: 1 handled"

  say "the receiver renamed: its old queue is reported, deleted only on request"
  sed -i 's/^def send_invoice(/def send_invoice_v2(/' billing/receivers.py
  manage setup rmq_setup
  expect "$out" "$PREFIX\.billing\.receivers\.send_invoice_v2" \
    "$PREFIX\.billing\.receivers\.send_invoice: .*billing\.receivers\.send_invoice"
  manage consumer rmq_consume --list
  expect "$out" "$PREFIX\.billing\.receivers\.send_invoice: .*billing\.receivers\.send_invoice"
  manage setup rmq_orphans --delete --force
  expect "$out" "deleted .*$PREFIX\.billing\.receivers\.send_invoice\b"
  manage setup rmq_orphans
  expect "$out" "^0 orphan|[Nn]o orphan"
  cd "$ROOT"
  say "Python $version, $django: as the docs say"
}

try_project 3.10 "Django>=5.2,<5.3"
try_project 3.13 "Django>=6.0,<7"
say "release check passed"
