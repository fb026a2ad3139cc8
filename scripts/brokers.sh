#!/usr/bin/env bash
# The extra brokers of the CI legs, beside the system RabbitMQ (rabbit@localhost, AMQP 5672):
#
#   scripts/brokers.sh rabbit4 up|down|status|env   RabbitMQ 4.0 (Debian trixie) in a debootstrap
#                                                   root: node rabbit4@localhost, AMQP 5682
#   scripts/brokers.sh rabbit4 ctl ARGS...          rabbitmqctl against that node
#
# Needs root (or sudo). The trixie root is a cache kept outside the repository
# (RMQ4_ROOT, default /var/cache/django-rmq-retry/trixie) and built when absent (~2-3 min).
source "$(dirname "$0")/_common.sh"

R4_ROOT="${RMQ4_ROOT:-/var/cache/django-rmq-retry/trixie}"
R4_NODE=rabbit4@localhost
R4_PORT=5682
R4_DIST=25682
R4_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

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
  if r4_answers; then say "RabbitMQ 4 already up: $R4_NODE, amqp://guest:guest@127.0.0.1:$R4_PORT/%2F"; return 0; fi
  say "starting RabbitMQ $(r4_version) as $R4_NODE (AMQP $R4_PORT, distribution $R4_DIST)"
  r4 RABBITMQ_NODENAME="$R4_NODE" RABBITMQ_NODE_PORT="$R4_PORT" RABBITMQ_DIST_PORT="$R4_DIST" \
    rabbitmq-server -detached
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

# What a test run needs to talk to the 4.0 node: the URL and the rabbitmqctl command prefix.
r4_env() {
  echo "export RMQ_URL='amqp://guest:guest@127.0.0.1:$R4_PORT/%2F'"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo "
  echo "export RMQ_CTL='${sudo}chroot $R4_ROOT env HOME=/var/lib/rabbitmq rabbitmqctl -n $R4_NODE'"
}

case "${1:-} ${2:-}" in
  "rabbit4 up") r4_up ;;
  "rabbit4 down") r4_down ;;
  "rabbit4 status") r4_status ;;
  "rabbit4 env") r4_env ;;
  "rabbit4 ctl") shift 2; need_root "rabbit4 ctl"; r4_ctl "$@" ;;
  *) usage ;;
esac
