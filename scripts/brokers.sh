#!/usr/bin/env bash
# The extra brokers of the CI legs, beside the system RabbitMQ (rabbit@localhost, AMQP 5672):
#
#   scripts/brokers.sh rabbit4 up|down|status|env   RabbitMQ 4.0 (Debian trixie) in a debootstrap
#                                                   root: node rabbit4@localhost, AMQP 5682
#   scripts/brokers.sh rabbit4 ctl ARGS...          rabbitmqctl against that node
#   scripts/brokers.sh cluster up|down|clean|status  three RabbitMQ 3.10 nodes (the system's
#                                                   rabbitmq-server) in a cluster of their own:
#                                                   rabbitc1..3@localhost, AMQP 5701..5703
#   scripts/brokers.sh cluster stop-node|start-node N   stop or start node N (fault tests)
#   scripts/brokers.sh cluster rebalance             spread the quorum queues' leaders over the nodes
#   scripts/brokers.sh cluster ctl N ARGS...         rabbitmqctl against node N
#
# Needs root (or sudo). The trixie root is a cache kept outside the repository
# (RMQ4_ROOT, default /var/cache/django-rmq-retry/trixie) and built when absent (~1-3 min);
# the cluster's data lives in RMQ_CLUSTER_DIR (default /var/lib/django-rmq-retry/cluster).
# A cluster node gets RMQ_CLUSTER_START_WAIT seconds (default 90) plus 30 to answer, twice.
source "$(dirname "$0")/_common.sh"

R4_ROOT="${RMQ4_ROOT:-/var/cache/django-rmq-retry/trixie}"
R4_NODE=rabbit4@localhost
R4_PORT=5682
R4_DIST=25682
R4_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# Erlang's schedulers spin while idle; five nodes on two cores would spin against each other.
ERL_QUIET_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

# advanced.config for a node whose at-least-once dead-letter worker waits $1 ms (not 180 s)
# for a confirm lost in a node stop or restart before it publishes again.
dlx_confirm_config() { echo "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, $1}]}]."; }

need_root() {
  [ "$(id -u)" = 0 ] || command -v sudo >/dev/null \
    || die "$1 needs root (or sudo): it mounts /proc, /sys and /dev into a chroot"
}

# --- RabbitMQ 4.0 in a Debian trixie root -----------------------------------------------

r4() { as_root chroot "$R4_ROOT" env HOME=/var/lib/rabbitmq "$@"; }
r4_ctl() { r4 rabbitmqctl -n "$R4_NODE" "$@"; }
r4_ready() { [ -x "$R4_ROOT/usr/sbin/rabbitmq-server" ]; }

r4_mount() {
  local root="$1"
  mountpoint -q "$root/proc" || as_root mount -t proc proc "$root/proc"
  mountpoint -q "$root/sys" || as_root mount -t sysfs sys "$root/sys"
  mountpoint -q "$root/dev" || as_root mount --bind /dev "$root/dev"
}

r4_umount() {
  local root="$1" m
  for m in dev sys proc; do
    if mountpoint -q "$root/$m"; then
      as_root umount "$root/$m" 2>/dev/null || as_root umount -l "$root/$m"
    fi
  done
}

r4_build() {
  # Built in a scratch directory and renamed at the end, so a half-built root is never taken
  # for the cache.
  local tmp="$R4_ROOT.building"
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap on this machine (apt-get install debootstrap)"
    as_root apt-get update -qq \
      && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
      || die "debootstrap is missing and could not be installed: apt-get install debootstrap"
  fi
  [ -d "$tmp" ] && { r4_umount "$tmp"; as_root rm -rf "$tmp"; }
  as_root mkdir -p "$(dirname "$R4_ROOT")"
  say "building a Debian trixie root in $R4_ROOT (debootstrap, about 2 minutes; cached afterwards)"
  as_root debootstrap --variant=minbase trixie "$tmp" "$R4_MIRROR" >"$tmp.log" 2>&1 \
    || die "debootstrap trixie failed (it needs $R4_MIRROR); see $tmp.log"
  # Package scripts must not start services inside the root; we start the node ourselves.
  printf '#!/bin/sh\nexit 101\n' | as_root tee "$tmp/usr/sbin/policy-rc.d" >/dev/null
  as_root chmod +x "$tmp/usr/sbin/policy-rc.d"
  as_root cp /etc/hosts "$tmp/etc/hosts"
  r4_mount "$tmp"
  say "installing rabbitmq-server inside the trixie root"
  as_root chroot "$tmp" env DEBIAN_FRONTEND=noninteractive bash -c \
    'apt-get update -qq && apt-get install -y -qq --no-install-recommends rabbitmq-server' \
    >>"$tmp.log" 2>&1 || { r4_umount "$tmp"; die "apt-get install rabbitmq-server in the trixie root failed; see $tmp.log"; }
  r4_umount "$tmp"
  as_root mv "$tmp" "$R4_ROOT"
  as_root rm -f "$tmp.log"
}

