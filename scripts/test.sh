#!/usr/bin/env bash
# Run the whole test suite: lint, migrations check, then the pytest legs:
#   oldest    every test but the fault injection, on SQLite, against the system RabbitMQ 3.10,
#             with Python 3.10, Django 5.2 and the oldest pika allowed (tox env "oldest")
#   newest    every test but the browser one, on PostgreSQL (fault injection included), with
#             Python 3.13, the newest Django 6.x and the newest pika (tox env "newest")
#   rabbit4   the broker-facing suites against RabbitMQ 4.0 (scripts/brokers.sh rabbit4),
#             with classic queues and again with quorum queues
#   rabbit43  what RabbitMQ 4.3 changes, against 4.3 (scripts/brokers.sh rabbit43), with
#             classic and with quorum queues, its node restarted last
#   cluster   the cluster scenarios on three RabbitMQ 3.10 nodes (scripts/brokers.sh cluster)
#   release   the sdist and wheel in two new projects, Python 3.10 + Django 5.2 and 3.13 + 6.x,
#             with least-privilege RabbitMQ users, as the docs say (scripts/release_check.sh)
#
# The legs run side by side, each part in a process of its own with its output in a log file
# (.test-logs/NAME.log), because most tests wait on a broker and the legs share nothing a
# test stops: each pytest process has its own test database (tests/settings.py names it after
# the process), every test its own broker prefix, each part its own pytest temporary
# directory, rabbit4 and cluster have brokers of their own, and the npm packages two legs
# use are fetched once before they start. What stops or reconfigures a shared service runs
# once its other users are done (see "The newest leg runs in six parts" below):
#   phase 1   checks (ruff, import layering, migrations, mypy), oldest and oldest-2, newest,
#             newest-2, newest-faults and newest-faults-2, rabbit4, rabbit4-2 and
#             rabbit4-quorum, rabbit43 and rabbit43-quorum, cluster, release
#   phase 2   rabbit4-node (the 4.0 node stopped or set node-wide) once rabbit4's other parts
#             are done, rabbit43-node (the 4.3 node restarted) once rabbit43's are, beside
#             what is left of phase 1; then newest-broker (the same for the system RabbitMQ)
#             once oldest's, newest's, rabbit4's other parts and release are
#   phase 3   newest-db (PostgreSQL stopped), alone
# The logs are printed at the end, then each part's time, pass/fail counts, fault tables.
#
# Starts what it needs; says what is missing otherwise. CI runs every leg; locally choose
# some with LEGS (e.g. LEGS="oldest newest" scripts/test.sh; one leg alone streams its output
# to the terminal). Extra arguments go to pytest (e.g. scripts/test.sh -k requeue).
source "$(dirname "$0")/_common.sh"
ALL_LEGS="oldest newest rabbit4 rabbit43 cluster release"
LEGS="${LEGS:-$ALL_LEGS}"
LEGS="${LEGS//sqlite/oldest}"  # the legs' names before the support matrix
LEGS="${LEGS//postgres/newest}"
for leg in $LEGS; do
  case " $ALL_LEGS " in *" $leg "*) ;; *) die "unknown leg '$leg' in LEGS ($ALL_LEGS)" ;; esac
