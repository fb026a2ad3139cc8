# Shared by scripts/demo.sh and scripts/test.sh: a venv with the project and its tools,
# and the local services (RabbitMQ, PostgreSQL) started if they are installed but stopped.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-$ROOT/.venv}"
PYTHON_BIN="${PYTHON:-python3}"
RMQ_HOST=127.0.0.1
RMQ_PORT=5672

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
die() { printf '\033[31mERROR: %s\033[0m\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi
}

ensure_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    "$PYTHON_BIN" -m venv "$VENV" || die "cannot create a venv with $PYTHON_BIN (Debian: apt-get install python3-venv)"
  fi
  "$VENV/bin/python" -m pip install -q --upgrade "pip>=25.1"
  say "installing django-rmq-retry (editable) and the $1 tools"
  "$VENV/bin/python" -m pip install -q -e . --group "$1"
}

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

ensure_rabbitmq() {
  if port_open "$RMQ_HOST" "$RMQ_PORT"; then return 0; fi
  if ! command -v rabbitmq-server >/dev/null; then
    die "RabbitMQ is not running on $RMQ_HOST:$RMQ_PORT and is not installed.
       Install it (Debian/Ubuntu: apt-get install rabbitmq-server) or point RMQ_URL at a broker."
  fi
  say "starting RabbitMQ (rabbitmq-server -detached)"
  as_root rabbitmq-server -detached || die "could not start rabbitmq-server (need root?)"
  for _ in $(seq 1 60); do port_open "$RMQ_HOST" "$RMQ_PORT" && break; sleep 1; done
  as_root rabbitmqctl await_startup >/dev/null 2>&1 || true
  port_open "$RMQ_HOST" "$RMQ_PORT" || die "RabbitMQ did not come up on $RMQ_HOST:$RMQ_PORT"
}

ensure_postgres() {
  if port_open 127.0.0.1 5432; then return 0; fi
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    say "starting PostgreSQL"
    as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    for _ in $(seq 1 30); do port_open 127.0.0.1 5432 && return 0; sleep 1; done
  fi
  return 1
}

ensure_debs() {
  # Debian packages the tests use: chromium (browser tests), amqp-tools and Node.js with npm
  # (two AMQP clients that are not ours; the test installs amqplib from tests/foreign itself).
  local missing=()
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  command -v amqp-publish >/dev/null || missing+=(amqp-tools)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || die "could not install ${missing[*]}; install them with apt-get (root needed)"
}

# Python X.Y's bin directory: pyenv's versions, then PATH, else installed with pyenv.
# pyenv's shims answer `python3.10` only when that version is selected: callers get the real
# interpreters' directories.
PYENV_DIR="$(command -v pyenv >/dev/null && pyenv root || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
python_dir() {
  local d
  for d in "$PYENV_DIR"/versions/"$1".*/bin; do
    [ -x "$d/python$1" ] && "$d/python$1" -c pass 2>/dev/null && { echo "$d"; return 0; }
  done
  d="$(command -v "python$1")" && "$d" -c pass 2>/dev/null && { dirname "$d"; return 0; }
  if command -v pyenv >/dev/null; then
    say "installing Python $1 with pyenv" >&2
    pyenv install -s "$1" >&2 && python_dir_installed "$1" && return 0
  fi
  die "python$1 is missing: install it (pyenv install $1, or your distribution's python$1)"
}
python_dir_installed() {
  local d
  for d in "$PYENV_DIR"/versions/"$1".*/bin; do [ -x "$d/python$1" ] && { echo "$d"; return 0; }; done
  return 1
}