r4_answers() { r4_ctl -q ping >/dev/null 2>&1 && port_open 127.0.0.1 "$R4_PORT"; }

r4_up() {
  need_root "rabbit4 up"
  r4_ready || r4_build
  r4_mount "$R4_ROOT"
  # As on the cluster's nodes (c_write_config): the at-least-once dead-letter worker of a
  # quorum delay level otherwise waits 180 s for a confirm lost in a restart before it
  # publishes again (fault scenario 2 with quorum queues: 20 pairs missing 60 s after the
  # restart, all there about 3 minutes after it).
  local dlx_ms="${RMQ_DLX_CONFIRM_MS:-10000}"
  if r4_answers; then
    # A node started elsewhere, without our config: set it live (read by each queue's
    # dead-letter worker when it starts; every test declares queues of its own).
    r4_ctl eval "application:set_env(rabbit, dead_letter_worker_publisher_confirm_timeout, $dlx_ms)." >/dev/null
    say "RabbitMQ 4 already up: $R4_NODE, amqp://guest:guest@127.0.0.1:$R4_PORT/%2F"
    return 0
  fi
  say "starting RabbitMQ $(r4_version) as $R4_NODE (AMQP $R4_PORT, distribution $R4_DIST)"
  dlx_confirm_config "$dlx_ms" | as_root tee "$R4_ROOT/etc/rabbitmq/advanced.config" >/dev/null
  r4 RABBITMQ_NODENAME="$R4_NODE" RABBITMQ_NODE_PORT="$R4_PORT" RABBITMQ_DIST_PORT="$R4_DIST" \
    RABBITMQ_ADVANCED_CONFIG_FILE=/etc/rabbitmq/advanced.config \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="$ERL_QUIET_ARGS" rabbitmq-server -detached
  local i
  for i in $(seq 1 120); do r4_answers && break; sleep 1; done
  r4_ctl await_startup --timeout 60 >/dev/null 2>&1 || true
  r4_answers || die "RabbitMQ 4 did not answer within 120 s; log: $R4_ROOT/var/log/rabbitmq/"
  say "RabbitMQ 4 up after ${i}s: amqp://guest:guest@127.0.0.1:$R4_PORT/%2F"
}

r4_down() {
  need_root "rabbit4 down"
  if [ ! -d "$R4_ROOT" ]; then say "no trixie root at $R4_ROOT: nothing to stop"; return 0; fi
  if r4_ready && mountpoint -q "$R4_ROOT/proc" && r4_ctl -q ping >/dev/null 2>&1; then
    say "stopping $R4_NODE"
    r4_ctl stop >/dev/null 2>&1 || true
  fi
  # A node stopped from outside may leave its epmd running inside the root; it serves the
  # system node too, so it stays (it does not hold the mounts).
  r4_umount "$R4_ROOT"
  say "RabbitMQ 4 down; the trixie root stays cached in $R4_ROOT"
}

r4_version() {
  r4 dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo "?"
}

r4_status() {
  if ! r4_ready; then
    echo "rabbit4: no trixie root at $R4_ROOT ('scripts/brokers.sh rabbit4 up' builds it; needs root and debootstrap)"
    return 1
  fi
  echo "rabbit4: root $R4_ROOT, rabbitmq-server $(r4_version)"
  if mountpoint -q "$R4_ROOT/proc" && r4_answers; then
    echo "rabbit4: $R4_NODE answers on amqp://guest:guest@127.0.0.1:$R4_PORT/%2F"
  else
    echo "rabbit4: not running"
    return 1
  fi
}

# What a test run needs to talk to the 4.0 node: the URL, the rabbitmqctl command prefix and
# the node's log (tests that read what the broker logged).
r4_env() {
  echo "export RMQ_URL='amqp://guest:guest@127.0.0.1:$R4_PORT/%2F'"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo "
  echo "export RMQ_CTL='${sudo}chroot $R4_ROOT env HOME=/var/lib/rabbitmq rabbitmqctl -n $R4_NODE'"
  echo "export RMQ_LOG='$R4_ROOT/var/log/rabbitmq/$R4_NODE.log'"
}