done
[ -n "${CI:-}" ] && [ "$LEGS" != "$ALL_LEGS" ] && die "CI runs every leg; unset LEGS"
leg_on() { [[ " $LEGS " == *" $1 "* ]]; }
# The slowest tests of each pytest run are listed at its end: what to look at when CI nears
# its time limit.
export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} --durations=15"
# With pytest arguments of your own (-k, a path), a part they leave nothing to run passes.
[ $# -eq 0 ] || export RMQ_TESTS_NONE_OK=1

RUN_T0=$SECONDS
ensure_venv dev
"$VENV/bin/python" -m pip install -q --group tox
ensure_debs
ensure_rabbitmq
PY="$VENV/bin/python"

checks() {
  say "ruff"
  "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check . || return
  say "layering (import-linter: layers, no cycles, pika only in broker/, a pure core)"
  "$VENV/bin/lint-imports" || return
  say "migrations are up to date"
  DJANGO_SETTINGS_MODULE=tests.settings "$PY" -m django makemigrations --check --dry-run || return
  DJANGO_SETTINGS_MODULE=tests.settings "$PY" -m django check --fail-level WARNING || return
  say "mypy"
  "$VENV/bin/mypy" django_rmq_retry
}

PG_URL="${PG_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
need_postgres() {
  ensure_postgres && return 0
  [ -n "${CI:-}" ] && die "PostgreSQL is not reachable on 127.0.0.1:5432 (CI needs it: apt-get install postgresql)"
  return 1
}

# The support matrix's two ends, each in a venv of its own that tox builds from tox.ini (the
# matrix's one source of truth): the interpreters come from PATH or pyenv.
# Why the ordinary suite runs twice, once in each: a second database (the parked table's
# triggers, row locks and full-text search differ between SQLite and PostgreSQL) and the two
# ends of what the package claims (Python 3.10 / Django 5.2 with the django-tasks backport /
# oldest pika, and Python 3.13 / the newest Django and pika: so the Django tasks suite runs on
# the backport and on django.tasks).
# Everything else runs once: the browser tests on "oldest" only, the fault injection on
# "newest" only (its database-down scenario needs PostgreSQL), test_publish_many (publisher
# only, no database) on "newest" only.
tox_leg() {  # tox_leg ENV PYTHON_VERSION PYTEST_ARGS...
  local env="$1" version="$2" dir
  shift 2
  dir="$(python_dir "$version")" || return
  # The package is installed when the env is built, below, before the legs start.
  PATH="$dir:$PATH" "$VENV/bin/tox" run --workdir "$(tox_dir "$env")" -e "$env" \
    --skip-pkg-install -- "$@"
}
# Each env in a tox work directory of its own, so that the two are built side by side
# without sharing tox's packaging env.
tox_dir() { echo "$ROOT/.tox/$1"; }
# The ordinary suite of oldest and of newest runs in two halves side by side ("oldest" and
# "oldest-2", "newest" and "newest-2"): its tests mostly wait (consumers idling out, retry
# delays), so two processes finish it in about half the time. The halves are balanced by the
# seconds each file took in a recorded run (scripts/test-weights.txt; a new file weighs the
# median until the weights are recorded again: scripts/test_weights.py); the markers still
# choose the tests.
half() {  # half LEG 0|1 [EXCLUDED_FILE...]: LEG's half of the test files outside tests/faults
  local f files=()
  while IFS= read -r f; do
    [[ " ${*:3} " == *" $f "* ]] || files+=("$f")
  done < <(find tests -name 'test_*.py' -not -path 'tests/faults/*' -not -path '*/node_modules/*' \
    | LC_ALL=C sort)
  "$PY" "$ROOT/scripts/test_weights.py" split "$1" "$2" "${files[@]}"
}
# Test paths of the caller's (scripts/test.sh tests/test_x.py) replace the parts' own files:
# the first part of oldest and of newest runs them (all of newest's markers but browser and
# cluster), the other parts have nothing to do.
paths_given() {
  local a
  for a in "$@"; do [[ "$a" != -* && -e "${a%%::*}" ]] && return 0; done
  return 1
}
nothing_if_paths() {
  paths_given "$@" || return 1
  say "test paths given: the leg's first part runs them"
}
oldest_half() {
  local files=() n="$1"
  shift
  if paths_given "$@"; then
    [ "$n" = 0 ] || { nothing_if_paths "$@"; return 0; }
  else
    mapfile -t files < <(half oldest "$n" tests/test_publish_many.py)
  fi
  tox_leg oldest 3.10 -m "not faults and not cluster" "${files[@]}" "$@"
}
leg_oldest() { oldest_half 0 "$@"; }
leg_oldest_2() { oldest_half 1 "$@"; }
# The newest leg runs in six parts. Side by side with the other legs: "newest" and
# "newest-2" (the ordinary suite, in halves) and "newest-faults" and "newest-faults-2" (the
# fault injection that disturbs no one else: the consumers it kills are its own, rabbitmqctl
# touches only its own prefix's policies, users and queues or connections it opened, the TLS
# node is private).
# Then, once those, oldest's and rabbit4's parts are done, "newest-broker": what stops the system
# RabbitMQ (test_broker_faults, the relay's broker restart) or sets it node-wide (a memory
# alarm that blocks every publisher, a 1 s consumer_timeout that closes every slow consumer's
# channel: test_adversary_broker, the adversarial broker events). Last, alone: "newest-db",
# which stops PostgreSQL, which every leg but oldest uses (test_database_down).
NEWEST_BROKER=(tests/faults/test_broker_faults.py tests/faults/test_adversary_broker.py
  tests/adversarial/test_adversarial.py::test_adversarial_broker_events
  tests/faults/test_exactly_once.py::test_broker_restart_while_the_relay_works_loses_nothing)
NEWEST_DB=(tests/faults/test_database_down.py)
not_these() {  # pytest options that leave the given files and tests out
  local t
  for t in "$@"; do
    case "$t" in *::*) echo "--deselect=$t" ;; *) echo "--ignore=$t" ;; esac
  done
}
# The broker-facing suites run against RabbitMQ 4.0 and 4.3 on PostgreSQL (below) and against
# 3.10 in oldest: newest's ordinary parts leave them out. What they exercise is how a broker
# version behaves, not Python, Django or the database; each still runs on 3.10 (oldest), on
# PostgreSQL (the 4.x legs) and with the newest pika (the 4.x legs use the dev environment's).
NEWEST_ELSEWHERE=(tests/test_retries.py tests/test_landing.py tests/test_broker_edges.py
  tests/test_failover.py tests/contract/test_contract.py tests/test_publish_refusals.py
  tests/test_retry_copy_refusals.py tests/test_frame_budget.py tests/test_prefetch_bound.py
  tests/test_broker_url.py tests/test_permissions.py tests/test_adversary_consumer.py
  tests/test_doctor.py tests/adversarial/test_adversarial.py tests/test_parking.py
  tests/test_happy_path.py tests/test_quorum_topology.py)
