#!/usr/bin/env bash
# The extra brokers of the CI legs, beside the system RabbitMQ (rabbit@localhost, AMQP 5672):
#
#   scripts/brokers.sh rabbit4 up|down|status|env   RabbitMQ 4.0 (Debian trixie) in a debootstrap
#                                                   root: node rabbit4@localhost, AMQP 5682
#   scripts/brokers.sh rabbit43 up|down|status|env  RabbitMQ 4.3 (Debian sid) the same way:
#                                                   node rabbit43@localhost, AMQP 5683
#   scripts/brokers.sh rabbit4|rabbit43 ctl ARGS... rabbitmqctl against that node
#   scripts/brokers.sh cluster up|down|clean|status  three RabbitMQ 3.10 nodes (the system's
#                                                   rabbitmq-server) in a cluster of their own:
#                                                   rabbitc1..3@localhost, AMQP 5701..5703
#   scripts/brokers.sh cluster stop-node|start-node N   stop or start node N (fault tests)
#   scripts/brokers.sh cluster rebalance             spread the quorum queues' leaders over the nodes
#   scripts/brokers.sh cluster ctl N ARGS...         rabbitmqctl against node N
#
# Needs root (or sudo). The Debian roots are caches kept outside the repository (RMQ4_ROOT,
# default /var/cache/django-rmq-retry/trixie; RMQ43_ROOT, default .../sid), each built when
# absent (~1-3 min, debootstrap installed if missing; DEBIAN_MIRROR picks the mirror);
# the cluster's data lives in RMQ_CLUSTER_DIR (default /var/lib/django-rmq-retry/cluster).
# A cluster node gets RMQ_CLUSTER_START_WAIT seconds (default 90) plus 30 to answer, twice.
source "$(dirname "$0")/_common.sh"

D_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# Erlang's schedulers spin while idle; five nodes on two cores would spin against each other.
ERL_QUIET_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

# advanced.config for a node whose at-least-once dead-letter worker waits $1 ms (not 180 s)
# for a confirm lost in a node stop or restart before it publishes again.
dlx_confirm_config() { echo "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, $1}]}]."; }

need_root() {
  [ "$(id -u)" = 0 ] || command -v sudo >/dev/null \
    || die "$1 needs root (or sudo): it mounts /proc, /sys and /dev into a chroot"
}

# --- RabbitMQ 4.x in a Debian root (rabbit4: trixie, rabbit43: sid) ----------------------
# One set of functions for both: d_select sets which root, suite, node and ports they use.

d_select() {
  case "$1" in
    rabbit4)
      D_NAME=rabbit4 D_LABEL="RabbitMQ 4.0" D_SUITE=trixie
      D_ROOT="${RMQ4_ROOT:-/var/cache/django-rmq-retry/trixie}"
      D_NODE=rabbit4@localhost D_PORT=5682 D_DIST=25682
      D_APT=() ;;
    rabbit43)
      D_NAME=rabbit43 D_LABEL="RabbitMQ 4.3" D_SUITE=sid
      D_ROOT="${RMQ43_ROOT:-/var/cache/django-rmq-retry/sid}"
      D_NODE=rabbit43@localhost D_PORT=5683 D_DIST=25683
      # sid's Release file is often past its Valid-Until; apt refuses it without this.
      D_APT=(-o Acquire::Check-Valid-Until=false) ;;
  esac
}

d_run() { as_root chroot "$D_ROOT" env HOME=/var/lib/rabbitmq "$@"; }
d_ctl() { d_run rabbitmqctl -n "$D_NODE" "$@"; }
d_ready() { [ -x "$D_ROOT/usr/sbin/rabbitmq-server" ]; }

d_mount() {
  local root="$1"
  mountpoint -q "$root/proc" || as_root mount -t proc proc "$root/proc"
  mountpoint -q "$root/sys" || as_root mount -t sysfs sys "$root/sys"
  mountpoint -q "$root/dev" || as_root mount --bind /dev "$root/dev"
}

d_umount() {
  local root="$1" m
  for m in dev sys proc; do
    if mountpoint -q "$root/$m"; then
      as_root umount "$root/$m" 2>/dev/null || as_root umount -l "$root/$m"
    fi
  done
}

d_build() {
  # Built in a scratch directory and renamed at the end, so a half-built root is never taken
  # for the cache.
  local tmp="$D_ROOT.building"
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap on this machine (apt-get install debootstrap)"
    as_root apt-get update -qq \
      && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
      || die "debootstrap is missing and could not be installed: apt-get install debootstrap"
  fi
  [ -d "$tmp" ] && { d_umount "$tmp"; as_root rm -rf "$tmp"; }
  as_root mkdir -p "$(dirname "$D_ROOT")"
  say "building a Debian $D_SUITE root in $D_ROOT (debootstrap, about 2 minutes; cached afterwards)"
  as_root debootstrap --variant=minbase "$D_SUITE" "$tmp" "$D_MIRROR" >"$tmp.log" 2>&1 \
    || die "debootstrap $D_SUITE failed (it needs $D_MIRROR); see $tmp.log"
  echo "deb $D_MIRROR $D_SUITE main" | as_root tee "$tmp/etc/apt/sources.list" >/dev/null
  # Package scripts must not start services inside the root; we start the node ourselves.
  printf '#!/bin/sh\nexit 101\n' | as_root tee "$tmp/usr/sbin/policy-rc.d" >/dev/null
  as_root chmod +x "$tmp/usr/sbin/policy-rc.d"
  # epmd resolves localhost through the root's own /etc/hosts (sid's boot fails with
  # "epmd error ... nxdomain" without it).
  as_root cp /etc/hosts "$tmp/etc/hosts"
  d_mount "$tmp"
  say "installing rabbitmq-server inside the $D_SUITE root"
  as_root chroot "$tmp" env DEBIAN_FRONTEND=noninteractive bash -c \
    "apt-get ${D_APT[*]} update -qq && apt-get ${D_APT[*]} install -y -qq --no-install-recommends rabbitmq-server" \
    >>"$tmp.log" 2>&1 || { d_umount "$tmp"; die "apt-get install rabbitmq-server in the $D_SUITE root failed; see $tmp.log"; }
  d_umount "$tmp"
  as_root mv "$tmp" "$D_ROOT"
  as_root rm -f "$tmp.log"
}