# --- Three RabbitMQ 3.10 nodes in a cluster of their own --------------------------------

C_DIR="${RMQ_CLUSTER_DIR:-/var/lib/django-rmq-retry/cluster}"
C_BIN=/usr/lib/rabbitmq/bin
c_node() { echo "rabbitc$1@localhost"; }
c_port() { echo $((5700 + $1)); }

c_need() {
  need_root "cluster"
  [ -x "$C_BIN/rabbitmq-server" ] || die "RabbitMQ is not installed on this machine; the cluster runs
       three more nodes of it. Debian/Ubuntu: apt-get install rabbitmq-server"
  id rabbitmq >/dev/null 2>&1 || die "no 'rabbitmq' user (it comes with apt-get install rabbitmq-server)"
}

# As the broker's user with its cookie, so the nodes (and rabbitmqctl) trust each other.
c_as() { as_root runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq "$@"; }
c_ctl() { local n="$1"; shift; c_as "$C_BIN/rabbitmqctl" -n "$(c_node "$n")" "$@"; }
c_answers() { c_ctl "$1" -q ping >/dev/null 2>&1 && port_open 127.0.0.1 "$(c_port "$1")"; }

c_write_config() {
  local n="$1" d="$C_DIR/c$1"
  as_root mkdir -p "$d/mnesia" "$d/log"
  # Our own env file: the system's (/etc/rabbitmq/rabbitmq-env.conf) names rabbit@localhost.
  printf 'ERL_EPMD_ADDRESS=127.0.0.1\n' | as_root tee "$d/rabbitmq-env.conf" >/dev/null
  printf 'listeners.tcp.local = 127.0.0.1:%s\n' "$(c_port "$n")" | as_root tee "$d/rabbitmq.conf" >/dev/null
  # 3.10's at-least-once dead-letter worker waits 180 s for a confirm that a stopped node
  # will never send before it publishes again; 10 s keeps a node stop from stalling parking.
  dlx_confirm_config "${RMQ_CLUSTER_DLX_CONFIRM_MS:-10000}" | as_root tee "$d/advanced.config" >/dev/null
  echo '[].' | as_root tee "$d/enabled_plugins" >/dev/null
  as_root chown -R rabbitmq:rabbitmq "$C_DIR"
}

c_launch() {
  local n="$1" d="$C_DIR/c$1"
  c_as env RABBITMQ_NODENAME="$(c_node "$n")" RABBITMQ_NODE_PORT="$(c_port "$n")" \
    RABBITMQ_DIST_PORT=$((25700 + n)) RABBITMQ_CONF_ENV_FILE="$d/rabbitmq-env.conf" \
    RABBITMQ_CONFIG_FILE="$d/rabbitmq.conf" RABBITMQ_ADVANCED_CONFIG_FILE="$d/advanced.config" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$d/enabled_plugins" RABBITMQ_MNESIA_BASE="$d/mnesia" \
    RABBITMQ_LOG_BASE="$d/log" RABBITMQ_PID_FILE="$d/pid" \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="$ERL_QUIET_ARGS" \
    ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}" \
    "$C_BIN/rabbitmq-server" -detached
}

# The Erlang VMs of node N: 3.10 names its node only once booted, so look in their environment.
c_vms() {
  local p
  for p in $(pgrep -u rabbitmq beam.smp 2>/dev/null); do
    as_root cat "/proc/$p/environ" 2>/dev/null | tr '\0' '\n' \
      | grep -qx "RABBITMQ_NODENAME=$(c_node "$1")" && echo "$p"
  done
  true
}