newest() { DATABASE_URL="$PG_URL" tox_leg newest 3.13 "$@"; }
newest_half() {
  local files=() n="$1"
  shift
  if paths_given "$@"; then
    [ "$n" = 0 ] || { nothing_if_paths "$@"; return 0; }
    newest -m "not browser and not cluster" "$@"
    return
  fi
  mapfile -t files < <(half newest "$n" "${NEWEST_ELSEWHERE[@]}")
  newest -m "not browser and not cluster and not faults" "${files[@]}" "$@"
}
leg_newest() { newest_half 0 "$@"; }
leg_newest_2() { newest_half 1 "$@"; }
# The fault injection in two parts side by side ("newest-faults", "newest-faults-2"): its
# scenarios mostly wait (for kills, restarts, settling), so one part alone was the longest
# of the run. The first takes these files; the second every other fault test.
NEWEST_FAULTS_1=(tests/faults/test_exactly_once.py tests/faults/test_quorum_limits.py
  tests/faults/test_operations_killed.py tests/faults/test_security.py
  tests/faults/test_operations_stall.py tests/faults/test_bad_input.py)
newest_faults() {  # newest_faults 0|1 PYTEST_ARGS...
  local skip files=() n="$1"
  shift
  nothing_if_paths "$@" && return 0
  mapfile -t skip < <(not_these "${NEWEST_BROKER[@]}" "${NEWEST_DB[@]}")
  if [ "$n" = 0 ]; then
    files=("${NEWEST_FAULTS_1[@]}")
  else
    mapfile -t -O "${#skip[@]}" skip < <(not_these "${NEWEST_FAULTS_1[@]}")
  fi
  newest -m "faults and not cluster" "${skip[@]}" "${files[@]}" "$@"
}
leg_newest_faults() { newest_faults 0 "$@"; }
leg_newest_faults_2() { newest_faults 1 "$@"; }
leg_newest_broker() {
  nothing_if_paths "$@" && return 0
  newest -m "not cluster" "${NEWEST_BROKER[@]}" "$@"
}
leg_newest_db() {
  nothing_if_paths "$@" && return 0
  newest -m "not cluster" "${NEWEST_DB[@]}" "$@"
}