d_answers() { d_ctl -q ping >/dev/null 2>&1 && port_open 127.0.0.1 "$D_PORT"; }

d_up() {
  need_root "$D_NAME up"
  d_ready || d_build
  d_mount "$D_ROOT"
  # As on the cluster's nodes (c_write_config): the at-least-once dead-letter worker of a
  # quorum delay level otherwise waits 180 s for a confirm lost in a restart before it
  # publishes again (fault scenario 2 with quorum queues: 20 pairs missing 60 s after the
  # restart, all there about 3 minutes after it).
  local dlx_ms="${RMQ_DLX_CONFIRM_MS:-10000}"
  if d_answers; then
    # A node started elsewhere, without our config: set it live (read by each queue's
    # dead-letter worker when it starts; every test declares queues of its own).
    d_ctl eval "application:set_env(rabbit, dead_letter_worker_publisher_confirm_timeout, $dlx_ms)." >/dev/null
    say "$D_LABEL already up: $D_NODE, amqp://guest:guest@127.0.0.1:$D_PORT/%2F"
    return 0
  fi
  say "starting RabbitMQ $(d_version) as $D_NODE (AMQP $D_PORT, distribution $D_DIST)"
  dlx_confirm_config "$dlx_ms" | as_root tee "$D_ROOT/etc/rabbitmq/advanced.config" >/dev/null
  d_run RABBITMQ_NODENAME="$D_NODE" RABBITMQ_NODE_PORT="$D_PORT" RABBITMQ_DIST_PORT="$D_DIST" \
    RABBITMQ_ADVANCED_CONFIG_FILE=/etc/rabbitmq/advanced.config \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="$ERL_QUIET_ARGS" rabbitmq-server -detached
  local i
  for i in $(seq 1 120); do d_answers && break; sleep 1; done
  d_ctl await_startup --timeout 60 >/dev/null 2>&1 || true
  d_answers || die "$D_LABEL did not answer within 120 s; log: $D_ROOT/var/log/rabbitmq/"
  say "$D_LABEL up after ${i}s: amqp://guest:guest@127.0.0.1:$D_PORT/%2F"
}

d_down() {
  need_root "$D_NAME down"
  if [ ! -d "$D_ROOT" ]; then say "no $D_SUITE root at $D_ROOT: nothing to stop"; return 0; fi
  if d_ready && mountpoint -q "$D_ROOT/proc" && d_ctl -q ping >/dev/null 2>&1; then
    say "stopping $D_NODE"
    d_ctl stop >/dev/null 2>&1 || true
  fi
  # A node stopped from outside may leave its epmd running inside the root; it serves the
  # system node too, so it stays (it does not hold the mounts).
  d_umount "$D_ROOT"
  say "$D_LABEL down; the $D_SUITE root stays cached in $D_ROOT"
}

d_version() {
  d_run dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo "?"
}

d_status() {
  if ! d_ready; then
    echo "$D_NAME: no $D_SUITE root at $D_ROOT ('scripts/brokers.sh $D_NAME up' builds it; needs root and debootstrap)"
    return 1
  fi
  echo "$D_NAME: root $D_ROOT, rabbitmq-server $(d_version)"
  if mountpoint -q "$D_ROOT/proc" && d_answers; then
    echo "$D_NAME: $D_NODE answers on amqp://guest:guest@127.0.0.1:$D_PORT/%2F"
  else
    echo "$D_NAME: not running"
    return 1
  fi
}

# What a test run needs to talk to the node: the URL, the rabbitmqctl command prefix and
# the node's log (tests that read what the broker logged).
d_env() {
  echo "export RMQ_URL='amqp://guest:guest@127.0.0.1:$D_PORT/%2F'"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo "
  echo "export RMQ_CTL='${sudo}chroot $D_ROOT env HOME=/var/lib/rabbitmq rabbitmqctl -n $D_NODE'"
  echo "export RMQ_LOG='$D_ROOT/var/log/rabbitmq/$D_NODE.log'"
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
  "rabbit4 up"|"rabbit43 up") d_select "$1"; d_up ;;
  "rabbit4 down"|"rabbit43 down") d_select "$1"; d_down ;;
  "rabbit4 status"|"rabbit43 status") d_select "$1"; d_status ;;
  "rabbit4 env"|"rabbit43 env") d_select "$1"; d_env ;;
  "rabbit4 ctl"|"rabbit43 ctl") d_select "$1"; shift 2; need_root "$D_NAME ctl"; d_ctl "$@" ;;
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