# What a node that did not answer left behind, printed where CI shows it.
c_diagnose() {
  local n="$1" d="$C_DIR/c$1" f
  say "$(c_node "$n") did not answer; what it left:"
  echo "  VM pid(s): $(c_vms "$n" | tr '\n' ' ')"
  echo "  epmd: $(epmd -names 2>&1 | tr '\n' ';')"
  echo "  listeners on $(c_port "$n")/$((25700 + n)): $(ss -ltnp 2>/dev/null | grep -E ":($(c_port "$n")|$((25700 + n)))\b" | tr -s ' ' | tr '\n' ';')"
  for f in "$d/start.out" "$d"/log/*.log; do
    [ -f "$f" ] || continue
    echo "  --- last lines of $f"
    as_root tail -n 12 "$f" | sed 's/^/  /'
  done
}

c_start_node() {
  local n="$1" d="$C_DIR/c$1" i try p patience="${RMQ_CLUSTER_START_WAIT:-90}"
  c_answers "$n" && return 0
  c_write_config "$n"
  # Twice at most: CI saw a node's boot stop right after its logging came up, silently, where
  # the same start passed before and after. A second start after killing its VM is cheap; the
  # diagnosis goes to the output so the next failure says why.
  for try in 1 2; do
    c_launch "$n" >"$d/start.out" 2>&1 || true
    for i in $(seq 1 "$patience"); do c_answers "$n" && break; sleep 1; done
    c_ctl "$n" await_startup --timeout 30 >/dev/null 2>&1 || true
    c_answers "$n" && return 0
    c_diagnose "$n"
    [ "$try" = 2 ] && break
    for p in $(c_vms "$n"); do as_root kill -9 "$p" 2>/dev/null || true; done
    sleep 2
    say "starting $(c_node "$n") once more"
  done
  die "node $(c_node "$n") did not answer within 2 × $((patience + 30)) s; log: $d/log/"
}

c_stop_node() {
  if c_ctl "$1" -q ping >/dev/null 2>&1; then
    # With the pid file rabbitmqctl waits until the Erlang VM is gone, not only the app.
    c_ctl "$1" stop "$C_DIR/c$1/pid" >/dev/null 2>&1 || true
  fi
}

c_member() { c_ctl 1 -q cluster_status --formatter json 2>/dev/null | grep -q "\"$(c_node "$1")\""; }

c_up() {
  c_need
  local t0=$SECONDS n
  for n in 1 2 3; do say "starting $(c_node "$n") (AMQP $(c_port "$n"))"; c_start_node "$n"; done
  for n in 2 3; do
    c_member "$n" && continue
    say "joining $(c_node "$n") to $(c_node 1)"
    # rabbitmqctl prints feature-flag warnings of a fresh node while it joins: harmless.
    { c_ctl "$n" stop_app && c_ctl "$n" reset && c_ctl "$n" join_cluster "$(c_node 1)" \
        && c_ctl "$n" start_app; } >/dev/null 2>&1 || die "joining $(c_node "$n") failed"
  done
  for n in 2 3; do c_member "$n" || die "$(c_node "$n") did not join the cluster"; done
  say "cluster up in $((SECONDS - t0))s: amqp://guest:guest@127.0.0.1:5701,5702,5703/%2F"
}

c_down() {
  c_need
  local n
  # The last node down must be the first one up again (it holds the newest cluster view);
  # stopping 3, 2, 1 and starting 1, 2, 3 keeps that order.
  for n in 3 2 1; do say "stopping $(c_node "$n")"; c_stop_node "$n"; done
}

c_clean() {
  c_down
  say "removing the cluster's data in $C_DIR"
  as_root rm -rf "$C_DIR"
}

c_status() {
  local n rc=0
  for n in 1 2 3; do
    if c_answers "$n"; then echo "cluster: $(c_node "$n") up on amqp://guest:guest@127.0.0.1:$(c_port "$n")/%2F"
    else echo "cluster: $(c_node "$n") down"; rc=1; fi
  done
  [ "$rc" = 0 ] && c_ctl 1 -q cluster_status --formatter json 2>/dev/null | grep -o '"running_nodes":\[[^]]*\]'
  return "$rc"
}

c_node_arg() { case "${1:-}" in 1|2|3) ;; *) die "node number 1, 2 or 3 expected, got '${1:-}'" ;; esac; }

case "${1:-} ${2:-}" in
  "rabbit4 up") r4_up ;;
  "rabbit4 down") r4_down ;;
  "rabbit4 status") r4_status ;;
  "rabbit4 env") r4_env ;;
  "rabbit4 ctl") shift 2; need_root "rabbit4 ctl"; r4_ctl "$@" ;;
  "cluster up") c_up ;;
  "cluster down") c_down ;;
  "cluster clean") c_clean ;;
  "cluster status") c_need; c_status ;;
  "cluster stop-node") c_need; c_node_arg "${3:-}"; c_stop_node "$3" ;;
  "cluster start-node") c_need; c_node_arg "${3:-}"; c_start_node "$3" ;;
  "cluster rebalance") c_need; c_as "$C_BIN/rabbitmq-queues" -n "$(c_node 1)" -q rebalance quorum >/dev/null ;;
  "cluster ctl") c_need; c_node_arg "${3:-}"; n="$3"; shift 3; c_ctl "$n" "$@" ;;
  *) usage ;;
esac