# RabbitMQ 4.0: what differs by broker version is how queues, dead-lettering, delivery
# limits and connection faults behave, so the suites that exercise those run here. Left to
# the 3.10 legs to keep CI within its time: the SIGKILL scenarios with classic queues (they
# run here with quorum queues), the exactly-once scenarios (their broker restart runs here with
# quorum queues), test_security (its TLS test runs a private 3.10 node), the adversarial
# suites with quorum queues (they run with classic ones), and the outbox and
# idempotent-receiver suites (test_outbox, test_outbox_order), the parking suite and
# test_adversary_rows, and the database-down scenario (what they test is the database's side;
# the broker only publishes and delivers; the parking suite runs again in the quorum pass);
# what a consumer does with the bytes and the deliveries it is given, alike on every version
# (test_happy_path, test_adversary_decoding, the async receivers SIGKILLed), and how our
# publishers batch and confirm (test_publish_many, test_publish_batches: the refusals, which
# do differ, stay). test_quorum_limits runs in
# the quorum pass only (its poison and give-back tests declare quorum queues in either pass).
# The quorum SIGKILL scenarios (test_consumer_killed) run on 4.3's quorum pass, not here too.
# The broker-restart scenario runs here with quorum queues only: classic queues dead-letter
# at-most-once inside RabbitMQ, and on 4.0 a retry copy the broker had confirmed vanished in
# the delay-level hop that was due as the broker shut down (1 of 750 pairs, in one of our
# few 4.0 runs; README "What is not promised"). With quorum queues the hop is at-least-once.
# Also here, on both queue types where queues are involved: how the broker refuses one
# message (channel and connection close codes, frame and message size limits), the window it
# keeps per consumer, the heartbeat it negotiates and the permissions it checks, and the order
# and header bytes it delivers.
# The classic pass runs in two parts side by side (see "The 4.0 leg runs in parts" below):
# they take its files in turn, in this order (the slowest few first, so each part gets some).
R4_CLASSIC=(tests/faults/test_process_faults.py tests/adversarial
  tests/test_headers_bit_for_bit.py tests/faults/test_bad_input.py tests/test_retries.py
  tests/test_landing.py tests/test_broker_edges.py tests/test_failover.py tests/contract
  tests/test_publish_refusals.py tests/test_retry_copy_refusals.py tests/test_frame_budget.py
  tests/test_prefetch_bound.py tests/test_broker_url.py
  tests/test_permissions.py tests/test_adversary_consumer.py tests/test_doctor.py)
R4_QUORUM=(tests/test_retries.py tests/test_landing.py tests/test_parking.py tests/test_broker_edges.py
  tests/test_happy_path.py tests/test_quorum_topology.py tests/faults/test_quorum_limits.py
  tests/test_prefetch_bound.py tests/test_retry_copy_refusals.py tests/test_frame_budget.py)
every_other() {  # every_other 0|1 ITEM...: the first, third... items (0) or the others (1)
  local i=0 item n="$1"
  shift
  for item in "$@"; do
    [ $((i % 2)) = "$n" ] && echo "$item"
    i=$((i + 1))
  done
  true
}
# The 4.0 leg runs in parts too: its node up first ("rabbit4-up"); then the classic pass in
# two parts ("rabbit4" and "rabbit4-2", R4_CLASSIC in turn) and the quorum pass
# ("rabbit4-quorum", R4_QUORUM) side by side, each without what stops the node or sets it
# node-wide (the broker stops and restarts, the memory alarm, the 1 s consumer_timeout); then
# those ("rabbit4-node": R4_NODE_CLASSIC, then R4_NODE_QUORUM). The classic pass in two parts
# lets rabbit4-node run beside the last of the 3.10 legs, not after them.
R4_NODE_CLASSIC=(tests/faults/test_broker_faults.py tests/faults/test_adversary_broker.py
  tests/adversarial/test_adversarial.py::test_adversarial_broker_events)
R4_NODE_QUORUM=(tests/faults/test_broker_faults.py
  tests/faults/test_exactly_once.py::test_broker_restart_while_the_relay_works_loses_nothing)
r4() (  # r4 PASS PYTEST_ARGS...: pytest against the 4.0 node; a subshell, so its RMQ_URL,
  local pass="$1" env  # RMQ_CTL (rabbitmqctl of the node in its root) and RMQ_LOG end with it
  shift
  env="$(bash scripts/brokers.sh rabbit4 env)" || return
  eval "$env"
  if [ "$pass" = quorum ]; then
    say "pytest against RabbitMQ 4.0, quorum queues (PostgreSQL)"
    export RMQ_QUEUE_TYPE=quorum FAULTS_KILL_MESSAGES=2500 FAULTS_KILLS=10
  else
    say "pytest against RabbitMQ 4.0, classic queues (PostgreSQL)"
  fi
  DATABASE_URL="$PG_URL" "$PY" -m pytest -m "not cluster" "$@"
)
leg_rabbit4_up() { bash scripts/brokers.sh rabbit4 up; }
r4_classic() {  # r4_classic 0|1 PYTEST_ARGS...: one part of the classic pass
  local files=() skip=() n="$1"
  shift
  if paths_given "$@"; then
    [ "$n" = 0 ] || { nothing_if_paths "$@"; return 0; }
  else
    mapfile -t files < <(every_other "$n" "${R4_CLASSIC[@]}")
  fi
  mapfile -t skip < <(not_these "${R4_NODE_CLASSIC[@]}")
  r4 classic "${files[@]}" "${skip[@]}" "$@"
}
leg_rabbit4() { r4_classic 0 "$@"; }
leg_rabbit4_2() { r4_classic 1 "$@"; }
leg_rabbit4_quorum() { r4 quorum "${R4_QUORUM[@]}" "$@"; }
leg_rabbit4_node() {
  local rc=0
  # test_broker_restart_mid_run runs with quorum queues only (see above).
  r4 classic "${R4_NODE_CLASSIC[@]}" \
    --deselect=tests/faults/test_broker_faults.py::test_broker_restart_mid_run "$@" || rc=$?
  r4 quorum "${R4_NODE_QUORUM[@]}" "$@" || rc=$?
  return "$rc"
}

# RabbitMQ 4.3: what it changes for a consumer library, not every suite a third time (the
# classic pass only what 4.3 refuses or cancels; retries and landing run in the quorum pass). The
# quorum consumer timeout (a basic.cancel, the message delivered again: test_consumer_timeout,
# marked rabbit43 and run here only), what counts toward a quorum queue's delivery limit
# (test_quorum_limits, the consumer SIGKILLed), dead-lettering of the retry cascade (retries,
# landing, parking), its quorum-native delayed retry (DELAY_ENGINE, the second delay engine),
# cancels and reconnects (test_broker_edges), what it refuses (publish and
# retry-copy refusals, the frame budget, permissions) and the doctor, then one node restart
# with quorum queues. Both passes side by side once the node is up ("rabbit43-up"), the
# restart after them ("rabbit43-node").
R43_CLASSIC=(tests/test_broker_edges.py tests/test_permissions.py
  tests/test_publish_refusals.py tests/test_retry_copy_refusals.py
  tests/test_frame_budget.py tests/test_doctor.py)
R43_QUORUM=(tests/faults/test_quorum_limits.py tests/test_retries.py tests/test_parking.py
  tests/test_landing.py tests/test_consumer_timeout.py tests/faults/test_consumer_killed.py
  tests/test_prefetch_bound.py tests/test_quorum_topology.py tests/test_doctor.py
  tests/test_quorum_native_broker.py)
R43_NODE_QUORUM=(tests/faults/test_broker_faults.py::test_broker_restart_mid_run)
r43() (  # r43 PASS PYTEST_ARGS...: pytest against the 4.3 node (as r4 does for 4.0)
  local pass="$1" env
  shift
  env="$(bash scripts/brokers.sh rabbit43 env)" || return
  eval "$env"
  export RMQ_RABBIT43=1  # its rabbit43-marked tests run here (tests/conftest.py)
  if [ "$pass" = quorum ]; then
    say "pytest against RabbitMQ 4.3, quorum queues (PostgreSQL)"
    export RMQ_QUEUE_TYPE=quorum FAULTS_KILL_MESSAGES=2500 FAULTS_KILLS=10
  else
    say "pytest against RabbitMQ 4.3, classic queues (PostgreSQL)"
  fi
  DATABASE_URL="$PG_URL" "$PY" -m pytest -m "not cluster" "$@"
)
leg_rabbit43_up() { bash scripts/brokers.sh rabbit43 up; }
r43_part() {  # r43_part PASS FILE... -- PYTEST_ARGS...: test paths of the caller's win
  local pass="$1" files=()
  shift
  while [ "$1" != -- ]; do files+=("$1"); shift; done
  shift
  if paths_given "$@"; then
    [ "$pass" = classic ] || { nothing_if_paths "$@"; return 0; }
    files=()
  fi
  r43 "$pass" "${files[@]}" "$@"
}
leg_rabbit43() { r43_part classic "${R43_CLASSIC[@]}" -- "$@"; }
leg_rabbit43_quorum() { r43_part quorum "${R43_QUORUM[@]}" -- "$@"; }
leg_rabbit43_node() { nothing_if_paths "$@" && return 0; r43 quorum "${R43_NODE_QUORUM[@]}" "$@"; }

# Three RabbitMQ 3.10 nodes of their own (the system node stays untouched), quorum queues.
leg_cluster() {
  bash scripts/brokers.sh cluster up || return
  local rc=0
  RMQ_URL="amqp://guest:guest@127.0.0.1:5701/%2F" RMQ_QUEUE_TYPE=quorum DATABASE_URL="$PG_URL" \
    "$PY" -m pytest -m cluster tests/faults/test_cluster.py "$@" || rc=$?
  # The doctor on a cluster: what it reads (version, permissions, arguments, orphans) is
  # asked of one node and must hold for the cluster.
  RMQ_URL="amqp://guest:guest@127.0.0.1:5701/%2F" RMQ_QUEUE_TYPE=quorum DATABASE_URL="$PG_URL" \
    RMQ_CTL="bash $ROOT/scripts/brokers.sh cluster ctl 1" \
    "$PY" -m pytest -m "not cluster" tests/test_doctor.py "$@" || rc=$?
  bash scripts/brokers.sh cluster down
  return "$rc"
}

# The package as a new user meets it: no pytest, so with pytest arguments (a path, -k) it
# has nothing to do.
leg_release() {
  [ $# -eq 0 ] || { say "pytest arguments given: nothing to do"; return 0; }
  bash scripts/release_check.sh
}

# --- Running the parts ----------------------------------------------------------------------
LOGS="${TEST_LOGS:-$ROOT/.test-logs}"
rm -rf "$LOGS"
mkdir -p "$LOGS"
PARTS=()     # in the order they started
declare -A PID=() STATUS=()
# Each part: a process of its own, output to $LOGS/NAME.log.
# With STREAM (one leg chosen, not in CI) the parts run one after the other, output to the
# terminal.
run_part() {  # run_part NAME FUNCTION ARGS...
  local name="$1" t0=$SECONDS rc=0
  shift
  # A JUnit report per part: its tests' seconds (scripts/test_weights.py record reads them).
  export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} --junitxml=$LOGS/$name.xml"
  if [ -n "$STREAM" ]; then "$@" || rc=$?; else "$@" >"$LOGS/$name.log" 2>&1 || rc=$?; fi
  times >"$LOGS/$name.times"  # in this shell: a subshell's "times" starts from zero
  echo "$rc $((SECONDS - t0)) $(cpu_seconds "$LOGS/$name.times")" >"$LOGS/$name.status"
}
# The CPU seconds (user + system) of what a part ran and waited for, from "times" (its second
# line): with every part side by side on a few cores, what a part costs the others (brokers
# it started as daemons excepted).
cpu_seconds() {
  awk 'function sec(t, m) { m = t; sub(/m.*/, "", m); sub(/^[0-9]+m/, "", t); sub(/s$/, "", t)
    return m * 60 + t } NR == 2 { printf "%d", sec($1) + sec($2) }' "$1"
}
start_part() {  # start_part NAME FUNCTION ARGS...
  PARTS+=("$1")
  if [ -n "$STREAM" ]; then
    say "$1"
    (run_part "$@") || true
    part_done "$1"
    return
  fi
  (run_part "$@") &
  PID[$1]=$!
  say "started: $1 (log: ${LOGS#"$ROOT/"}/$1.log)"
}
part_done() {
  local rc s cpu
  read -r rc s cpu <"$LOGS/$1.status" || { rc=1 s=0; }
  STATUS[$1]="$rc $s ${cpu:-0}"
  say "finished: $1 in $((s / 60))m$((s % 60))s$([ "$rc" = 0 ] || echo " (FAILED, exit $rc)")"
}
# A pytest log's last summary line ("== 12 passed, 1 skipped in 3.1s ==") for the summary.
counts() {
  grep -aE '^=+ .*\b(passed|failed|error|errors|skipped|deselected)\b.* in [0-9.]+s' "$1" \
    | sed -E 's/^=+ //; s/ =+$//' | paste -sd ';' -
}
summary() {
  local name rc s
  for name in "${PARTS[@]}"; do
    [ -n "$STREAM" ] && break
    printf '\n\033[1m======== %s: log %s ========\033[0m\n' "$name" "$LOGS/$name.log"
    cat "$LOGS/$name.log"
  done
  echo
  say "summary (whole run $(((SECONDS - RUN_T0) / 60))m$(((SECONDS - RUN_T0) % 60))s)"
  echo "  part            wall   CPU (user + system)"
  for name in "${PARTS[@]}"; do
    read -r rc s cpu <<<"${STATUS[$name]:-1 0 0}"
    cpu="${cpu:-0}"
    printf '  %-14s %3dm%02ds %3dm%02ds  %s  %s\n' "$name" $((s / 60)) $((s % 60)) \
      $((cpu / 60)) $((cpu % 60)) "$([ "$rc" = 0 ] && echo ok || echo "FAILED")" \
      "$(counts "$LOGS/$name.log" 2>/dev/null)"
  done
  # The count tables (lost must be 0), as each part's pytest printed them.
  local kind
  for name in "${PARTS[@]}"; do
    [ -f "$LOGS/$name.log" ] || continue
    for kind in fault-injection adversarial; do
      grep -aq "$kind count table" "$LOGS/$name.log" || continue
      echo "  $kind count table(s) of $name:"
      sed -n "/$kind count table/,/^=/p" "$LOGS/$name.log" | grep -a '^|' | sed 's/^/    /'
    done
  done
  # Last, so that a CI page showing only the output's tail still shows why: each failed
  # part's pytest short summary, or the end of its log when pytest did not get that far.
  local why
  for name in "${PARTS[@]}"; do
    read -r rc _ <<<"${STATUS[$name]:-1 0}"
    [ "$rc" = 0 ] && continue
    echo "  why $name failed:"
    why="$(grep -aE '^(FAILED|ERROR) ' "$LOGS/$name.log" 2>/dev/null | head -n 12 || true)"
    [ -n "$why" ] || why="$(tail -n 15 "$LOGS/$name.log" 2>/dev/null || true)"
    [ -n "$STREAM" ] && why="(see the output above)"
    printf '%s\n' "${why:-(no log)}" | cut -c1-300 | sed 's/^/    /'
  done
}

chosen=()
for leg in $ALL_LEGS; do leg_on "$leg" && chosen+=("$leg"); done
STREAM=""
[ ${#chosen[@]} -eq 1 ] && [ -z "${CI:-}" ] && STREAM=1
if leg_on newest || leg_on rabbit4 || leg_on rabbit43 || leg_on cluster; then
  if ! need_postgres; then
    say "PostgreSQL not available: skipped the newest, rabbit4, rabbit43 and cluster legs (install postgresql)"
    chosen=()
    leg_on oldest && chosen+=(oldest)
    leg_on release && chosen+=(release)
  fi
fi
# What two legs would otherwise fetch at once into one directory (npm ci deletes node_modules
# first): the AMQP client and the AsyncAPI schema that tests/foreign and tests/asyncapi use.
for d in tests/foreign tests/asyncapi; do
  [ -d "$ROOT/$d/node_modules" ] && continue
  say "npm ci in $d"
  (cd "$ROOT/$d" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci in $d failed"
done
on() { [[ " ${chosen[*]} " == *" $1 "* ]]; }
# pytest's temporary files in a directory per part (in a shared one, pytest prunes the older
# sessions' directories), outside the repository (a test's own pytest child there would read
# our pyproject.toml), kept when a part failed. An argument, not PYTEST_ADDOPTS, which the
# tests' own pytest children inherit.
TEST_TMP="$(mktemp -d "${TMPDIR:-/tmp}/rmq-retry-tests.XXXXXX")"
tmp() { echo "--basetemp=$TEST_TMP/$1"; }

# The parts and what each waits for ("ALL": every other part). A part whose wait includes a
# failed part still runs: one CI run shows everything.
declare -A AFTER=() CMD=()
ORDER=()
add_part() {  # add_part NAME "AFTER..." FUNCTION ARGS...
  ORDER+=("$1")
  AFTER[$1]="$2"
  CMD[$1]="$(printf '%q ' "${@:3}")"
}
add_part checks "" checks
if on rabbit4; then
  add_part rabbit4-up "" leg_rabbit4_up
  add_part rabbit4 rabbit4-up leg_rabbit4 "$(tmp rabbit4)" "$@"
  add_part rabbit4-2 rabbit4-up leg_rabbit4_2 "$(tmp rabbit4-2)" "$@"
  add_part rabbit4-quorum rabbit4-up leg_rabbit4_quorum "$(tmp rabbit4-quorum)" "$@"
  add_part rabbit4-node "rabbit4 rabbit4-2 rabbit4-quorum" leg_rabbit4_node \
    "$(tmp rabbit4-node)" "$@"
fi
if on rabbit43; then
  add_part rabbit43-up "" leg_rabbit43_up
  add_part rabbit43 rabbit43-up leg_rabbit43 "$(tmp rabbit43)" "$@"
  add_part rabbit43-quorum rabbit43-up leg_rabbit43_quorum "$(tmp rabbit43-quorum)" "$@"
  add_part rabbit43-node "rabbit43 rabbit43-quorum" leg_rabbit43_node "$(tmp rabbit43-node)" "$@"
fi
on cluster && add_part cluster "" leg_cluster "$(tmp cluster)" "$@"
on release && add_part release "" leg_release "$@"
if on oldest; then
  add_part oldest tox-env leg_oldest "$(tmp oldest)" "$@"
  add_part oldest-2 tox-env leg_oldest_2 "$(tmp oldest-2)" "$@"
fi
if on newest; then
  add_part newest tox-env leg_newest "$(tmp newest)" "$@"
  add_part newest-2 tox-env leg_newest_2 "$(tmp newest-2)" "$@"
  add_part newest-faults tox-env leg_newest_faults "$(tmp newest-faults)" "$@"
  add_part newest-faults-2 tox-env leg_newest_faults_2 "$(tmp newest-faults-2)" "$@"
  # After rabbit4-node too: its broker restart scenario tolerates what classic queues lose in
  # a dead-letter hop as the broker stops, which grows with the load at that moment (beside
  # rabbit4-node's own restarts and requeues it went past what the test allows).
  add_part newest-broker \
    "oldest oldest-2 newest newest-2 newest-faults newest-faults-2 rabbit4-node release" \
    leg_newest_broker "$(tmp newest-broker)" "$@"
  add_part newest-db ALL leg_newest_db "$(tmp newest-db)" "$@"
fi
# tox-env is not a part: the tox envs are built in the foreground, below, while the broker
# parts start their brokers.
STATUS[tox-env]=""
can_start() {
  local dep other
  for dep in ${AFTER[$1]}; do
    if [ "$dep" = ALL ]; then
      for other in "${ORDER[@]}"; do
        [ "$other" = "$1" ] || [ -n "${STATUS[$other]:-}" ] || return 1
      done
    elif [ "$dep" = tox-env ]; then
      [ -n "${STATUS[tox-env]}" ] || return 1
      ready "$1" || return 1
    else
      [[ " ${ORDER[*]} " != *" $dep "* ]] || [ -n "${STATUS[$dep]:-}" ] || return 1
    fi
  done
}
start_ready() {
  local name
  for name in "${ORDER[@]}"; do
    [ -z "${PID[$name]:-}" ] && [ -z "${STATUS[$name]:-}" ] && can_start "$name" \
      && start_part "$name" eval "${CMD[$name]}"
  done
  true
}
ready() { [[ " ${built[*]} " == *" ${1%%-*} "* ]]; }
built=()
say "legs: ${chosen[*]}; parts: ${ORDER[*]}"
start_ready
# tox builds each env once (the two side by side), before the parts that share an env run; pytest
# --collect-only also runs the env's commands_pre (the pika and Django versions it installs),
# so that the parts' own runs of it have nothing left to install. If one cannot be built,
# its leg is reported failed and the other legs go on.
build_env() {  # build_env LEG VERSION: its tox env, output to $LOGS/tox-LEG.log
  local dir
  dir="$(python_dir "$2" 2>"$LOGS/tox-$1.log")" && PATH="$dir:$PATH" "$VENV/bin/tox" run \
    --workdir "$(tox_dir "$1")" -e "$1" -- --collect-only -qq -p no:cacheprovider \
    >>"$LOGS/tox-$1.log" 2>&1
}
declare -A BUILD=()
for leg in oldest newest; do
  on "$leg" || continue
  say "tox env $leg"
  case "$leg" in oldest) v=3.10 ;; newest) v=3.13 ;; esac
  build_env "$leg" "$v" &
  BUILD[$leg]=$!
done
for leg in oldest newest; do
  [ -n "${BUILD[$leg]:-}" ] || continue
  if wait "${BUILD[$leg]}"; then
    built+=("$leg")
  else
    say "tox could not build env $leg: leg $leg not run (log: $LOGS/tox-$leg.log)"
    PARTS+=("tox-$leg")
    echo "1 0" >"$LOGS/tox-$leg.status"
    STATUS[tox-$leg]="1 0"
    for name in "${ORDER[@]}"; do [ "${name%%-*}" = "$leg" ] && STATUS[$name]="1 0"; done
  fi
done
STATUS[tox-env]=done
start_ready
while :; do
  pending=()
  for name in "${PARTS[@]}"; do
    [ -n "${PID[$name]:-}" ] && [ -z "${STATUS[$name]:-}" ] && pending+=("${PID[$name]}")
  done
  [ ${#pending[@]} -gt 0 ] || break
  pid=""
  wait -n -p pid "${pending[@]}" || true
  [ -n "$pid" ] || break
  for name in "${PARTS[@]}"; do [ "${PID[$name]:-}" = "$pid" ] && part_done "$name"; done
  start_ready
done
summary
FAILED=()
for name in "${PARTS[@]}"; do
  [ "${STATUS[$name]%% *}" = 0 ] || FAILED+=("$name")
done
[ ${#FAILED[@]} -eq 0 ] || die "failed: ${FAILED[*]} (pytest's temporary files: $TEST_TMP)"
rm -rf "$TEST_TMP"
